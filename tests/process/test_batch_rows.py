"""Batches say which of their rows are real and where each sits in the plan (contract
12), from a real stager and producers: valid, items, position; a loop of one's own
resumes from a batch's positions exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import load_config
from tests.support.checks import consume
from tests.support.configs import SYNTHETIC, write_config
from tests.support.runs import Run, rid


@pytest.mark.slow
def test_a_loop_of_its_own_resumes_from_a_batchs_position_exactly(tmp_path: Path) -> None:
    """A consumer stops after five batches (no BYE: the run goes on); a new one started at
    the largest position it saw plus one gets exactly the batches an uninterrupted loop
    would have; every row of every batch is checked against its item, padding rows
    included (valid, position -1, the padding ids)."""
    n, epochs = 29, 2  # 58 positions in batches of 4: the plan's last batch has padding
    cfg_path = write_config(
        tmp_path,
        {
            **SYNTHETIC,
            "data": {"format": "synthetic", "synthetic_items": n},
            "stager": {"batch_size": 4, "epochs": epochs},
        },
    )
    cfg = load_config(cfg_path)
    plan = Plan(Shuffle(n, cfg.stager.seed), epochs)
    with Run(cfg_path, rid(), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        first, got, resume_at = run.client("first"), [], 0
        for _ in range(5):
            batch = first.next(timeout_s=60)
            got += check_synthetic_rows(batch.arrays, batch.meta.n_valid, cfg)
            resume_at = int(batch.arrays["position"].max()) + 1
            first.free(batch)
        first.close(finished=False)
        got += consume(run.client("second", position=resume_at, rejoin=True))
    assert resume_at == 20 and got == [plan.item_at(k) for k in range(n * epochs)]
