"""A resume against another plan, with real processes: a consumer's cursor of another
plan is refused or starts the next epoch; the real trainer refuses a changed seed unless
asked for a new plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.consumer.client.batch_client import BatchClient, StagerRefused
from ringfeed.shared.config import load_config
from ringfeed.shared.run.fingerprint import (
    plan_changes,
)
from tests.support.configs import SYNTHETIC, small, write_config
from tests.support.runs import Run, rid, started


@pytest.mark.slow
def test_a_resume_against_another_plan_is_refused_or_starts_the_next_epoch(
    tmp_path: Path,
) -> None:
    """A consumer resumes at a cursor of a run over 64 items against a stager whose
    dataset has 72: refused, naming the dataset index; asked for a new plan, it is
    welcomed at the start of the next epoch of the new plan."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = small(tmp_path / "a", items=64, stager={"batch_size": 8, "epochs": 3})
    with started(first, tmp_path) as (run, client):
        for _ in range(3):
            batch = client.next(timeout_s=30)
            client.free(batch)
        plan, at = dict(client.plan), (client.position, client.batch_index)
    assert set(plan) == {"index", "seed", "buckets", "lengths"} and at == (24, 3)
    second = small(tmp_path / "b", items=72, stager={"batch_size": 8, "epochs": 3})
    cfg = load_config(second)
    with Run(second, rid(), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        refused = BatchClient(cfg, run.run_id, "resumed", *at, plan=plan)
        with pytest.raises(StagerRefused, match=r"the plan changed .*\(dataset index\)"):
            refused.connect(timeout_s=30)
        refused.close(finished=False)
        renewed = BatchClient(cfg, run.run_id, "renewed", *at, plan=plan, new_plan_at=1)
        run.clients.append(renewed)
        renewed.connect(timeout_s=30)
        batch = renewed.next(timeout_s=30)
        logs = run.logs()
    assert batch.meta.first_epoch == 1 and batch.meta.next_position == 72 + 8
    assert batch.meta.batch_index == 3  # batches keep counting
    assert "the plan changed (dataset index); a new plan starts at epoch 1" in logs


@pytest.mark.slow
def test_the_trainer_refuses_a_resume_after_the_seed_changed_unless_new_plan(
    tmp_path: Path,
) -> None:
    """The real trainer: its checkpoint's cursor holds the plan; relaunched with another
    stager.seed it exits 2 naming the seed; with --new-plan it goes on at the next epoch."""
    raw = SYNTHETIC | {"train": {"steps": 8, "checkpoint_every": 4, "jit_compile": False}}
    first = write_config(tmp_path, raw)
    changed = write_config(
        tmp_path,
        raw | {"stager": {"batch_size": 4, "seed": 99}, "train": raw["train"] | {"steps": 12}},
        name="reseeded.yaml",
    )
    run_id = rid("seed")
    with Run(first, run_id, tmp_path) as run:
        run.start_all()
        assert run.wait_all() == {"stager": 0, "producers": 0, "trainer": 0}, run.logs()
        before = run.json("summary.json")["cursor"]
    with Run(changed, run_id, tmp_path) as run:
        run.start_all()
        assert run.wait("trainer") == 2, run.logs()
        assert "the plan changed since the consumer's checkpoint (seed)" in run.logs()
        run.start("trainer", "--new-plan")
        assert run.wait_all() == {"stager": 0, "producers": 0, "trainer": 0}, run.logs()
        after = run.json("summary.json")["cursor"]
    assert before["position"] == 32 and after["position"] == 32 + 4 * 4
    assert plan_changes(before["plan"], after["plan"]) == ["seed"]
