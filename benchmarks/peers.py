"""ringfeed against tf.data on the cold and the cached path: same clips, same batch, same threads.

    .venv/bin/python benchmarks/peers.py [--rounds 2] [--clips 512] [--baseline DIR]
    .venv/bin/python benchmarks/peers.py --quick          # 1 round, 256 clips: ~2 min
    .venv/bin/python benchmarks/peers.py --quick --plot PNG   # also draw the result
    .venv/bin/python benchmarks/peers.py --quick --stages     # also CPU by process and stage
    .venv/bin/python benchmarks/peers.py --device stager ...  # ringfeed with stager mels

Data: ``--clips`` crops of the 16 shipped LJSpeech clips (22050 Hz 16-bit PCM, so
no variant resamples), 1-9.5 s long, written once into a temporary LJSpeech
layout with their transcripts. Every variant turns each clip into tokens and a
log-mel [<= 800, 80] (n_fft 1024, hop 256, Slaney filterbank, clips cut to 800
frames) and batches of 32 padded to [32, 800, 80], with two workers and math
libraries pinned to one thread:

- tfdata-ops: the strongest pipeline a TensorFlow user builds from TensorFlow
  ops only: ``read_file``, ``decode_wav``, peak normalization, ``tf.signal.stft``,
  the same mel matrix, ``map(num_parallel_calls=AUTOTUNE)``, ``padded_batch``,
  ``prefetch``; a private tf.data pool of 2 threads, 1 intra-op thread;
- tfdata-librosa: what the old pipeline did: ``tf.numpy_function`` around
  soundfile + ``librosa.feature.melspectrogram`` (benchmarks/producer_cache.py's
  ``raw_mel``) and the producer's tokenizer, same pool;
- ringfeed-cold: a real run (stager, 2 producers, this benchmark's child as the
  batch client, ``benchmarks/live_run.py``), feature cache on and empty: the
  first epoch of every run (decode, mel, tokens, cache write);
- ringfeed-cached: a real run over the cache that ringfeed-cold of the same
  round filled, CACHED_EPOCHS epochs;
- tfdata-cached: the same cached mels, copied out of that cache with their tokens
  (one file each), read by tf.data for CACHED_EPOCHS epochs, same pool: the
  cached path like for like (benchmarks/peer_pipelines.py);
- ringfeed-cold@baseline and ringfeed-cached@baseline (with ``--baseline DIR``, a
  checkout of other code): ringfeed-cold and ringfeed-cached run from that checkout,
  over a cache of its own, to compare ringfeed with itself.

``--device stager`` runs ringfeed with features.device: stager (the producers write
waveforms, the stager computes the batch's mels in its framework, on the CPU here):
ringfeed-cold is then the stager's mels over an empty cache, ringfeed-cached the epochs
over the mels the stager kept.

Each variant runs in its own process (TensorFlow stays out of ringfeed's) and
reports samples over the time from its first batch to its last (start-up, TF
graph building and XLA excluded alike), and the CPU time all its processes and
threads used in that window per sample (/proc): on a shared machine the rate
depends on what else runs, the CPU cost per sample much less. The rounds alternate the variants, so
machine noise hits them alike; the table gives each median and its ratio to
tfdata-ops, then each round's ratios against the issue's targets; ``--plot PATH``
draws the medians (benchmarks/charts.py) for docs/benchmarks.md; ``--stages`` adds
each pipeline's CPU by process (stager, producers, this process) and a producer's
cold path stage by stage against tfdata-ops's (benchmarks/stage_costs.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from charts import draw_bars, run_label
from cpu_meter import CpuMeter
from peer_pipelines import BATCH, WORKERS

REPO = Path(__file__).resolve().parents[1]
CLIPS = REPO / "data" / "ljspeech-mini"
VARIANTS = ("tfdata-ops", "ringfeed-cold", "tfdata-librosa", "ringfeed-cached", "tfdata-cached")
# The order of odd rounds: every variant moves, the cached ones still follow the
# ringfeed-cold that fills their cache.
ODD_ORDER = (
    "ringfeed-cold@baseline",
    "ringfeed-cold",
    "tfdata-cached",
    "ringfeed-cached@baseline",
    "tfdata-ops",
    "ringfeed-cached",
    "tfdata-librosa",
)
# Epochs of the cached run: one epoch of 512 cached samples is ~0.1 s, too short to time.
CACHED_EPOCHS = 4
MIN_S, MAX_S = 1.0, 9.5
RUN_TIMEOUT_S = 600.0
RESULT_TAG = "PEERS_RESULT "


def make_corpus(root: Path, n: int, seed: int = 0) -> Path:
    """n crops (1-9.5 s, from random offsets) of the shipped clips, LJSpeech layout."""
    import soundfile as sf

    lines = [line.split("|") for line in (CLIPS / "metadata.csv").read_text().splitlines()]
    rng = np.random.default_rng(seed)
    (root / "wavs").mkdir(parents=True)
    out = []
    for i in range(n):
        clip_id, text = lines[i % len(lines)][0], lines[i % len(lines)][1]
        wave, sr = sf.read(CLIPS / "wavs" / f"{clip_id}.wav", dtype="int16")
        n_keep = min(len(wave), int(rng.uniform(MIN_S, MAX_S) * sr))
        start = int(rng.integers(0, len(wave) - n_keep + 1))
        sf.write(root / "wavs" / f"c{i:05d}.wav", wave[start : start + n_keep], sr, "PCM_16")
        out.append(f"c{i:05d}|{text}|{text}")
    (root / "metadata.csv").write_text("\n".join(out) + "\n")
    return root


def bench_raw(corpus: Path, cache_dir: Path, epochs: int, device: str = "producer") -> dict:
    """The config mapping of the ringfeed runs (as YAML would give it); device:
    features.device."""
    features = {"cache": True, "cache_dir": str(cache_dir), "on_too_long": "truncate"}
    return {
        "data": {"path": str(corpus)},
        "features": features | {"device": device},
        "stager": {"batch_size": BATCH, "epochs": epochs},
        "producers": {"workers": WORKERS, "math_threads": 1},
        "run_root": str(cache_dir.parent / "runs"),
    }


# ------------------------------------------------------------ children


def timed(batches) -> dict:
    """Samples per second from the first batch to the last, and CPU ms per sample over
    that window (every process of the pipeline; by role too). batches yields each
    batch's n_valid, then 0 once the data has ended."""
    total = first = 0
    t_first = t_last = time.perf_counter()
    meter = None
    for n in batches:
        if meter is not None:
            meter.read()
        if n == 0:
            continue
        if total == 0:
            first, t_first, meter = n, time.perf_counter(), CpuMeter()
        total += n
        t_last = time.perf_counter()
    roles = meter.ms_per_sample(max(total - first, 1)) if meter is not None else {}
    return {
        "samples": total,
        "rate": (total - first) / max(t_last - t_first, 1e-9),
        "cpu_ms": sum(roles.values()),
        "roles": roles,
    }


def run_ringfeed(corpus: Path, cache_dir: Path, epochs: int, tmp: Path, device: str) -> dict:
    from live_run import live_run  # the checkout on sys.path: this one, or --baseline's

    def batches():
        with live_run(bench_raw(corpus, cache_dir, epochs, device), tmp) as client:
            while (batch := client.next(timeout_s=120)) is not None:
                n = batch.meta.n_valid
                client.free(batch)
                yield n
            yield 0  # the end of data: the run's processes are still there to be read

    return timed(batches())


def run_tf(variant: str, corpus: Path, cache_dir: Path) -> dict:
    """tfdata-ops, tfdata-librosa, or tfdata-cached over the mels of cache_dir (filled by
    this round's ringfeed-cold); "check": parity with the producer's log-mel (ops), or
    whether the first batch holds the cached mels (cached)."""
    import peer_pipelines as pp

    from ringfeed.shared.config import config_from_dict

    cfg = config_from_dict(bench_raw(corpus, cache_dir, 1))
    rows = [line.split("|") for line in (corpus / "metadata.csv").read_text().splitlines()]
    paths = [str(corpus / "wavs" / f"{r[0]}.wav") for r in rows]
    texts = [r[1] for r in rows]
    if variant == "tfdata-cached":
        mels = pp.export_cached(cfg, paths, texts, cache_dir.parent / "tf-cached")
        ds = pp.tf_cached_dataset(cfg, cache_dir.parent / "tf-cached", len(mels), CACHED_EPOCHS)
        check = float(pp.cached_rows_match(next(iter(ds)), mels))
    else:
        make = pp.tf_ops_dataset if variant == "tfdata-ops" else pp.tf_librosa_dataset
        ds = make(cfg, paths, texts)
        check = pp.tf_parity(cfg, paths[0]) if variant == "tfdata-ops" else None
    out = timed(itertools.chain((int(b["mel_lens"].shape[0]) for b in ds), [0]))
    return out | {"check": check}


def import_from(repo: Path) -> None:
    """Put `repo` first on sys.path and make sure its ringfeed is the one imported (a
    checkout older than ringfeed/'s links to its folders would mix in this one's)."""
    sys.path[:0] = [str(repo), str(repo / "benchmarks")]
    import ringfeed

    where = Path(ringfeed.__file__).resolve().parent.parent
    if where != repo.resolve():
        raise SystemExit(
            f"{repo}: imports ringfeed from {where}; a checkout from before "
            "ringfeed/ linked its folders needs the links: cd ringfeed && ln -s "
            "../shared ../producer ../consumer ../scripts ."
        )


def child(args: argparse.Namespace) -> None:
    import_from(Path(args.repo))
    corpus, cache_dir = Path(args.corpus), Path(args.cache_dir)
    if args.child.startswith("stages"):
        import stage_costs

        from ringfeed.shared.config import config_from_dict

        cfg = config_from_dict(bench_raw(corpus, cache_dir, 1, args.device))
        which = (
            stage_costs.ringfeed_stages
            if args.child == "stages-ringfeed"
            else (stage_costs.tf_stages)
        )
        out = which(cfg, *stage_costs.clips(corpus))
    elif args.child.startswith("ringfeed"):
        epochs = CACHED_EPOCHS if args.child == "ringfeed-cached" else 1
        out = run_ringfeed(corpus, cache_dir, epochs, cache_dir.parent, args.device)
    else:
        out = run_tf(args.child, corpus, cache_dir)
    print(RESULT_TAG + json.dumps(out), flush=True)


# ------------------------------------------------------------ parent


def spawn(variant: str, repo: Path, corpus: Path, cache_dir: Path, device: str) -> dict:
    from ringfeed.producer.process.threads import math_thread_env

    env = (
        os.environ | math_thread_env(1) | {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    )
    cmd = [sys.executable, __file__, "--child", variant.split("@")[0], "--repo", str(repo)]
    cmd += ["--corpus", str(corpus), "--cache-dir", str(cache_dir), "--device", device]
    # cwd=repo: the run's processes (python -m ringfeed...) import from their working
    # directory, so a --baseline run must start there or it runs this checkout's code.
    proc = subprocess.run(
        cmd, env=env, cwd=repo, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(f"{variant} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def stage_table(corpus: Path, tmp: Path, device: str) -> None:
    """--stages: one producer's cold path and tfdata-ops's, stage by stage (stage_costs.py)."""
    from stage_costs import print_stages

    ours = spawn("stages-ringfeed", REPO, corpus, tmp / "ringfeed", device)
    print_stages(ours, spawn("stages-tf", REPO, corpus, tmp / "tf", device))


def print_table(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    """The table of docs/benchmarks.md, each round's ratios against the issue's targets,
    and the checks of the peers' output."""
    med = {k: statistics.median(o["rate"] for o in v) for k, v in results.items() if v}
    cpu = {k: statistics.median(o["cpu_ms"] for o in v) for k, v in results.items() if v}
    base = med["tfdata-ops"]
    print(
        f"\n{args.clips} clips of {MIN_S:g}-{MAX_S:g} s, batch {BATCH}, {WORKERS} workers, "
        f"math libraries on 1 thread, {args.rounds} round(s), alternated\n"
    )
    print("| pipeline | samples/s (each round) | median | vs tfdata-ops | CPU ms/sample |")
    print("|---|---|---:|---:|---:|")
    for k, v in results.items():
        each = " / ".join(f"{o['rate']:,.0f}" for o in v)
        print(f"| {k} | {each} | {med[k]:,.0f} | {med[k] / base:.2f}x | {cpu[k]:.2f} |")
    rounds = list(zip(*(results[k] for k in VARIANTS), strict=True))
    ratios = {  # the targets: >= 1.3, <= 0.8 and >= 2 in every round
        "cold / tfdata-ops samples/s": [r[1]["rate"] / r[0]["rate"] for r in rounds],
        "cold / tfdata-ops CPU per sample": [r[1]["cpu_ms"] / r[0]["cpu_ms"] for r in rounds],
        "cached / tfdata-cached samples/s": [r[3]["rate"] / r[4]["rate"] for r in rounds],
    }
    for path in ("cold", "cached"):  # --baseline: this code against that checkout's
        if results.get(f"ringfeed-{path}@baseline"):
            pairs = zip(
                results[f"ringfeed-{path}"], results[f"ringfeed-{path}@baseline"], strict=True
            )
            ratios[f"{path} / {path}@baseline samples/s"] = [
                a["rate"] / b["rate"] for a, b in pairs
            ]
    print(
        "\neach round: "
        + "; ".join(f"{k} {', '.join(f'{x:.2f}' for x in v)}" for k, v in ratios.items())
    )
    ops, cached = results["tfdata-ops"][-1]["check"], results["tfdata-cached"][-1]["check"]
    print(
        f"tfdata-ops log-mel against the producer's (values above 2e-4): max diff {ops:.1e}; "
        f"tfdata-cached rows are the cached mels: {bool(cached)}"
    )


def print_roles(results: dict[str, list[dict]]) -> None:
    """--stages: each pipeline's CPU ms per sample by process (medians over the rounds)."""
    roles = sorted({r for v in results.values() for o in v for r in o["roles"]})
    print("\n| CPU ms/sample by process | " + " | ".join(roles) + " |")
    print("|---|" + "---:|" * len(roles))
    for k, v in results.items():
        cells = [statistics.median(o["roles"].get(r, 0.0) for o in v) for r in roles]
        print(f"| {k} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


def plot(results: dict[str, list[dict]], path: str) -> None:
    """Median samples/s (log scale: cached is ~7x cold) and CPU ms per sample of each."""
    med = {k: statistics.median(o["rate"] for o in v) for k, v in results.items() if v}
    cpu_med = {k: statistics.median(o["cpu_ms"] for o in results[k]) for k in med}
    draw_bars(
        path,
        f"Clips to padded batches of {BATCH}, {WORKERS} workers each (median)",
        [("samples/s (log scale)", med), ("CPU ms per sample, all processes", cpu_med)],
        run_label("peers.py"),
        log_x=[True, False],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clips", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="1 round of 256 clips")
    parser.add_argument(
        "--baseline", help="a checkout whose ringfeed-cold and ringfeed-cached to run alongside"
    )
    parser.add_argument("--plot", help="also draw the medians into this PNG")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="also each pipeline's CPU by process, and a producer's by stage "
        "against tf.data's ops (benchmarks/stage_costs.py)",
    )
    parser.add_argument(
        "--device",
        choices=("producer", "stager"),
        default="producer",
        help="features.device of the ringfeed runs (stager: the stager's mels, on its CPU here)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--repo", default=str(REPO), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.rounds, args.clips = 1, 256
    sys.path.insert(0, str(REPO))
    baseline = ["ringfeed-cold@baseline", "ringfeed-cached@baseline"] if args.baseline else []
    variants = list(VARIANTS) + baseline
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        corpus = make_corpus(Path(tmp) / "corpus", args.clips)
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else [v for v in ODD_ORDER if v in variants]
            for v in order:
                repo = Path(args.baseline) if v.endswith("@baseline") else REPO
                cache_dir = Path(tmp) / f"r{r}" / ("base" if "@" in v else "cache")
                cache_dir.parent.mkdir(exist_ok=True)
                out = spawn(v, repo, corpus, cache_dir, args.device)
                results[v].append(out)
                print(
                    f"round {r + 1}: {v} {out['rate']:,.0f} samples/s, "
                    f"{out['cpu_ms']:.2f} CPU ms/sample",
                    flush=True,
                )
        if args.stages:
            stage_table(corpus, Path(tmp) / "stages", args.device)
    print_table(results, args)
    if args.stages:
        print_roles(results)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
