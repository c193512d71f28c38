"""What one read of a row costs, warm and cold: the floor under the stager's CPU a sample.

    .venv/bin/python benchmarks/row_pass.py [--rounds 5] [--rows 2000]

The stager reads every row it sends once, in place, for its values and its hash
(shared/memory/row_pass.py; docs/design.md#passes-over-a-row). ring_throughput.py's
"memcpy" copies one precomputed sample again and again, which stays in this core's
cache; the rows a stager reads were just written by a producer on another core. Here
the same 256,800-byte row (tokens [200] int32 + mel [800, 80] float32, the ring
benchmark's) is:

- warm: one row, passed over again and again (in this core's L2, as memcpy's is);
- cold: each row of --rows (~0.5 GB at 2,000) passed over once, in order (from memory);
- another core's: 64 rows in shared memory that a child process keeps writing (copying
  a row into each in turn, as a producer writes its place), passed over in turn while it
  writes: the lines come from the other core's cache or the shared one, as a stager's do;

each by the row pass (check and hash, float32 rule) and by a plain memcpy (numpy
copyto into one row-sized buffer). The writer runs through every case, as producers run
beside a stager. And a producer's first write of its rows into a ring it has just mapped
(the half of each of 64 rows after its used part, as a row's padding is written), the
map included: with its pages faulted in one by one at their first touch, and with
shared/memory/ring.py's ROWS_MAP (MAP_POPULATE: every page mapped at once). Medians of
--rounds, microseconds a row.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ringfeed.shared.memory import _row_pass  # noqa: E402
from ringfeed.shared.memory.ring import ROWS_MAP  # noqa: E402
from ringfeed.shared.memory.row_pass import FLOAT32, FLOAT_LIMIT  # noqa: E402
from ringfeed.shared.memory.shm import SHM_DIR  # noqa: E402

ROW = 200 * 4 + 800 * 80 * 4
WARM_REPEATS = 500
SHARED_ROWS = 64


def keep_writing(name: str, source: np.ndarray, stop: mp.synchronize.Event) -> None:
    """The other core: copy `source` into each shared row in turn until stopped."""
    shm = SharedMemory(name)
    rows = np.ndarray((SHARED_ROWS, ROW), np.uint8, shm.buf)
    while not stop.is_set():
        for r in range(SHARED_ROWS):
            np.copyto(rows[r], source)
    del rows
    shm.close()


def first_writes(fd: int, flags: int) -> None:
    """The segment `fd` (SHARED_ROWS rows, every page reserved, as Ring.create leaves
    a ring) mapped anew with `flags`, as a producer attaches, and each row's second half
    written once."""
    mm = mmap.mmap(fd, SHARED_ROWS * ROW, flags, mmap.PROT_READ | mmap.PROT_WRITE)
    rows = np.ndarray((SHARED_ROWS, ROW), np.uint8, mm)
    rows[:, ROW // 2 :] = 0
    del rows
    mm.close()


def us_a_row(work: Callable[[], None], rows: int) -> float:
    t0 = time.perf_counter()
    work()
    return (time.perf_counter() - t0) / rows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    n = args.rows
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((n, ROW // 4)).astype(np.float32).view(np.uint8)
    which, used = np.arange(n, dtype=np.int64), np.full(n, ROW, np.int64)
    hashes, ok = np.empty(n, np.uint64), np.empty(n, np.bool_)
    dst = np.empty(ROW, np.uint8)
    one, one_which, one_used = rows[:1], which[:1], used[:1]

    def pass_cold() -> None:
        _row_pass.rows(rows, ROW, which, used, FLOAT32, FLOAT_LIMIT, hashes, ok)

    def pass_warm() -> None:
        for _ in range(WARM_REPEATS):
            _row_pass.rows(one, ROW, one_which, one_used, FLOAT32, FLOAT_LIMIT, hashes[:1], ok[:1])

    def copy_cold() -> None:
        for r in range(n):
            np.copyto(dst, rows[r])

    def copy_warm() -> None:
        for _ in range(WARM_REPEATS):
            np.copyto(dst, one[0])

    shm = SharedMemory(create=True, size=SHARED_ROWS * ROW)
    views = {"shared": np.ndarray((SHARED_ROWS, ROW), np.uint8, shm.buf)}  # cleared to close
    views["shared"][:] = rows[:SHARED_ROWS]
    s_which, s_used = which[:SHARED_ROWS], used[:SHARED_ROWS]
    s_hashes, s_ok = hashes[:SHARED_ROWS], ok[:SHARED_ROWS].copy()
    stop = mp.get_context("fork").Event()
    writer = mp.get_context("fork").Process(target=keep_writing, args=(shm.name, rows[1], stop))

    def pass_shared() -> None:
        shared = views["shared"]
        for _ in range(n // SHARED_ROWS):
            _row_pass.rows(shared, ROW, s_which, s_used, FLOAT32, FLOAT_LIMIT, s_hashes, s_ok)

    segment = SHM_DIR / f"row-pass-bench-{os.getpid()}"
    fd = os.open(segment, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.posix_fallocate(fd, 0, SHARED_ROWS * ROW)

    cases = {
        "row pass, warm (one row again)": (pass_warm, WARM_REPEATS),
        "row pass, cold (each row once)": (pass_cold, n),
        "row pass, another core's rows": (pass_shared, n // SHARED_ROWS * SHARED_ROWS),
        "memcpy, warm (one row again)": (copy_warm, WARM_REPEATS),
        "memcpy, cold (each row once)": (copy_cold, n),
        "first writes, pages as touched": (lambda: first_writes(fd, mmap.MAP_SHARED), SHARED_ROWS),
        "first writes, ring's ROWS_MAP": (lambda: first_writes(fd, ROWS_MAP), SHARED_ROWS),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    writer.start()
    try:
        for _ in range(args.rounds):  # the cases alternate: noise hits them alike
            for name, (work, count) in cases.items():
                times[name].append(us_a_row(work, count))
    finally:
        stop.set()
        writer.join()
        views.clear()
        shm.close()
        shm.unlink()
        os.close(fd)
        segment.unlink()
    assert ok.all()  # standard normal floats: every row passes
    print(f"median of {args.rounds} rounds, {ROW:,} bytes a row, {n:,} cold rows")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:34} {med:6.1f} us a row  ({ROW / med / 1e3:5.1f} GB/s)")


if __name__ == "__main__":
    main()
