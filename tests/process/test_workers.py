"""Two training workers on this host (MultiWorkerMirroredStrategy over localhost),
each with its own stager and producers serving its share of one global plan.

Every step both workers train their part of the same global batch, of the same
bucket; an epoch's items are trained once, less the stated remainder; a worker
SIGKILLed mid-run makes the other exit non-zero within train.collective_timeout_s,
and relaunching both gives the batches of an uninterrupted run: the plan's global
batches, in order (tests/support/plan_walk.py uninterrupted: the stager's own plan
is the reference, where a third whole run of two workers cost a minute of the suite).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.stager.plan.buckets import Bucket, BucketBatches
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.shared.config import Config, load_config
from ringfeed.shared.run.share import Share
from tests.support.configs import BUCKETS, SYNTHETIC, write_config
from tests.support.fault_sources import inject_faults
from tests.support.plan_walk import trained, uninterrupted
from tests.support.runs import Run, batch_records, rid, shm_segments, workers

pytestmark = pytest.mark.slow

STEPS = 12
TIMEOUT_S = 8.0  # train.collective_timeout_s here


def two_worker_config(tmp_path: Path, lengths: str) -> Path:
    """Buckets: BUCKETS; fixed: SYNTHETIC, with worker 0's part of global batch 1 (two
    items) failing in producers, so that worker's batch 1 is empty and must still go."""
    over = BUCKETS if lengths == "buckets" else {"data": SYNTHETIC["data"]}
    train = {
        "steps": STEPS,
        "checkpoint_every": 4,
        "log_every": 4,
        "jit_compile": False,
        "log_batches": True,
        "cpu_threads": 1,
        "collective_timeout_s": TIMEOUT_S,
    }
    raw = SYNTHETIC | over | {"train": train, "producers": {"workers": 1}}
    config = write_config(tmp_path, raw)
    bad = [] if lengths == "buckets" else first_part_of_worker_0(load_config(config))
    inject_faults(config, delay_s=0.01, raise_items=bad)
    return config


def first_part_of_worker_0(cfg: Config) -> list[int]:
    n = cfg.data.synthetic_items
    fixed = [Bucket(32, 32, cfg.stager.batch_size)]
    share = Plan(BucketBatches(Shuffle(n, cfg.stager.seed), fixed, np.zeros(n)), share=Share(0, 2))
    first = share.next_owned(0)
    return [share.item_at(first), share.item_at(share.next_owned(first + 1))]


def finished(runs: list[Run]) -> list[dict[int, dict]]:
    for run in runs:
        codes = run.wait_all(timeout_s=180)
        assert codes == {"stager": 0, "producers": 0, "trainer": 0}, run.logs()
        assert shm_segments(run.run_id) == []
    return [batch_records(run.dir / "batches.jsonl") for run in runs]


def check_lockstep(records: list[dict[int, dict]], n_items: int) -> None:
    """Same steps, disjoint parts of one global batch each step, and epoch 0's items
    trained once each, less the global batches too small for both workers."""
    assert sorted(records[0]) == sorted(records[1]) == list(range(1, STEPS + 1))
    seen: list[int] = []
    for step in range(1, STEPS + 1):
        a, b = records[0][step], records[1][step]
        assert a["batch_index"] == b["batch_index"]
        assert a["shape"][1:] == b["shape"][1:], "one bucket per step on every worker"
        assert not set(a["items"]) & set(b["items"])
        if a["epochs"] == b["epochs"] == [0, 0]:
            seen += a["items"] + b["items"]
    assert len(seen) == len(set(seen)) and n_items - 8 < len(seen) <= n_items


@pytest.mark.parametrize("lengths", ["fixed", "buckets"])
def test_two_workers_train_disjoint_shares_in_lockstep(tmp_path: Path, lengths: str) -> None:
    config = two_worker_config(tmp_path, lengths)
    if lengths == "fixed":
        with workers(config, tmp_path, rid("mw")) as runs:
            records = finished(runs)
            summary = runs[0].json("summary.json")
    else:  # the steps before a SIGKILL, and those of the relaunch that resumed them
        records, summary = killed_and_relaunched(config, tmp_path)
    assert (summary["replicas"], summary["workers"]) == (2, 2)
    n_items = (BUCKETS if lengths == "buckets" else SYNTHETIC)["data"]["synthetic_items"]
    check_lockstep(records, n_items)
    if lengths == "fixed":  # worker 0's part of batch 1 was skipped: an empty batch went
        assert records[0][1]["items"] == [] and len(records[1][1]["items"]) == 2
    else:  # the uninterrupted run's batches: the plan's, each in its bucket's shape
        steps = trained(records, STEPS)
        assert steps == uninterrupted(config, STEPS, workers=2)
        assert len({tuple(shape) for shape, _ in steps}) > 1, "several buckets"


def killed_and_relaunched(config: Path, tmp_path: Path) -> tuple[list[dict[int, dict]], dict]:
    """Both workers' step -> batch record (the last written: the relaunch's from its
    checkpoint on) and the relaunched chief's summary."""
    base = rid("mwk")
    # Slower samples (same batches): the kill must land while both still train.
    inject_faults(config, delay_s=0.15)
    (tmp_path / "killed").mkdir()
    with workers(config, tmp_path / "killed", base) as runs:
        chief = runs[0]
        chief.poll_for(
            lambda: (chief.dir / "checkpoints" / "checkpoint").exists(),
            what="the chief's first checkpoint",
        )
        runs[1].signal("trainer", signal.SIGKILL)
        t0 = time.monotonic()
        code = chief.wait("trainer", TIMEOUT_S + 30)
        assert code != 0, chief.logs()
        print(f"the chief's trainer exited {code} {time.monotonic() - t0:.1f} s after the kill")
        for run in runs:
            run.stop()
    inject_faults(config, delay_s=0.01)  # the relaunch needs no time to aim a kill
    with workers(config, tmp_path, base) as runs:
        got = finished(runs)
        summary = runs[0].json("summary.json")
    assert summary["steps_this_run"] < STEPS, "the relaunch should have resumed"
    return got, summary
