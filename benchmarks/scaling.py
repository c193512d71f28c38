"""The cold path as producers are added: ringfeed against torch's DataLoader, same work.

    python benchmarks/scaling.py --out DIR [--workers 2,4,8,14] [--clips 1024] [--rounds 2]
    .venv/bin/python benchmarks/scaling.py --quick --out DIR    # the CPU smoke: ~1 min

Each sample is decoded, resampled, turned into a log-mel and tokenized with the
feature cache off, by ringfeed's own per-sample work (producer/sources.py
``make_source(cfg).prepare(item)``, math libraries pinned to one thread) in both
pipelines, so only the coordination differs:

- ringfeed: a real run (`Run`, scripts/runner.py: the stager and N producers), one
  epoch of --clips read batch by batch through the batch client;
- dataloader: ``torch.utils.data.DataLoader`` with N workers (fork, prefetch_factor 2),
  each worker with a source of its own; an item is prepared and padded into the
  fixed shape, batches stacked by the default collate.

Data: --clips crops (1-9.5 s) of the 16 shipped LJSpeech clips (benchmarks/peers.py
make_corpus), batches of --batch rows of [800, 80] mels. A rate is samples from the
first batch to the last over that time (start-up, the pool's fork and imports, is
not timed); rounds alternate the order of the two. Reported per worker count: both
medians, their ratio, and the efficiency from the fewest workers to each count,
(rate_N / rate_first) / (N / first). Every figure goes to OUT/scaling.jsonl as it is
measured, the table to OUT/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from peers import make_corpus  # noqa: E402

from ringfeed.producer.prepare.prepare import prepare  # noqa: E402
from ringfeed.scripts.runner import Run  # noqa: E402
from ringfeed.shared.config import Config, config_from_dict  # noqa: E402

QUICK = {"clips": 48, "batch": 8, "workers": "1,2", "rounds": 1}


def bench_raw(args: argparse.Namespace, corpus: Path, work: Path, workers: int) -> dict:
    """The run's config mapping (as YAML would give it): the cold path, one epoch."""
    return {
        "data": {"path": str(corpus)},
        "features": {"cache": False, "cache_dir": str(work / "cache"), "on_too_long": "truncate"},
        "stager": {"batch_size": args.batch, "epochs": 1},
        "producers": {"workers": workers, "math_threads": 1}
        | ({"credits": args.credits} if args.credits else {}),
        "ring": {"lookahead": args.lookahead},
        "run_root": str(work / "runs"),
    }


def timed(sizes) -> float:
    """Samples per second from the first batch to the last; sizes yields batch sizes."""
    total = first = 0
    t_first = t_last = time.perf_counter()
    for n in sizes:
        if total == 0:
            first, t_first = n, time.perf_counter()
        total += n
        t_last = time.perf_counter()
    return (total - first) / max(t_last - t_first, 1e-9)


def run_ringfeed(args: argparse.Namespace, corpus: Path, work: Path, workers: int) -> float:
    config = work / f"ringfeed-{workers}.json"
    config.write_text(json.dumps(bench_raw(args, corpus, work, workers)))

    def sizes():
        with Run(config, f"scale-{uuid.uuid4().hex[:6]}", work) as run:
            run.start("stager")
            run.start("producers")
            client = run.client("scaling", timeout_s=120)
            while (batch := client.next(timeout_s=300)) is not None:
                n = batch.meta.n_valid
                client.free(batch)
                yield n
            client.close(finished=True)

    return timed(sizes())


class Prepared:
    """A map-style dataset of ringfeed's per-sample work, padded to the fixed shape."""

    def __init__(self, cfg: Config, n: int) -> None:
        self.cfg, self.n, self.source = cfg, n, None
        self.fields = cfg.sample_fields()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item: int) -> dict[str, np.ndarray]:
        if self.source is None:  # in the worker: each builds its own
            from ringfeed.producer.process.threads import pin_math_threads
            from ringfeed.producer.sources import make_source

            pin_math_threads(self.cfg.producers.math_threads)
            self.source = make_source(self.cfg)
        sample = self.source.prepare(item)
        out = {}
        for name, (shape, dtype) in self.fields.items():
            rows = sample.array(name)
            padded = np.zeros(shape, dtype)
            padded[: len(rows)] = rows
            out[name] = padded
        return out


def run_dataloader(args: argparse.Namespace, corpus: Path, work: Path, workers: int) -> float:
    import torch

    cfg = config_from_dict(bench_raw(args, corpus, work, workers))
    loader = torch.utils.data.DataLoader(
        Prepared(cfg, args.clips),
        batch_size=args.batch,
        shuffle=True,
        num_workers=workers,
        prefetch_factor=2,
        multiprocessing_context="fork",
    )
    return timed(len(batch["mel"]) for batch in loader)


def table(results: list[dict]) -> str:
    by = {}
    for r in results:
        by.setdefault((r["workers"], r["feed"]), []).append(r["samples_per_s"])
    counts = sorted({w for w, _ in by})
    med = {k: statistics.median(v) for k, v in by.items()}
    first = counts[0]
    lines = [
        f"| workers | ringfeed samples/s | DataLoader samples/s | ratio | ringfeed efficiency "
        f"from {first} | DataLoader efficiency from {first} |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for w in counts:
        rf, dl = med.get((w, "ringfeed")), med.get((w, "dataloader"))
        eff = [
            f"{(m / b) / (w / first):.2f}" if m and b else "-"
            for m, b in ((rf, med.get((first, "ringfeed"))), (dl, med.get((first, "dataloader"))))
        ]
        ratio = f"{rf / dl:.2f}x" if rf and dl else "-"
        rounds = "/".join(f"{v:,.0f}" for v in by.get((w, "ringfeed"), []))
        lines.append(
            f"| {w} | {rf or 0:,.0f} ({rounds}) | {dl or 0:,.0f} | {ratio} | {eff[0]} | {eff[1]} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where the figures go")
    p.add_argument("--quick", action="store_true", help="the CPU smoke's sizes (QUICK)")
    p.add_argument("--workers", default="2,4,8,14", help="worker counts, fewest first")
    p.add_argument("--clips", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--feeds", default="ringfeed,dataloader")
    p.add_argument("--lookahead", type=int, default=0, help="ring.lookahead (0: its default)")
    p.add_argument("--credits", type=int, default=0, help="producers.credits (0: its default)")
    args = p.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {"ringfeed": run_ringfeed, "dataloader": run_dataloader}
    feeds = [runs[f] for f in args.feeds.split(",")]
    results: list[dict] = []
    with (
        tempfile.TemporaryDirectory(prefix="scaling-") as tmp,
        open(out / "scaling.jsonl", "a") as log,
    ):
        work = Path(tmp)
        corpus = make_corpus(work / "corpus", args.clips)
        # Prepared once, as `ringfeed run` would: the DataLoader's sources map it too.
        prepare(config_from_dict(bench_raw(args, corpus, work, 1)))
        for r in range(args.rounds):
            for workers in (int(w) for w in args.workers.split(",")):
                for feed in feeds if (r + workers) % 2 == 0 else feeds[::-1]:
                    rate = feed(args, corpus, work, workers)
                    name = feed.__name__.removeprefix("run_")
                    row = {"round": r, "workers": workers, "feed": name, "samples_per_s": rate}
                    results.append(row)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    print(f"round {r + 1}, {workers} workers, {name}: {rate:,.0f}/s", flush=True)
    text = table(results)
    (out / "scaling.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
