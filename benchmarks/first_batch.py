"""Time to the first batch: processes started as `ringfeed run` starts them, cold and warm.

    .venv/bin/python benchmarks/first_batch.py [--rounds 5]

Each round starts a stager and a producer pool (2 workers) with
scripts/runner.py's Run, exactly as `ringfeed run` (and so scripts/launch.sh)
does, on configs/demo.yaml's data (the 16 shipped clips, batch 8), and
measures in this process, the consumer, the seconds from starting the
processes to holding the first full batch: once with an empty feature cache
(cold: every sample decoded and turned into a mel) and once with the cache
the cold run filled (warm). The trainer's own start (TensorFlow import, XLA
compile) comes on top and is not the data path's: the trainer connects when it
is ready, and the batches are waiting for it. Medians over the rounds; the
rounds alternate cold and warm so machine noise hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.scripts.runner import Run  # noqa: E402
from ringfeed.shared.config import read_raw  # noqa: E402

TIMEOUT_S = 120.0


def first_batch_s(cache_dir: Path, tmp: Path) -> float:
    """Seconds from starting stager + producers to the first full batch here."""
    raw = read_raw(REPO / "configs" / "demo.yaml")
    raw["data"]["path"] = str(REPO / "data" / "ljspeech-mini")
    raw["features"] = {**raw.get("features", {}), "cache_dir": str(cache_dir)}
    raw["run_root"] = str(tmp / "runs")
    run_id = f"first-{uuid.uuid4().hex[:6]}"
    cfg_path = tmp / f"{run_id}.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    t0 = time.perf_counter()
    with Run(cfg_path, run_id, log_dir=tmp) as run:
        run.start("stager")
        run.start("producers")
        client = run.client("first-batch", timeout_s=TIMEOUT_S)
        batch = client.next(timeout_s=TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        assert batch is not None and batch.meta.n_valid == client.cfg.stager.batch_size
        client.free(batch)
        client.close(finished=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cold, warm = [], []
    with tempfile.TemporaryDirectory(prefix="first-batch-") as name:
        tmp = Path(name)
        for r in range(args.rounds):
            cache = tmp / f"cache-{r}"
            cold.append(first_batch_s(cache, tmp))
            warm.append(first_batch_s(cache, tmp))
            print(f"round {r + 1}: cold {cold[-1]:.2f} s, warm {warm[-1]:.2f} s", flush=True)
    print(
        f"\nfirst full batch (median of {args.rounds}): cold cache "
        f"{statistics.median(cold):.2f} s (target <= 2.5 s), warm cache "
        f"{statistics.median(warm):.2f} s (target <= 1.5 s)"
    )


if __name__ == "__main__":
    main()
