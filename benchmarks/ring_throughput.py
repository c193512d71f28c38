"""Ring throughput against multiprocessing.Pool.imap and a plain memcpy, side by side.

    .venv/bin/python benchmarks/ring_throughput.py [--rounds 3] [--seconds 4] [--baseline DIR]
    .venv/bin/python benchmarks/ring_throughput.py --quick    # 2 rounds of 3 s: ~1.5 min
    .venv/bin/python benchmarks/ring_throughput.py --quick --plot PNG   # also draw the result

All three move the same precomputed samples (tokens [200] int32 + mel
[800, 80] float32, 256,800 bytes) from "where a sample is made" into a
batch buffer, and report steady-state samples/s and GB/s:

- memcpy: one process copying each sample into a batch array (the limit);
- pool: ``multiprocessing.Pool(workers).imap`` returning each sample to the
  parent, which copies it into a batch array (pickling, pipes); once with the
  default chunksize 1 and once with chunksize 16, its best here;
- ringfeed: a real stager and producer pool (``data.format: synthetic``),
  consumed batch by batch through the batch ring by a child process of this
  benchmark; ``data.synthetic_items`` 8192 over endless epochs, as every row is
  stamped with its item (tests/support/checks.py) and the stager's content check
  (shared/sample/content.py) rejects floats beyond 1e4;
- ringfeed@baseline (with ``--baseline DIR``, a checkout of other code, e.g.
  ``git worktree add /tmp/base main``): the same run from that checkout's
  stager and producers, to compare ringfeed with itself in one run.

The rounds alternate the three so machine noise hits them alike; the table
gives the median of each and the ratios; ``--plot PATH`` draws the medians
(benchmarks/charts.py) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from charts import draw_bars, run_label
from peers import import_from

REPO = Path(__file__).resolve().parents[1]
RESULT_TAG = "RING_RESULT "
T, F, M, B = 200, 800, 80, 32
SAMPLE_BYTES = T * 4 + F * M * 4


def make_sample(i: int) -> tuple[np.ndarray, np.ndarray]:
    """The sample a producer would have ready (precomputed: no work but the move).

    New view objects each call: pickle would otherwise send one shared array once
    per imap chunk and the Pool would move less than the others."""
    return _TOKENS[:], _MEL[:]


_TOKENS = np.arange(T, dtype=np.int32)
_MEL = np.random.default_rng(0).standard_normal((F, M), dtype=np.float32)


def bench_memcpy(seconds: float) -> float:
    tokens = np.zeros((B, T), np.int32)
    mel = np.zeros((B, F, M), np.float32)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        t, m = make_sample(n)
        tokens[n % B] = t
        mel[n % B] = m
        n += 1
    return n / (time.perf_counter() - t0)


def bench_pool(seconds: float, workers: int, chunksize: int) -> float:
    """Pool.imap over a feeder that keeps a bounded number of tasks in flight, ended with
    close and join: terminate() with an endless iterable can hang for good (its task
    thread blocked on a full pipe to killed workers; seen here under load)."""
    tokens = np.zeros((B, T), np.int32)
    mel = np.zeros((B, F, M), np.float32)
    in_flight, stop = threading.Semaphore(4 * workers * chunksize + 256), threading.Event()

    def tasks() -> Iterator[int]:
        for i in itertools.count():
            in_flight.acquire()
            if stop.is_set():
                return
            yield i

    with mp.get_context("spawn").Pool(workers) as pool:
        it = pool.imap(make_sample, tasks(), chunksize=chunksize)
        n, t0 = -200, 0.0  # 200 to warm up: workers started, pipes full
        while n < 0 or time.perf_counter() - t0 < seconds:
            t, m = next(it)
            in_flight.release()
            tokens[n % B] = t
            mel[n % B] = m
            n += 1
            t0 = time.perf_counter() if n == 0 else t0
        rate = n / (time.perf_counter() - t0)
        stop.set()
        in_flight.release()  # the feeder wakes, sees stop and ends the iterable
        pool.close()
        for _ in it:  # what was in flight
            pass
        pool.join()
    return rate


ROLES = ("stager", "producers", "this process")


def bench_ring(seconds: float, workers: int, tmp: Path) -> tuple[float, list[float]]:
    """-> (samples/s, CPU us per sample of the stager, the producers and the client)."""
    from cpu_meter import CpuMeter  # this checkout's (benchmarks/cpu_meter.py)
    from live_run import live_run  # of the checkout on sys.path (this one or --baseline's)

    raw = {
        "data": {"format": "synthetic", "synthetic_items": 8192},
        "features": {"max_frames": F, "n_mels": M, "cache": False},
        "text": {"max_text_len": T},
        "stager": {"batch_size": B},
        "producers": {"workers": workers},
        "run_root": str(tmp / "runs"),
    }
    with live_run(raw, tmp) as client:
        for _ in range(20):  # warm up
            client.free(client.next(timeout_s=30))
        n, t0, meter = 0, time.perf_counter(), CpuMeter()
        while time.perf_counter() - t0 < seconds:
            batch = client.next(timeout_s=30)
            client.free(batch)
            n += batch.meta.n_valid
        meter.read()
        rate, per_role = n / (time.perf_counter() - t0), meter.ms_per_sample(n)
    return rate, [1e3 * per_role.get(role, 0.0) for role in ROLES]


def ring_in_child(repo: Path, seconds: float, workers: int, tmp: Path) -> tuple[float, list[float]]:
    """bench_ring with `repo`'s stager, producers and client, in a fresh process."""
    cmd = [sys.executable, __file__, "--ring-child", str(repo), "--seconds", str(seconds)]
    cmd += ["--workers", str(workers), "--tmp", str(tmp)]
    # cwd=repo: the run's processes (python -m ringfeed...) import from their working
    # directory, so a --baseline run must start there or it runs this checkout's code.
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=120 + 2 * seconds)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            rate, *cpu_us = line[len(RESULT_TAG) :].split()
            return float(rate), [float(v) for v in cpu_us]
    raise RuntimeError(
        f"ring run of {repo} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    )


def print_table(
    rates: dict[str, list[float]], cpu: dict[str, list[list[float]]], args: argparse.Namespace
) -> None:
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"\nmedian of {args.rounds} rounds, {args.seconds:.0f} s each, {args.workers} producers, "
        f"{SAMPLE_BYTES:,} bytes/sample"
    )
    print(f"{'':13s} {'samples/s':>10s} {'GB/s':>6s}")
    for k, v in med.items():
        print(f"{k:13s} {v:10,.0f} {v * SAMPLE_BYTES / 1e9:6.2f}")
    print(f"ringfeed / pool         = {med['ringfeed'] / med['pool']:.1f}x")
    print(f"ringfeed / pool-chunk16 = {med['ringfeed'] / med['pool-chunk16']:.1f}x")
    print(f"memcpy / ringfeed       = {med['memcpy'] / med['ringfeed']:.1f}x")
    for name, v in cpu.items():
        by_role = [statistics.median(r[k] for r in v) for k in range(len(ROLES))]
        parts = ", ".join(f"{role} {us:.0f}" for role, us in zip(ROLES, by_role, strict=True))
        total = statistics.median(sum(r) for r in v)
        print(f"{name} CPU per sample = {total:.0f} us ({parts})")
    if args.baseline:
        print(f"ringfeed / baseline     = {med['ringfeed'] / med['ringfeed@baseline']:.2f}x")


def plot(rates: dict[str, list[float]], path: str) -> None:
    """Median samples/s of each mover, log scale (memcpy is ~10x ringfeed, ~60x the Pool)."""
    med = {k: statistics.median(v) for k, v in rates.items()}
    draw_bars(
        path,
        f"Moving {SAMPLE_BYTES:,}-byte samples into batches of {B} (median)",
        [("samples/s (log scale)", med)],
        run_label("ring_throughput.py"),
        log_x=[True],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s")
    parser.add_argument("--baseline", help="a checkout whose ringfeed to run alongside")
    parser.add_argument("--plot", help="also draw the medians into this PNG")
    parser.add_argument("--ring-child", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ring_child:
        import_from(Path(args.ring_child))
        rate, cpu_us = bench_ring(args.seconds, args.workers, Path(args.tmp))
        print(RESULT_TAG + " ".join(str(v) for v in (rate, *cpu_us)))
        return
    if args.quick:
        args.rounds, args.seconds = 2, 3.0
    rates: dict[str, list[float]] = {"memcpy": [], "pool": [], "pool-chunk16": [], "ringfeed": []}
    if args.baseline:
        rates["ringfeed@baseline"] = []
    cpu: dict[str, list[list[float]]] = {n: [] for n in rates if n.startswith("ringfeed")}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            rates["memcpy"].append(bench_memcpy(args.seconds))
            rates["pool"].append(bench_pool(args.seconds, args.workers, 1))
            rates["pool-chunk16"].append(bench_pool(args.seconds, args.workers, 16))
            rings = [("ringfeed", REPO)] + (
                [("ringfeed@baseline", args.baseline)] * bool(args.baseline)
            )
            for name, repo in rings if r % 2 == 0 else rings[::-1]:
                rate, cpu_us = ring_in_child(Path(repo), args.seconds, args.workers, Path(tmp))
                rates[name].append(rate)
                cpu[name].append(cpu_us)
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()),
                flush=True,
            )
    print_table(rates, cpu, args)
    if args.plot:
        plot(rates, args.plot)


if __name__ == "__main__":
    main()
