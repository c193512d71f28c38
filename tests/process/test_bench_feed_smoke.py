"""benchmarks/feed.py runs end to end at its smallest settings (~30 s on 2 cores).

Three real training processes (ideal, tf.data, a ringfeed run) of 3 steps each
on tiny shapes: checks the benchmark still drives the trainer, the runner child
and the table, not the numbers.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO

SMOKE_TIMEOUT_S = 180.0


def test_feed_benchmark_smallest() -> None:
    args = ["--rounds", "1", "--steps", "2", "--warmup", "1", "--batch", "2"]
    done = subprocess.run(
        [sys.executable, "benchmarks/feed.py", *args, "--max-frames", "160"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for line in ("ideal ", "tfdata ", "ringfeed ", "ringfeed / ideal", "ringfeed / tfdata"):
        assert line in done.stdout, done.stdout
