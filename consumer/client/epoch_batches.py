"""How many batches a training worker gets in an epoch: what `len(loader)` says.

The client makes the stager's plan itself (consumer/stager/plan/make.py: a pure
function of the config, the prepared corpus and the worker's share, the same one the
stager makes) and counts, in epoch e:

- a plan that cuts batches (length buckets, balance, several workers): the epoch's
  global batches (EpochLayout.starts); with several workers each sends one batch per
  global batch, an empty one too (Plan.lockstep), so each worker counts them all;
- a plain plan: batch k holds positions [kB, (k + 1) B), so the batches that begin in
  the epoch, ceil((e + 1) N / B) - ceil(e N / B); a batch across the epoch's end
  belongs to the epoch of its first row, as the loader's passes do.

A batch whose every row was skipped is still a batch here; the stager leaves none out
of a plan that cuts batches, and in a plain plan an item skipped leaves its batch one
row short. So the count is exact but for a plain batch of skips only.

The plan is made once per loader, on the first len(): about as long as the stager's
own (0.5 s for a balanced plan of a million clips, numba's kernels compiled at setup).
"""

from __future__ import annotations

from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.shared.config import Config
from ringfeed.shared.run.share import Share


def worker_plan(cfg: Config, share: Share) -> Plan:
    """The plan the stager of this worker holds (the corpus must be prepared)."""
    from ringfeed.consumer.stager.plan.make import make_plan
    from ringfeed.shared.corpus.open import open_prepared

    return make_plan(cfg, open_prepared(cfg), share)


def batches_in_epoch(plan: Plan, batch_size: int, epoch: int) -> int:
    """This worker's batches in `epoch` of `plan` (0 past a finite plan's end)."""
    if plan.epochs and epoch >= plan.epochs:
        return 0
    n = plan.n_items
    if plan.batched:
        return len(plan.layout(epoch).starts)
    return -(-(epoch + 1) * n // batch_size) - -(-epoch * n // batch_size)
