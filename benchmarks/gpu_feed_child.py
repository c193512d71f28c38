"""One framework's measurements for benchmarks/gpu_feed.py, in a process of its own:

    python benchmarks/gpu_feed_child.py torch|jax --config C --exported DIR --n N --out OUT

calibrate the example model's depth to each target step time on the ideal feed, then
time the four feeds (ideal; ringfeed, straight from the ring pinned in place where
the device allows; ringfeed-staged, the same loader through its host copy; dataloader)
at each size, printing one GPU_FEED_RESULT line per figure and appending it to
OUT/gpu_feed.jsonl. The two ringfeed feeds read two runs of the same config (one
consumer a run), each with its stager and producers; the one not being read waits
with its ring full. The framework parts (models, steps, feeds) are
gpu_feed_frameworks.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import gpu_feed_frameworks as frameworks  # noqa: E402

from ringfeed.scripts.runner import Run  # noqa: E402
from ringfeed.shared.config import load_config  # noqa: E402

RESULT_TAG = "GPU_FEED_RESULT "
FEEDS = ("ideal", "ringfeed", "ringfeed-staged", "dataloader")
# The ringfeed feeds: whether their loader pins the ring in place (pin_ring).
RING_FEEDS = {"ringfeed": True, "ringfeed-staged": False}
# Depths timed to fit step time = a + b * n_layers, and the deepest model allowed.
PROBE_LAYERS = (1, 4)
# At d_model 512 a layer's step costs ~0.6 TFLOP (~2.5 ms on an H100 by FLOPs) and keeps
# ~1 GB of activations: 40 layers fit its 80 GB beside JAX's preallocation.
MAX_LAYERS = 40
# Steps timed per probe, after as many warm-up steps.
PROBE_STEPS = 10
# At least this many timed steps per figure, whatever --seconds says.
MIN_STEPS = 5
# NVML's utilization is the share of its last sample period (1/6 s to 1 s) with a
# kernel running; sampled this often and averaged over the timed window.
NVML_EVERY_S = 0.1


class GpuUtilization(threading.Thread):
    """GPU 0's utilization by NVML, sampled in a thread while timing; None without NVML."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.done = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no driver, no GPU: a CPU run reports no utilization
            self.nvml = None

    def run(self) -> None:
        while self.nvml is not None and not self.done.wait(NVML_EVERY_S):
            self.samples.append(float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))

    def stop(self) -> float | None:
        self.done.set()
        self.join(1.0)
        return statistics.fmean(self.samples) if self.samples else None


def measure(step: Callable, batches: Iterator, warmup: int, seconds: float) -> dict:
    """Time steps fed by `batches`: wait = blocked on the next batch, step = until its
    loss is on the host (float() waits for the device)."""
    for _ in range(warmup):
        float(step(next(batches)))
    waits, steps = [], []
    util = GpuUtilization()
    util.start()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(steps) < MIN_STEPS:
        t0 = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        float(step(batch))
        waits.append(t1 - t0)
        steps.append(time.perf_counter() - t1)
    wall = time.perf_counter() - start
    mean = statistics.fmean(steps)
    return {
        "steps": len(steps),
        "steps_per_s": len(steps) / wall,
        "wait_share": sum(waits) / wall,
        "step_ms": mean * 1e3,
        "step_cv": statistics.pstdev(steps) / mean,
        "gpu_util_pct": util.stop(),
    }


class Steps(dict):
    """A model step by n_layers, each made (and, for JAX, compiled) once."""

    def __init__(self, fw: Any) -> None:
        super().__init__()
        self.fw = fw

    def __missing__(self, layers: int) -> Callable:
        self[layers] = self.fw.make_step(layers)
        return self[layers]


def calibrate(steps: Steps, batch: dict, targets_ms: list[float]) -> list[int]:
    """n_layers for each target step time: two depths timed on a resident batch, the
    step time fitted as a line in n_layers."""
    timed = []
    for layers in PROBE_LAYERS:
        step = steps[layers]
        ms = measure(step, frameworks.repeat(batch), PROBE_STEPS, 0.0)["step_ms"]
        timed.append(ms)
        print(f"calibration: {layers} layers, {ms:.2f} ms a step", flush=True)
    (l0, l1), (t0, t1) = PROBE_LAYERS, timed
    per_layer = max((t1 - t0) / (l1 - l0), 1e-3)
    return [min(MAX_LAYERS, max(1, round(l0 + (target - t0) / per_layer))) for target in targets_ms]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("framework", choices=("torch", "jax"))
    for name in ("--config", "--exported", "--out", "--targets-ms"):
        p.add_argument(name, required=True)
    p.add_argument("--n", type=int, required=True, help="clips exported")
    p.add_argument("--device", default="auto")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--workers", type=int, default=6)
    args = p.parse_args()
    cfg = load_config(args.config)
    targets = [float(t) for t in args.targets_ms.split(",")]
    fw = frameworks.make(args.framework, cfg, args.device)
    work = Path(args.config).parent  # the driver's folder: the runs' logs go there too
    with contextlib.ExitStack() as stack:
        feeds = {}
        for feed, pin_ring in RING_FEEDS.items():
            run = stack.enter_context(Run(Path(args.config), f"gpu-{uuid.uuid4().hex[:6]}", work))
            run.start("stager")
            run.start("producers")
            feeds[feed] = fw.ringfeed(run.run_id, pin_ring)
        feeds["dataloader"] = fw.dataloader(Path(args.exported), args.n, args.workers)
        resident = fw.resident(next(feeds["ringfeed"]))
        feeds["ideal"] = frameworks.repeat(resident)
        steps = Steps(fw)
        depths = calibrate(steps, resident, targets)
        failed = 0
        for k, (target, layers) in enumerate(zip(targets, depths, strict=True)):
            try:  # one size that fails (out of memory) leaves the others' figures
                size(args, fw, steps[layers], feeds, resident, target, layers, k)
            except Exception as exc:  # reported; the next size runs
                failed += 1
                print(
                    f"size ~{target} ms ({layers} layers) failed: {type(exc).__name__}: {exc}",
                    flush=True,
                )
            steps.pop(layers, None)  # its model's memory goes back before the next
        fw.close()
    return 1 if failed else 0


def size(
    args: argparse.Namespace,
    fw: Any,
    step: Callable,
    feeds: dict,
    resident: dict,
    target: float,
    layers: int,
    k: int,
) -> None:
    """The three feeds at one model size, each figure printed and appended to the
    jsonl file as it is measured."""
    ideal_ms = measure(step, frameworks.repeat(resident), args.warmup, 0.0)["step_ms"]
    turn = k % len(FEEDS)
    for feed in FEEDS[turn:] + FEEDS[:turn]:  # each size in another order
        figure = measure(step, feeds[feed], args.warmup, args.seconds)
        figure |= {
            "framework": args.framework,
            "device": fw.device_name,
            "target_ms": target,
            "n_layers": layers,
            "ideal_step_ms": ideal_ms,
            "feed": feed,
            "batch": fw.cfg.stager.batch_size,
            "workers": args.workers,
            # Did the copies come straight from the pinned ring (None: not a ringfeed feed)?
            "ring_pinned": fw.ring_pinned(RING_FEEDS[feed]) if feed in RING_FEEDS else None,
        }
        print(RESULT_TAG + json.dumps(figure), flush=True)
        with (Path(args.out) / "gpu_feed.jsonl").open("a") as lines:
            lines.write(json.dumps(figure) + "\n")


if __name__ == "__main__":
    sys.exit(main())
