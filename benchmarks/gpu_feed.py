"""PyTorch and JAX training on a GPU, fed four ways: the ideal (a batch resident on the
device), ringfeed through its loaders straight from the batch ring pinned in place and
through their host copy (side by side), and torch's DataLoader over the same cached mels.

    python benchmarks/gpu_feed.py --out DIR                 # a GPU machine: ~7 min
    .venv/bin/python benchmarks/gpu_feed.py --quick --out DIR   # the CPU smoke: ~1.5 min

Data: --clips crops of the 16 shipped LJSpeech clips (benchmarks/peers.py make_corpus),
1-9.5 s, one epoch run through ringfeed first so its feature cache holds every clip's
log-mel, then those mels copied out with their tokens, one file each
(benchmarks/peer_pipelines.py export_cached): the DataLoader's data. Batches of --batch
rows of [max_frames 800, 80] mels, fixed shape (one compiled step).

Models: the example trainers' (consumer/trainer/torch_example/, jax_example/: the
default TTS architecture, Adam, fp32), d_model --d-model, with n_layers calibrated on
the ideal feed so a step takes about each of --targets-ms (8, 20, 40 ms): two depths
are timed and the step time fitted as a line in n_layers.

Feeds, each for --seconds after --warmup steps, in rotating order at each size:
- ideal: one real batch, resident on the device, stepped on again and again;
- ringfeed: a real run (stager and --workers producers: `Run`, scripts/runner.py) over
  the warm cache, read by ringfeed.torch / ringfeed.jax's RingLoader (batch k + 1 copied
  while step k runs; for JAX, placed data-parallel on the device), straight from the
  batch ring, which the loader pins in place (cudaHostRegister; JAX: dma_map);
- ringfeed-staged: the same on a second run of the same config, its loader made with
  pin_ring=False: each batch copied out of the slot into a pinned staging buffer
  (torch) or a fresh host array (JAX) first, as before the ring was pinned. The two
  side by side are what pinning the ring in place buys (issue 48); each figure says
  whether its ring was pinned (`ring_pinned`: on the CPU, or where registration
  fails, it is not, and the loader said why once);
- dataloader: torch.utils.data.DataLoader over the exported mels, --workers workers,
  pin_memory, persistent workers, prefetch_factor 2, padded to the same shape, copied
  with non_blocking=True (PyTorch); for JAX the same DataLoader (spawned workers:
  JAX's threads do not survive a fork) and two batches device_put ahead, as
  flax's prefetch_to_device does. (grain is not on the GPU machine.)

Each step ends with its loss on the host (the step's true end, as the trainers time
it). Reported per framework, size and feed: steps/s, its share of the ideal's, the
data-wait share (time blocked on the next batch / wall), the step-time CV (std / mean
of the steps' compute time) and the GPU utilization NVML reports, averaged over
samples every 0.1 s. One process per framework (--child), so a failure in one leaves
the other's figures; every figure is written to OUT/gpu_feed.jsonl as it is measured,
the tables (every feed; the pinned ring against the staging copy) to OUT/gpu_feed.md
at the end. On a one-GPU machine the stagers and the model share GPU 0 (the stagers
do not use it: mels come from the producers).

The GPU machines have PyTorch, JAX, CuPy and NVML but not TensorFlow, and no network:
the base install's missing packages travel as wheels (x86-64, CPython 3.12). Once, in
the repository root of the machine that sends the tree (.whl/ is in .gitignore; 10
wheels, 23 MB):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \\
      --platform manylinux2014_x86_64 -d .whl $(cat benchmarks/gpu_feed_wheels.txt)

and there, as one command (`.whl` carried; at most 8 files come back from $OUT, this
writes 7): the wheels, the machine, the GPU-marked loader tests (rows intact through
the side-stream copy, from the pinned ring and through the staging buffers), then the
benchmark (~7 min):

    mount -o remount,size=16G /dev/shm 2>/dev/null; python3 -m pip install -q --no-index \
      --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site || exit; (nvidia-smi --query-gpu=name,memory.total,\
    driver_version --format=csv,noheader; nproc; df -h /dev/shm | tail -1) > $OUT/machine.txt;
    timeout 100 python3 -m pytest -q -n 0 -p no:cacheprovider -m gpu \
      tests/unit/test_torch_loader.py tests/unit/test_jax_loader.py > $OUT/gpu_tests.txt 2>&1;
    tail -3 $OUT/gpu_tests.txt; set -o pipefail; PYTHONUNBUFFERED=1 timeout 480 python3 \
      benchmarks/gpu_feed.py --out $OUT 2>&1 | tee $OUT/gpu_feed.out

Where the session's device time is short, `--targets-ms 8 --seconds 4` measures the
~8 ms size only, where the copy weighs most (~3 min).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from peer_pipelines import export_cached  # noqa: E402
from peers import make_corpus  # noqa: E402

from ringfeed.scripts.runner import Run  # noqa: E402
from ringfeed.shared.config import config_from_dict  # noqa: E402

RESULT_TAG = "GPU_FEED_RESULT "
# The longest one framework's child may run, seconds (calibration, three sizes, four
# feeds, JAX's compiles); the GPU run's whole budget is ~8 minutes.
CHILD_TIMEOUT_S = 360.0
# What --quick shrinks to: a CPU smoke of every path in about a minute on 2 cores.
QUICK = {
    "clips": 48,
    "batch": 4,
    "max_frames": 128,
    "workers": 1,
    "seconds": 0.5,
    "warmup": 2,
    "d_model": 16,
    "targets_ms": "10",
}


def bench_raw(args: argparse.Namespace, corpus: Path, work: Path) -> dict:
    """The runs' config mapping (as YAML would give it): the warm cache, an endless plan
    (the loader says BYE when the measurements are done), --workers producers."""
    return {
        "data": {"path": str(corpus)},
        "features": {
            "cache": True,
            "cache_dir": str(work / "cache"),
            "on_too_long": "truncate",
            "max_frames": args.max_frames,
        },
        "text": {"max_text_len": 200},
        "stager": {"batch_size": args.batch, "epochs": 0},
        "producers": {"workers": args.workers, "math_threads": 1},
        "model": {"kwargs": {"d_model": args.d_model, "n_layers": 1, "dropout": 0.1}},
        "train": {"connect_timeout_s": 30.0},
        "run_root": str(work / "runs"),
    }


def warm_cache(raw: dict, work: Path) -> int:
    """One epoch through ringfeed, so its feature cache holds every usable clip's mel;
    -> the clips delivered."""
    config = work / "warm.yaml"
    config.write_text(json.dumps(raw | {"stager": raw["stager"] | {"epochs": 1}}))
    delivered = 0
    with Run(config, f"warm-{uuid.uuid4().hex[:6]}", work) as run:
        run.start("stager")
        run.start("producers")
        client = run.client("warm", timeout_s=120)
        while (batch := client.next(timeout_s=300)) is not None:
            delivered += batch.meta.n_valid
            client.free(batch)
        client.close(finished=True)
    return delivered


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path, int]:
    """The corpus, the warm cache, the exported mels; -> (config file, export folder,
    clips exported)."""
    t0 = time.perf_counter()
    corpus = make_corpus(work / "corpus", args.clips)
    raw = bench_raw(args, corpus, work)
    delivered = warm_cache(raw, work)
    rows = [line.split("|") for line in (corpus / "metadata.csv").read_text().splitlines()]
    cfg = config_from_dict(raw)
    mels = export_cached(
        cfg,
        [str(corpus / "wavs" / f"{r[0]}.wav") for r in rows],
        [r[1] for r in rows],
        work / "exported",
    )
    config = work / "bench.yaml"
    config.write_text(json.dumps(raw))
    print(
        f"data: {args.clips} clips, {delivered} delivered warm, {len(mels)} exported, "
        f"in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    return config, work / "exported", len(mels)


def run_child(
    framework: str, args: argparse.Namespace, config: Path, exported: Path, n: int
) -> list[dict]:
    """One framework's measurements in a process of its own; its result lines."""
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "gpu_feed_child.py"),
        framework,
        "--config",
        str(config),
        "--exported",
        str(exported),
        "--n",
        str(n),
        "--out",
        str(args.out),
        "--device",
        args.device,
        "--seconds",
        str(args.seconds),
        "--warmup",
        str(args.warmup),
        "--targets-ms",
        args.targets_ms,
        "--workers",
        str(args.workers),
    ]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
        out, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out", -1
    if code != 0:  # the run's own logs (stager, producers) say why a ringfeed feed failed
        out = str(out) + "".join(
            f"\n--- {log.name}\n{log.read_text()[-3000:]}"
            for log in sorted(config.parent.glob("gpu-*.log"))
        )
    (Path(args.out) / f"gpu_feed_{framework}.log").write_text(str(out))
    results = [
        json.loads(line[len(RESULT_TAG) :])
        for line in str(out).splitlines()
        if line.startswith(RESULT_TAG)
    ]
    print(
        f"{framework}: {len(results)} figures in {time.perf_counter() - t0:.0f} s, "
        f"exit {code}" + ("" if code == 0 else f"; last lines:\n{str(out)[-2000:]}"),
        flush=True,
    )
    return results


def table(results: list[dict]) -> str:
    """The results as markdown: every feed, with its share of its ideal; then the
    pinned ring against the staging copy (pinned())."""
    ideal = {
        (r["framework"], r["target_ms"]): r["steps_per_s"] for r in results if r["feed"] == "ideal"
    }
    lines = [
        "| framework | step (ideal) | feed | steps/s | of ideal | data wait | step CV | GPU util |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        base = ideal.get((r["framework"], r["target_ms"]))
        share = f"{r['steps_per_s'] / base:.3f}" if base else "-"
        util = f"{r['gpu_util_pct']:.0f} %" if r.get("gpu_util_pct") is not None else "-"
        lines.append(
            f"| {r['framework']} | ~{r['target_ms']} ms ({r['ideal_step_ms']:.1f} ms, "
            f"{r['n_layers']} layers) | {r['feed']} | {r['steps_per_s']:.1f} | {share} | "
            f"{r['wait_share']:.1%} | {r['step_cv']:.1%} | {util} |"
        )
    return "\n".join(lines) + "\n\n" + pinned(results)


def pinned(results: list[dict]) -> str:
    """The two ringfeed feeds side by side at each framework and size: steps/s and data
    wait from the ring pinned in place and through the staging copy, and whether the
    ring really was pinned (no: the CPU, or a registration the loader said it lost)."""
    by = {(r["framework"], r["target_ms"], r["feed"]): r for r in results}
    lines = [
        "| framework | step (ideal) | pinned ring steps/s | staging copy steps/s | ratio "
        "| data wait pinned / staged | ring pinned |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for (framework, target, feed), r in by.items():
        staged = by.get((framework, target, "ringfeed-staged"))
        if feed != "ringfeed" or staged is None:
            continue
        lines.append(
            f"| {framework} | ~{target} ms | {r['steps_per_s']:.1f} | "
            f"{staged['steps_per_s']:.1f} | {r['steps_per_s'] / staged['steps_per_s']:.3f} | "
            f"{r['wait_share']:.1%} / {staged['wait_share']:.1%} | "
            f"{'yes' if r.get('ring_pinned') else 'no'} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where the figures go (the GPU run's $OUT)")
    p.add_argument("--quick", action="store_true", help="the CPU smoke's sizes (QUICK)")
    p.add_argument("--device", default="auto", help="cuda, cpu, or auto (cuda when there)")
    p.add_argument("--frameworks", default="torch,jax")
    p.add_argument("--clips", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-frames", type=int, default=800)
    p.add_argument("--workers", type=int, default=6, help="producers, and DataLoader workers")
    # 512 wide: ~2 ms a layer on an H100 by FLOPs, so 40 ms is ~20 layers, not the ~75 of
    # 256 wide (JAX compiles the unrolled layers: time grows with depth, not width).
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--targets-ms", default="8,20,40")
    p.add_argument("--seconds", type=float, default=6.0, help="timed per feed and size")
    p.add_argument("--warmup", type=int, default=15, help="steps before the timing")
    p.add_argument("--child-timeout", type=float, default=CHILD_TIMEOUT_S)
    p.add_argument(
        "--work",
        default="",
        help="keep the corpus, cache and logs here (an empty folder; default: a temporary one)",
    )
    args = p.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0, results = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="gpu-feed-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        config, exported, n = prepare(args, work)
        for framework in args.frameworks.split(","):
            results += run_child(framework, args, config, exported, n)
    text = table(results)
    (Path(args.out) / "gpu_feed.md").write_text(text + "\n")  # the figures: gpu_feed.jsonl
    print(text)
    print(f"gpu_feed: {len(results)} figures in {time.perf_counter() - t0:.0f} s; {args.out}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
