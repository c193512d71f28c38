"""A balanced plan across real training workers: killed on two, resumed on one, the global
batches are those of an uninterrupted run."""

from __future__ import annotations

import signal

import pytest

from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.id_tables import corpus_tables
from tests.support.configs import lopsided_config
from tests.support.runs import Run, batch_records, rid, shm_segments, workers


@pytest.mark.slow
def test_killed_on_two_workers_resumed_on_one_gives_the_uninterrupted_global_batches(
    tmp_path,
) -> None:
    config = lopsided_config(tmp_path)
    cfg = load_config(config)
    index = open_corpus(cfg)
    plan = make_plan(cfg, index)
    expected = {s: sorted(plan.item_at(p) for p in range(4 * (s - 1), 4 * s)) for s in range(1, 17)}
    base = rid("bal")
    (tmp_path / "two").mkdir()
    with workers(config, tmp_path / "two", base) as runs:  # killed mid-epoch 0
        chief = runs[0]
        chief.poll_for(
            lambda: (chief.dir / "checkpoints" / "checkpoint").exists(),
            what="the chief's first checkpoint",
        )
        for run in runs:
            run.signal("trainer", signal.SIGKILL)
        for run in runs:
            run.stop()
        before = [batch_records(run.dir / "batches.jsonl") for run in runs]
    with Run(config, base, tmp_path) as one:  # one worker takes up the chief's checkpoint
        one.start_all()
        assert one.wait_all(timeout_s=120) == {"stager": 0, "producers": 0, "trainer": 0}
        summary, after = one.json("summary.json"), batch_records(one.dir / "batches.jsonl")
        assert shm_segments(base) == []
    resumed = summary["steps"] - summary["steps_this_run"]
    assert summary["steps"] == 16 and 4 <= resumed < 16, one.logs()
    got = {}
    for step in range(1, 17):
        parts = [r[step] for r in before] if step <= resumed else [after[step]]
        if step <= resumed:  # rows 0, 2 on worker 0, rows 1, 3 on worker 1
            assert [len(part["items"]) for part in parts] == [2, 2]
        for part in parts:  # every row is the item it claims: its text has item + 1 letters
            assert part["text_lens"] == [item + 2 for item in part["items"]]  # + end token
        got[step] = sorted(item for part in parts for item in part["items"])
    assert got == expected
    tables = corpus_tables(cfg, index)
    speaker = tables.item_ids(index)[0]
    epoch_0 = [tables.speakers[speaker[i]] for s in range(1, 13) for i in got[s]]
    assert [epoch_0.count(name) for name in ("ann", "bob", "cy")] == [16, 16, 16]
