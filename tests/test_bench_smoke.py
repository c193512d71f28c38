"""The benchmarks still run: smallest settings (~15 s)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_producer_cache_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/producer_cache.py", "--rounds", "1", "--passes", "1",
         "--seconds", "0.2", "--rss-passes", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "warm / cold" in out and "RSS growth over run" in out


@pytest.mark.slow
def test_first_batch_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/first_batch.py", "--rounds", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "first full batch (median of 1): cold cache" in out


@pytest.mark.slow
def test_length_manifest_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/buckets.py", "--manifest", "64"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "length manifest of 64 items, cold" in out and "current" in out


@pytest.mark.slow
def test_ring_throughput_benchmark_runs() -> None:
    """Every synthetic sample passes the stager's checks (no skip, no timeout)."""
    out = subprocess.run(
        [sys.executable, "benchmarks/ring_throughput.py", "--rounds", "1", "--seconds", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "ringfeed / pool" in out and "CPU per sample" in out


@pytest.mark.slow
def test_peers_benchmark_runs() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/peers.py", "--rounds", "1", "--clips", "48"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=True,
    ).stdout  # fmt: skip
    assert "| tfdata-ops |" in out and "| ringfeed-cached |" in out
