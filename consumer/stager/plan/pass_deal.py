"""Dealing a balanced epoch into batches pass by pass: no clip comes again early.

The balanced epoch (balance.py) gives group g a quota q_g of positions, walked as
passes over its n_g clips (each clip once a pass). Its clips arrive in due order
(the j-th of group g at (j + 1/2) / q_g, merged across groups) and
:class:`PassDealer` deals each into the open batch of its length bucket; a
bucket's batch leaves when it holds its rows, as BucketBatches deals a Shuffle's
order. Plain dealing lets a clip come a (k+1)-th time before its group's pass k
is out: a pass-k clip waits in the open batch of a slow bucket while pass k+1
fills a fast bucket's batch, which leaves first (111 such early repeats an epoch
at temperature 0 on the lopsided test corpus, tests/support/lopsided.py). So:

1. A clip whose group has another pass to come goes to the shortest bucket, from
   its own up, whose open batch is expected to leave before that pass starts (a
   shorter clip fits a longer bucket's row, as the epoch's leftovers do): its
   own, unless that bucket is slow (expected: its free rows over its clips per
   position, against the pass's turns left times the group's period n / q_g).
2. A clip of pass k + 1 whose group still has a clip of an earlier pass in
   another bucket's open batch (the expectation failed) gathers them: every clip
   of the group in open batches moves, with it, to the longest of their buckets,
   the earlier pass first, so they leave together in pass order.
3. Where a text would not fit that bucket, the group's clips wait until its
   earlier clips have left, and then go first.

So in delivery order no clip of a group comes a (k+1)-th time before every clip of
its group came k times, in every epoch (tests/unit/test_balance.py). What is
left at the end (less than a batch a bucket, and waiting clips) shares a few
part-filled batches: the open batches' clips longest bucket first, then the
waiting ones pass by pass, a shorter clip riding in a longer bucket's batch where
its text fits. A pure function of the arrivals, so of (seed, epoch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from ringfeed.consumer.stager.plan.buckets import Bucket
from ringfeed.consumer.stager.plan.layout import EpochLayout

# Arrivals converted to Python objects at once (a few tens of MB).
CHUNK = 2**18

Clip = tuple[int, int, int]  # (item, group, pass)


class PassDealer:
    """Deals a balanced epoch's arrivals into batches (module docstring): call
    :meth:`deal_all` once, then :meth:`layout`. rate: each bucket's clips per
    position of the epoch (rule 1's expectation)."""

    def __init__(self, buckets: Sequence[Bucket], text: np.ndarray, rate: Sequence[float],
                 n_groups: int) -> None:  # fmt: skip
        self.rows = [b.rows for b in buckets]
        self.texts = [b.text for b in buckets]
        self.text, self.rate = text, list(rate)
        self.open: list[list[Clip]] = [[] for _ in buckets]
        # per group: {(pass, bucket): its clips in open batches}
        self.pending: list[dict[tuple[int, int], int]] = [{} for _ in range(n_groups)]
        self.waiting: dict[int, deque[tuple[int, int, int]]] = {}  # group: (item, pass, bucket)
        self.released: list[int] = []
        self.order: list[int] = []
        self.starts: list[int] = []
        self.kinds: list[int] = []

    def deal_all(self, item, group, pas, bucket, horizon) -> None:
        """Every arrival, in due order (arrays of one length): its item, group, pass,
        bucket, and positions until its group's next pass (< 0: none comes)."""
        for lo in range(0, len(item), CHUNK):
            hi = lo + CHUNK
            for i, g, k, b, h in zip(item[lo:hi].tolist(), group[lo:hi].tolist(),
                                     pas[lo:hi].tolist(), bucket[lo:hi].tolist(),
                                     horizon[lo:hi].tolist(), strict=True):  # fmt: skip
                if h >= 0:
                    b = self._soon_out(i, b, h)
                if g in self.waiting or not self._deal(i, g, k, b):
                    self.waiting.setdefault(g, deque()).append((i, k, b))
                while self.released:
                    self._release(self.released.pop())

    def _soon_out(self, item: int, b: int, horizon: float) -> int:
        """Rule 1: the shortest bucket from b up whose open batch is expected to leave
        within `horizon` positions and whose text fits the item (b where none is)."""
        for c in range(b, len(self.rows)):
            if self.text[item] <= self.texts[c]:
                if self.rows[c] - len(self.open[c]) - 1 <= horizon * self.rate[c]:
                    return c
        return b

    def _deal(self, item: int, g: int, k: int, b: int) -> bool:
        """Deal one clip; False where it has to wait (rule 3)."""
        if any(p < k and c != b for p, c in self.pending[g]):
            b = self._gather(g, item, b)
            if b < 0:
                return False
        self.open[b].append((item, g, k))
        pend = self.pending[g]
        pend[k, b] = pend.get((k, b), 0) + 1
        if len(self.open[b]) >= self.rows[b]:
            self._emit(b)
        return True

    def _gather(self, g: int, item: int, b: int) -> int:
        """Rule 2: the bucket that takes `item` (dealt to b) and every clip of g in open
        batches, the longest of theirs, where they now are; -1 where a text would not
        fit there."""
        moving = {c for _, c in self.pending[g]}
        top = max(moving | {b})
        mine = [clip for c in moving for clip in self.open[c] if clip[1] == g]
        if max(self.text[i] for i in [item] + [clip[0] for clip in mine]) > self.texts[top]:
            return -1
        for c in moving:
            self.open[c] = [clip for clip in self.open[c] if clip[1] != g]
        self.open[top] += sorted(mine, key=lambda clip: clip[2])
        counts: dict[tuple[int, int], int] = {}
        for _, _, k in mine:
            counts[k, top] = counts.get((k, top), 0) + 1
        self.pending[g] = counts
        while len(self.open[top]) >= self.rows[top]:
            self._emit(top)
        return top

    def _emit(self, b: int) -> None:
        """Out goes bucket b's batch: the first rows clips of its open batch (a gathering
        can leave more there; they wait for the next)."""
        rows = self.rows[b]
        batch, self.open[b] = self.open[b][:rows], self.open[b][rows:]
        self.starts.append(len(self.order))
        self.kinds.append(b)
        for item, g, k in batch:
            self.order.append(item)
            pend = self.pending[g]
            pend[k, b] -= 1
            if not pend[k, b]:
                del pend[k, b]
                if g in self.waiting:
                    self.released.append(g)

    def _release(self, g: int) -> None:
        """Deal g's waiting clips up to the first that still has to wait."""
        queue = self.waiting.get(g)
        while queue:
            item, k, b = queue[0]
            if not self._deal(item, g, k, b):
                return
            queue.popleft()
        self.waiting.pop(g, None)

    def layout(self) -> EpochLayout:
        """The epoch: the full batches as they left, then the part-filled ones."""
        rest = [(i, b) for b in reversed(range(len(self.open))) for i, _, _ in self.open[b]]
        late = []
        for queue in self.waiting.values():  # their earlier clips are in `rest`
            first = queue[0][1]
            late += [(k - first, -b, i) for i, k, b in queue]
        late.sort(key=lambda clip: clip[:2])  # pass by pass, longest first; stable
        rest += [(i, -minus_b) for _, minus_b, i in late]
        room, shape = 0, -1
        for item, b in rest:
            if not room or b > shape or self.text[item] > self.texts[shape]:
                self.starts.append(len(self.order))
                self.kinds.append(b)
                room, shape = self.rows[b], b
            self.order.append(item)
            room -= 1
        return EpochLayout(np.array(self.order, np.int32), np.array(self.starts, np.int64),
                           np.array(self.kinds, np.int64))  # fmt: skip
