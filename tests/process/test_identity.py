"""Identities that travel (contract 12), through real processes: a producer whose copy
of the corpus lives elsewhere (another host's view) joins the stager's run, and a moved
corpus resumes its plan, nothing lost or repeated, every row checked against its item."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.scripts.runner import Run as Launcher
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import build_in_memory
from tests.support.absolute_corpus import make_absolute_corpus
from tests.support.checks import check_real_rows, expected_rows
from tests.support.configs import write_config
from tests.support.runs import Run, rid


@pytest.mark.slow
def test_a_producer_from_another_path_joins_and_a_moved_corpus_resumes(tmp_path: Path) -> None:
    """The stager reads the corpus here, the producers a copy elsewhere (another host's
    view): they join and every row is its item's. Then the corpus moves: a stager on the
    moved copy takes the first run's plan fingerprint and position and serves the rest
    of the plan, nothing lost or repeated."""
    raw = {
        "data": {"format": "jsonl"},
        "features": {"max_frames": 1000, "cache": False},
        "stager": {"batch_size": 2, "epochs": 2},
        "producers": {"workers": 1},
    }
    configs = {}
    for side in ("head", "elsewhere", "moved"):
        manifest = make_absolute_corpus(tmp_path / side, "jsonl")
        configs[side] = write_config(
            tmp_path, {**raw, "data": {**raw["data"], "path": str(manifest)}}, f"{side}.yaml"
        )
    cfg = load_config(configs["head"])
    expected, index = expected_rows(cfg), build_in_memory(cfg)
    run_id = rid()
    with Run(configs["head"], run_id, tmp_path) as run:
        run.start("stager")
        with Launcher(configs["elsewhere"], run_id, tmp_path) as producers:
            producers.prepare()  # a producer host prepares its own copy (validate --role producer)
            producers.start("producers")
            client = run.client()
            got, plan = [], dict(client.plan)
            for _ in range(4):
                batch = client.next(timeout_s=60)
                got += [r["item_id"] for r in check_real_rows(batch, index, expected)]
                client.free(batch)
            position, batch_index = client.position, client.batch_index
            client.close(finished=False)
    with Run(configs["moved"], run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(position=position, batch_index=batch_index, plan=plan)
        assert client.plan == plan  # the same plan: not refused, not a new one
        while (batch := client.next(timeout_s=60)) is not None:
            got += [r["item_id"] for r in check_real_rows(batch, index, expected)]
            client.free(batch)
    ids = [index.item_id(k) for k in range(index.n_items)]
    assert sorted(got) == sorted(ids * 2) and len(got) == 2 * len(ids)
