"""An epoch's layout: what a part of the plan gives it (consumer/stager/plan/).

The plan (plan.py) asks its part for one epoch's layout at a time and keeps a few;
positions, batches and shares are arithmetic on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ringfeed.consumer.stager.plan.buckets import Bucket

# Epochs whose layout the plan keeps at once, unless its part says fewer: the cursor's,
# the next one that grants run into, and those a restarted consumer may come back to.
KEPT_EPOCHS = 5
# ... but no more than this many bytes of orders beyond two epochs: a corpus of 10**7
# items keeps two (its cursor's and the next: 8 bytes a clip of int32 order; another is
# rebuilt when asked for, in about a second), a small one all five.
KEPT_BYTES = 2**26


@dataclass(frozen=True)
class EpochLayout:
    """One epoch. order: the items in plan order (int32 or int64 [n_items]; an item may
    appear more than once in a balanced epoch); starts: the offset of each batch's first
    position in the epoch (int64 [batches]); buckets: each batch's bucket index (int64
    [batches]). starts and buckets are None when the part cuts no batches: the stager
    then fills each batch with the next stager.batch_size samples that finish."""

    order: np.ndarray
    starts: np.ndarray | None = None
    buckets: np.ndarray | None = None


class EpochSource(Protocol):
    """A part that orders epochs (shuffle.py, shard_window.py, buckets.py, balance.py).
    n_items: positions per epoch; buckets: the shapes of the batches it cuts ([]: none);
    kept: epochs whose layout the plan keeps at once (memory: 4 to 8 bytes an item each)."""

    n_items: int
    buckets: Sequence[Bucket]
    kept: int

    def layout(self, epoch: int) -> EpochLayout: ...


def kept_epochs(source: EpochSource) -> int:
    """Epochs of `source` the plan keeps at once: source.kept, fewer for a large corpus
    (KEPT_BYTES), never fewer than two."""
    per_epoch = 4 * max(1, source.n_items)  # int32 orders (an int64 one at 2**31 items)
    return max(2, min(source.kept, KEPT_BYTES // per_epoch))
