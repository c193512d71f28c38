"""Time to the first batch: processes started as `ringfeed run` starts them, cold and warm.

    .venv/bin/python benchmarks/first_batch.py [--rounds 5] [--baseline DIR]

Each round starts a stager and a producer pool (2 workers) with
scripts/runner.py's Run, exactly as `ringfeed run` (and so scripts/launch.sh)
does, on configs/demo.yaml's data (the 16 shipped clips, batch 8), and
measures in this process, the consumer, the seconds from starting the
processes to holding the first full batch: once with an empty feature cache
(cold: every sample decoded and turned into a mel) and once with the cache
the cold run filled (warm). The trainer's own start (TensorFlow import, XLA
compile) comes on top and is not the data path's: the trainer connects when it
is ready, and the batches are waiting for it. Medians over the rounds; the
rounds alternate cold and warm so machine noise hits them alike. Beside each
median, the CPU seconds each process had used when the first batch arrived
(benchmarks/cpu_meter.py: the stager, the producer pool with its workers, this
process from its start of the clock): where the time goes. With ``--baseline DIR``
(a checkout of other code) each round also runs DIR's first_batch.py for one
round, in a process of its own, after this checkout's.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from cpu_meter import CpuMeter, cpu_s

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.scripts.runner import Run  # noqa: E402
from ringfeed.shared.config import read_raw  # noqa: E402

TIMEOUT_S = 120.0


def first_batch_s(cache_dir: Path, tmp: Path) -> tuple[float, dict[str, float]]:
    """(seconds from starting stager + producers to the first full batch here, CPU
    seconds each process had used by then)."""
    raw = read_raw(REPO / "configs" / "demo.yaml")
    raw["data"]["path"] = str(REPO / "data" / "ljspeech-mini")
    raw["features"] = {**raw.get("features", {}), "cache_dir": str(cache_dir)}
    raw["run_root"] = str(tmp / "runs")
    run_id = f"first-{uuid.uuid4().hex[:6]}"
    cfg_path = tmp / f"{run_id}.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    t0, cpu0 = time.perf_counter(), cpu_s(os.getpid())
    with Run(cfg_path, run_id, log_dir=tmp) as run:
        run.start("stager")
        run.start("producers")
        client = run.client("first-batch", timeout_s=TIMEOUT_S)
        batch = client.next(timeout_s=TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        cpu = CpuMeter().totals_s()
        cpu["this process"] -= cpu0
        assert batch is not None and batch.meta.n_valid == client.cfg.stager.batch_size
        client.free(batch)
        client.close(finished=True)
    return elapsed, cpu


def baseline_round(repo: Path) -> tuple[float, float]:
    """(cold, warm) seconds of one round of `repo`'s own first_batch.py, in its directory."""
    env = os.environ | {"PYTHONPATH": str(repo)}
    out = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "first_batch.py"), "--rounds", "1"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * TIMEOUT_S,
        check=True,
    ).stdout
    found = re.search(r"cold ([\d.]+) s, warm ([\d.]+) s", out)
    if found is None:
        raise RuntimeError(f"{repo}: no round in its output:\n{out[-2000:]}")
    return float(found[1]), float(found[2])


def show(name: str, seconds: list[float], cpus: list[dict[str, float]]) -> str:
    """'NAME median s (CPU s to it: role x, ...)'."""
    roles = sorted({r for c in cpus for r in c})
    cpu = ", ".join(f"{r} {statistics.median(c.get(r, 0.0) for c in cpus):.2f}" for r in roles)
    shown = f"{name} {statistics.median(seconds):.2f} s"
    return shown + (f" (CPU s by then: {cpu})" if cpu else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="a checkout whose first_batch.py to run alongside")
    args = parser.parse_args()
    runs: dict[str, list] = {"cold": [], "warm": [], "base cold": [], "base warm": []}
    with tempfile.TemporaryDirectory(prefix="first-batch-") as name:
        tmp = Path(name)
        for r in range(args.rounds):
            cache = tmp / f"cache-{r}"
            runs["cold"].append(first_batch_s(cache, tmp))
            runs["warm"].append(first_batch_s(cache, tmp))
            cold_s, warm_s = runs["cold"][-1][0], runs["warm"][-1][0]
            line = f"round {r + 1}: cold {cold_s:.2f} s, warm {warm_s:.2f} s"
            if args.baseline:
                cold, warm = baseline_round(Path(args.baseline))
                runs["base cold"].append((cold, {}))
                runs["base warm"].append((warm, {}))
                line += f"; baseline cold {cold:.2f} s, warm {warm:.2f} s"
            print(line, flush=True)
    print(f"\nfirst full batch, median of {args.rounds}:")
    for key, label in (
        ("cold", "cold cache"),
        ("warm", "warm cache"),
        ("base cold", "baseline, cold cache"),
        ("base warm", "baseline, warm cache"),
    ):
        if runs[key]:
            print("  " + show(label, [s for s, _ in runs[key]], [c for _, c in runs[key]]))


if __name__ == "__main__":
    main()
