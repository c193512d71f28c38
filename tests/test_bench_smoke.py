"""benchmarks/producer_cache.py still runs: smallest settings, no stager run (~10 s)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_producer_cache_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/producer_cache.py", "--rounds", "1", "--passes", "1",
         "--seconds", "0.2", "--rss-passes", "2", "--no-run"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "warm / cold" in out and "RSS growth over run" in out
