"""Ring throughput against multiprocessing.Pool.imap and a plain memcpy, side by side.

    .venv/bin/python benchmarks/ring_throughput.py [--rounds 3] [--seconds 4]

All three move the same precomputed samples (tokens [200] int32 + mel
[800, 80] float32, 256,800 bytes) from "where a sample is made" into a
batch buffer, and report steady-state samples/s and GB/s:

- memcpy: one process copying each sample into a batch array (the limit);
- pool: ``multiprocessing.Pool(workers).imap`` returning each sample to the
  parent, which copies it into a batch array (pickling, pipes); once with the
  default chunksize 1 and once with chunksize 16, its best here;
- ringfeed: a real stager and producer pool (``data.format: synthetic``),
  consumed batch by batch by this process through the batch ring.

The rounds alternate the three so machine noise hits them alike; the table
gives the median of each and the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from live_run import live_run  # noqa: E402

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
    tokens = np.zeros((B, T), np.int32)
    mel = np.zeros((B, F, M), np.float32)
    with mp.get_context("spawn").Pool(workers) as pool:
        it = pool.imap(make_sample, range(10**9), chunksize=chunksize)
        for _ in range(200):  # warm up: workers started, pipes full
            next(it)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t, m = next(it)
            tokens[n % B] = t
            mel[n % B] = m
            n += 1
        rate = n / (time.perf_counter() - t0)
        pool.terminate()
    return rate


def bench_ring(seconds: float, workers: int, tmp: Path) -> float:
    raw = {
        "data": {"format": "synthetic", "synthetic_items": 10**7},
        "features": {"max_frames": F, "n_mels": M, "cache": False},
        "text": {"max_text_len": T},
        "stager": {"batch_size": B},
        "producers": {"workers": workers},
        "run_root": str(tmp / "runs"),
    }
    with live_run(raw, tmp) as client:
        for _ in range(20):  # warm up
            client.free(client.next(timeout_s=30))
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            batch = client.next(timeout_s=30)
            client.free(batch)
            n += batch.meta.n_valid
        rate = n / (time.perf_counter() - t0)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"memcpy": [], "pool": [], "pool-chunk16": [], "ringfeed": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            rates["memcpy"].append(bench_memcpy(args.seconds))
            rates["pool"].append(bench_pool(args.seconds, args.workers, 1))
            rates["pool-chunk16"].append(bench_pool(args.seconds, args.workers, 16))
            rates["ringfeed"].append(bench_ring(args.seconds, args.workers, Path(tmp)))
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()),
                flush=True,
            )
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


if __name__ == "__main__":
    main()
