"""Samples/s with 1 and 2 replicas and with 2 workers, fed by ringfeed and by tf.data.

    .venv/bin/python benchmarks/replicas.py [--rounds 2] [--steps 20] [--warmup 3]

The model, data and per-sample work of benchmarks/feed.py (the default model on
ljspeech-mini, max_frames 600, feature cache off, so every sample is decoded and
turned into a log-mel), one global batch of --batch rows, trained by the
trainer's own step (consumer/trainer/trainer.py build_step):

- 1 replica: TrainStep; 2 replicas: MirroredStrategy over two logical CPU devices
  (devices.cpu_replicas: 2); 2 workers: two processes under
  MultiWorkerMirroredStrategy on localhost, each with half the global batch.
- ringfeed: real runs (stager, 1 producer process and trainer per worker, `--worker
  K/2` for two workers), numbers from each trainer's summary.json.
- tfdata: feed.py's tf.data pipeline (AUTOTUNE map of the same per-sample work,
  padded_batch, prefetch) in the training process, under the same strategy; with
  two workers each takes every second clip and half the rows.

samples/s is the global batch's: summed over workers. On this 2-core host without
GPU the replicas share the cores the producers use, so more replicas are not
faster here: the figures compare the two ways of feeding the same strategy, not
the strategies. Rounds alternate the variants; the table gives medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.feed import RESULT_TAG, RUN_TIMEOUT_S, bench_config, tf_dataset  # noqa: E402
from ringfeed.shared.config import load_config, read_raw  # noqa: E402

SETUPS = {"1 replica": (1, 1), "2 replicas": (2, 1), "2 workers": (1, 2)}


def tfdata_child(cfg_path: str, worker: str, cluster: str, warmup: int) -> dict[str, Any]:
    """One training process fed by tf.data (worker K/N of a cluster, or alone)."""
    from ringfeed.consumer.trainer.trainer import build_step
    from ringfeed.shared.run.share import ONE_WORKER, Share

    share = Share.parse(worker) if worker else ONE_WORKER
    cfg = load_config(cfg_path)
    _, _, _, _, step_fn = build_step(cfg, share, tuple(cluster.split(",")) if cluster else ())

    from ringfeed.consumer.trainer.metrics import StepMetrics
    from ringfeed.producer.pipeline import SamplePipeline
    from ringfeed.shared.config import replace
    from ringfeed.shared.corpus.open import read_corpus

    entries, _ = read_corpus(cfg)
    local = replace(cfg, stager={"batch_size": cfg.stager.batch_size // share.count})
    pipe = SamplePipeline(cfg)
    pipe.warm_up()
    batches = iter(tf_dataset(local, entries[share.index :: share.count], pipe))
    metrics = StepMetrics(window=cfg.train.steps)
    for k in range(cfg.train.steps):
        t0 = time.perf_counter()
        batch = next(batches)
        wait_s = time.perf_counter() - t0
        float(step_fn(batch))
        if k >= warmup:
            metrics.record(time.perf_counter() - t0 - wait_s, wait_s, local.stager.batch_size)
    m = metrics.summary()
    return {"samples_per_s": m["samples_per_s"], "data_wait_fraction": m["wait_frac"]}


def cluster_args(workers: int) -> list[list[str]]:
    """--worker/--cluster arguments of each worker ([[]] for one)."""
    if workers == 1:
        return [[]]
    with contextlib.ExitStack() as stack:  # all bound at once: distinct free ports
        socks = [stack.enter_context(socket.socket()) for _ in range(workers)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        cluster = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in socks)
    return [["--worker", f"{k}/{workers}", "--cluster", cluster] for k in range(workers)]


def run_tfdata(cfg_path: Path, workers: int, warmup: int) -> list[dict[str, Any]]:
    procs = []
    for args in cluster_args(workers):
        cmd = [sys.executable, __file__, "--child", str(cfg_path), "--warmup", str(warmup), *args]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True))
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_TAG)]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"tf.data child failed (exit {proc.returncode})")
        out.append(json.loads(lines[0][len(RESULT_TAG) :]))
    return out


def run_ringfeed(cfg_path: Path, workers: int, tmp: Path) -> list[dict[str, Any]]:
    from ringfeed.scripts.runner import Run
    from ringfeed.shared.run.share import Share

    base, runs = f"rep-{uuid.uuid4().hex[:6]}", []
    try:
        for k, args in enumerate(cluster_args(workers)):
            run = Run(cfg_path, Share(k, workers).run_id(base), log_dir=tmp)
            run.verb_args = {"stager": args[:2], "trainer": args}
            run.start_all("trainer")
            runs.append(run)
        for run in runs:
            if run.wait("trainer", RUN_TIMEOUT_S) != 0:
                raise RuntimeError(f"ringfeed run {run.run_id} failed:\n{run.logs()}")
        return [json.loads((run.dir / "summary.json").read_text()) for run in runs]
    finally:
        for run in runs:
            run.__exit__(None, None, None)


def configs(tmp: Path, args: argparse.Namespace) -> dict[str, Path]:
    raw = read_raw(REPO / "configs" / "demo.yaml")
    raw.setdefault("stager", {})["batch_size"] = args.batch
    raw.setdefault("features", {})["max_frames"] = args.max_frames
    paths = {}
    for name, (replicas, _) in SETUPS.items():
        cfg_raw = bench_config(raw, tmp / "runs", 1, args.warmup, args.steps)
        cfg_raw["devices"] = {"cpu_replicas": replicas}
        paths[name] = tmp / f"{name.replace(' ', '-')}.yaml"
        paths[name].write_text(yaml.safe_dump(cfg_raw, sort_keys=False))
        load_config(paths[name])
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps (compile)")
    parser.add_argument("--batch", type=int, default=8, help="the global batch")
    parser.add_argument("--max-frames", type=int, default=600)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = tfdata_child(args.child, args.worker, args.cluster, args.warmup)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="replicas-bench-") as tmp_name:
        tmp = Path(tmp_name)
        paths = configs(tmp, args)
        for r in range(args.rounds):
            for name, (_, workers) in SETUPS.items():
                for feed in ("tfdata", "ringfeed"):
                    t0 = time.perf_counter()
                    if feed == "tfdata":
                        out = run_tfdata(paths[name], workers, args.warmup)
                    else:
                        out = run_ringfeed(paths[name], workers, tmp)
                    rate = sum(o["samples_per_s"] for o in out)
                    rates.setdefault((name, feed), []).append(rate)
                    waits = " ".join(f"{o['data_wait_fraction']:.1%}" for o in out)
                    print(
                        f"round {r + 1} {name:10s} {feed:8s} {rate:6.1f} samples/s "
                        f"wait {waits} ({time.perf_counter() - t0:.0f} s wall)",
                        flush=True,
                    )
    print(
        f"\nmedian of {args.rounds} rounds, {args.steps} steps after {args.warmup}, "
        f"global batch {args.batch}"
    )
    for name in SETUPS:
        tfd = statistics.median(rates[(name, "tfdata")])
        ours = statistics.median(rates[(name, "ringfeed")])
        print(f"{name:10s} tf.data {tfd:6.1f}  ringfeed {ours:6.1f}  ratio {ours / tfd:.3f}")


if __name__ == "__main__":
    main()
