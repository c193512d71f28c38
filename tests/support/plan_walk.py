"""Walking a plan as the stager's slot ledger cuts it into batches, without processes
(tests of shares and balanced plans), and the batches an uninterrupted run trains (the
reference of the resume tests)."""

from __future__ import annotations

import itertools
from pathlib import Path

from ringfeed.consumer.stager.ledger.window import PlanBatches
from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.formats import synthetic
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.share import Share


def batches(plan: Plan, start: int = 0) -> list[tuple[int, list[int]]]:
    """(bucket, positions) of every batch the ledger cuts from `start` (a consumer's
    cursor) to the plan's end (consumer/stager/ledger/window.py PlanBatches)."""
    cuts = PlanBatches(plan, start, 0, (0, 0, 0))
    return [(cut.bucket, cut.positions.tolist()) for cut in cuts]


Rows = list[tuple[int, int]]  # (item, its text length) of each row of a batch, sorted


def uninterrupted(config: Path, n: int, workers: int = 1) -> list[tuple[list[int], Rows]]:
    """The first n batches a run of config (synthetic items) trains when nothing stops
    it, as its stager cuts them from its plan (make_plan; with several workers, the
    first one's share of the global plan): (a worker's batch shape, the global batch's
    rows, each its item and that item's own text length) each, in trained()'s form."""
    cfg = load_config(config)
    assert cfg.data.format == "synthetic", "each row's text length is the synthetic item's"
    plan = make_plan(cfg, open_corpus(cfg), Share(0, workers))
    fixed = (cfg.stager.batch_size, cfg.features.max_frames, cfg.text.max_text_len)
    cuts = itertools.islice(PlanBatches(plan, 0, cfg.stager.batch_size, fixed), n)
    batches = []
    for cut in cuts:
        items = (plan.item_at(p) for p in range(cut.first, cut.end))
        batches.append((list(cut.shape), sorted((i, synthetic.lengths(i, cfg)[0]) for i in items)))
    return batches


def trained(records: list[dict[int, dict]], steps: int) -> list[tuple[list[int], Rows]]:
    """What steps 1..steps trained, from each worker's step -> batch record
    (train.log_batches): (the first worker's batch shape, the rows of all workers'
    parts, each its item and its text length as delivered)."""
    return [
        (
            list(records[0][s]["shape"]),
            sorted(
                pair for r in records for pair in zip(r[s]["items"], r[s]["text_lens"], strict=True)
            ),
        )
        for s in range(1, steps + 1)
    ]
