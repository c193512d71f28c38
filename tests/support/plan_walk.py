"""Walking a plan as the stager's slot ledger cuts it into batches, without processes
(tests of shares and balanced plans)."""

from __future__ import annotations

from ringfeed.consumer.stager.ledger import PlanBatches
from ringfeed.consumer.stager.plan.plan import Plan


def batches(plan: Plan, start: int = 0) -> list[tuple[int, list[int]]]:
    """(bucket, positions) of every batch the ledger cuts from `start` (a consumer's
    cursor) to the plan's end (consumer/stager/ledger.py PlanBatches)."""
    return [(cut.bucket, cut.positions) for cut in PlanBatches(plan, start, 0, (0, 0, 0))]
