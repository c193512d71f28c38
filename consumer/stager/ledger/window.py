"""The plan's batches in order, as the slot ledger starts them.

A plan that cuts batches (consumer/stager/plan/plan.py ``batch_at``: a bucket's range of
positions, this worker's share of it) gives its own; one that cuts none, ranges of
``batch_rows`` positions of the fixed shape. Used by the ledger (table.py) and by the
tests that walk a plan's batches without a run (tests/support/plan_walk.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.plan.plan import Plan


@dataclass(frozen=True)
class Cut:
    """One batch as the plan cuts it: its bucket (-1: a plan that cuts none), the global
    range [first, end), its shape (rows, frames, text) and this worker's positions
    (int64 [n], in plan order)."""

    bucket: int
    first: int
    end: int
    shape: tuple[int, int, int]
    positions: np.ndarray


class PlanBatches:
    """The plan's batches in order from a position; next_start: where the next batch
    begins (the plan's end once there is none)."""

    def __init__(self, plan: Plan, start: int, batch_rows: int, shape: tuple[int, int, int]):
        self.plan, self.batch_rows, self.shape = plan, batch_rows, shape
        self.next_start = plan.next_owned(start)

    def ended(self) -> bool:
        return self.plan.end is not None and self.next_start >= self.plan.end

    def __next__(self) -> Cut:
        if self.ended():
            raise StopIteration
        plan, first = self.plan, self.next_start
        if plan.batched:
            bucket, first, end = plan.batch_at(first)
            shape = plan.buckets[bucket].shape
            k, n = plan.share.index, plan.share.count
            if n == 1:
                mine = np.arange(first, end, dtype=np.int64)
            elif end - first >= n:  # a worker's rows: every n-th from its own
                mine = np.arange(first + k, end, n, dtype=np.int64)
            else:  # too small to share: nobody's (Plan.owns)
                mine = np.zeros(0, np.int64)
        else:
            end = (
                first + self.batch_rows
                if plan.end is None
                else min(first + self.batch_rows, plan.end)
            )
            bucket, shape, mine = -1, self.shape, np.arange(first, end, dtype=np.int64)
        ended = plan.end is not None and end >= plan.end
        self.next_start = end if ended else plan.next_owned(end)
        return Cut(bucket, first, end, shape, mine)

    def __iter__(self) -> PlanBatches:
        return self
