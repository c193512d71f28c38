"""The benchmarks still run: smallest settings (~15 s)."""

import subprocess
import sys

import pytest

from tests.support.paths import REPO


def bench(args: list[str], timeout_s: float) -> str:
    """A benchmark's stdout, run as docs/benchmarks.md says (from the repo root); fails on error."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return done.stdout


@pytest.mark.slow
def test_producer_cache_benchmark_runs() -> None:
    args = [
        "benchmarks/producer_cache.py",
        "--rounds",
        "1",
        "--passes",
        "1",
        "--seconds",
        "0.2",
        "--rss-passes",
        "2",
    ]
    out = bench(args, timeout_s=60)
    assert "warm / cold" in out and "RSS growth over run" in out


@pytest.mark.slow
def test_first_batch_benchmark_runs() -> None:
    out = bench(["benchmarks/first_batch.py", "--rounds", "1"], timeout_s=120)
    assert "first full batch, median of 1:" in out and "warm cache" in out
    assert "CPU s by then: producers" in out and "stager" in out


@pytest.mark.slow
def test_length_table_benchmark_runs() -> None:
    out = bench(["benchmarks/buckets.py", "--lengths", "64"], timeout_s=60)
    assert "length table of 64 items, cold" in out and "current" in out


@pytest.mark.slow
def test_ring_throughput_benchmark_runs() -> None:
    """Every synthetic sample passes the stager's checks (no skip, no timeout)."""
    out = bench(
        ["benchmarks/ring_throughput.py", "--rounds", "1", "--seconds", "0.5"], timeout_s=120
    )
    assert "ringfeed / pool" in out and "CPU per sample" in out


@pytest.mark.slow
def test_peers_benchmark_runs() -> None:
    """Every pipeline runs, the cached peer reads the very mels ringfeed's cache holds,
    and --stages breaks the CPU down by process and by stage."""
    out = bench(
        ["benchmarks/peers.py", "--rounds", "1", "--clips", "48", "--stages"], timeout_s=300
    )
    assert "| tfdata-ops |" in out and "| ringfeed-cached |" in out and "| tfdata-cached |" in out
    assert "tfdata-cached rows are the cached mels: True" in out
    assert "| CPU ms/sample by process |" in out and "| STFT |X| |" in out


@pytest.mark.slow
def test_text_cost_benchmark_runs() -> None:
    out = bench(["benchmarks/text_cost.py", "--rounds", "1", "--texts", "8"], timeout_s=120)
    assert "| phonemes |" in out and "once per process" in out


@pytest.mark.slow
def test_sample_fields_benchmark_runs() -> None:
    out = bench(["benchmarks/sample_fields.py", "--rounds", "1", "--passes", "1"], timeout_s=120)
    assert "all three, cached" in out and "batch B/sample" in out


@pytest.mark.slow
def test_balance_benchmark_runs() -> None:
    out = bench(["benchmarks/balance.py", "--build", "20000", "--rounds", "1"], timeout_s=60)
    assert "by language (3 groups), 20,000 items: build" in out and "kept" in out
    assert "plain buckets (BucketBatches), 20,000 items: build" in out


@pytest.mark.slow
def test_scale_benchmark_runs() -> None:
    """The corpus-index benchmark on 20,000 generated entries (docs/benchmarks.md: 10,000,000)."""
    out = bench(["benchmarks/scale.py", "--items", "20000", "--rounds", "1"], timeout_s=120)
    assert "entries/s" in out and "warm reuse" in out and "above an empty run" in out


@pytest.mark.slow
def test_gpu_feed_benchmark_runs_on_the_cpu(tmp_path) -> None:
    """benchmarks/gpu_feed.py at --quick on the CPU, for each framework installed: every
    feed at one size (the pinned ring and the staging copy side by side: on the CPU
    neither ring is pinned), a figure each, and the tables the GPU run writes to $OUT."""
    import importlib.util
    import json

    frameworks = [f for f in ("torch", "jax") if importlib.util.find_spec(f) is not None]
    if not frameworks:
        pytest.skip("neither torch nor jax is installed")
    out = bench(
        [
            "benchmarks/gpu_feed.py",
            "--quick",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--frameworks",
            ",".join(frameworks),
        ],
        timeout_s=300,
    )
    lines = (tmp_path / "gpu_feed.jsonl").read_text().splitlines()
    figures = [json.loads(line) for line in lines]
    feeds = {(f["framework"], f["feed"]) for f in figures}
    every = ("ideal", "ringfeed", "ringfeed-staged", "dataloader")
    assert feeds == {(fw, feed) for fw in frameworks for feed in every}
    assert all(f["steps"] >= 5 and 0 <= f["wait_share"] < 1 for f in figures), figures
    assert not any(f["ring_pinned"] for f in figures), "nothing is pinned on the CPU"
    assert "| feed | steps/s | of ideal | data wait | step CV | GPU util |" in out
    assert "| pinned ring steps/s | staging copy steps/s | ratio |" in out
    assert sum(line.endswith("| no |") for line in out.splitlines()) == len(frameworks)


@pytest.mark.slow
def test_scaling_benchmark_runs(tmp_path) -> None:
    """benchmarks/scaling.py at --quick: both feeds at 1 and 2 workers, and the table."""
    import importlib.util
    import json

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the DataLoader feed needs it")
    out = bench(["benchmarks/scaling.py", "--quick", "--out", str(tmp_path)], timeout_s=240)
    figures = [json.loads(line) for line in (tmp_path / "scaling.jsonl").read_text().splitlines()]
    assert {(f["workers"], f["feed"]) for f in figures} == {
        (w, feed) for w in (1, 2) for feed in ("ringfeed", "dataloader")
    }
    assert all(f["samples_per_s"] > 0 for f in figures), figures
    assert "| workers | ringfeed samples/s | DataLoader samples/s | ratio |" in out
