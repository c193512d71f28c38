"""Dealing a balanced epoch into batches pass by pass: no clip comes again early.

The balanced epoch (balance.py) gives group g a quota q_g of positions, walked as
passes over its n_g clips (each clip once a pass). Its clips arrive in due order
(the j-th of group g at (j + 1/2) / q_g, merged across groups) and are dealt into
the open batch of their length bucket; a bucket's batch leaves when it holds its
rows, as BucketBatches deals a Shuffle's order. Plain dealing lets a clip come a
(k+1)-th time before its group's pass k is out: a pass-k clip waits in the open
batch of a slow bucket while pass k+1 fills a fast bucket's batch, which leaves
first (111 such early repeats an epoch at temperature 0 on the lopsided test
corpus, tests/support/lopsided.py). So:

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

The dealing is one pass over the epoch with state, so it is compiled (numba, which
librosa brings): 10,000,000 clips took 20 s as a Python loop, under a second so
(docs/benchmarks.md#balanced-epochs). The state: each bucket's open batch (at most
twice the rows of all buckets: a gathering adds at most what the others hold),
per group and bucket its clips in open batches and those of them of an earlier
pass than its newest, and per group a queue of waiting clips.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from ringfeed.consumer.stager.plan.buckets import Bucket
from ringfeed.consumer.stager.plan.layout import EpochLayout

# Waiting clips (rule 3) the queue holds before it grows (it doubles).
WAITING = 1024
# Counters in `meta`: clips out, batches out, groups released; a clip _run hands back
# (-1: none) and its bucket by rule 1.
OUT, BATCHES, RELEASED, CLIP, CLIP_BUCKET = 0, 1, 2, 3, 4
# The state, in a few arrays passed to every step (numba: a tuple of arrays costs a
# reference count per use, 20x the dealing itself):
#   o     int32 [buckets, room, 3]: each open batch's clips (item, group, pass)
#   fill  int64 [buckets]: clips in each open batch
#   po    int64 [2, groups, buckets]: a group's clips in open batches; those of them of
#         a pass before its newest
#   an    int64 [2, groups]: the latter's sum; the newest pass dealt
#   out   int32 [n]: the full batches' items in order; sk int64 [2, batches]: their
#         first positions and buckets
#   rel   int64 [2, groups]: groups whose waiting clips may go now (a stack), and a flag
#   meta  int64 [5]: OUT, BATCHES, RELEASED, CLIP, CLIP_BUCKET


def deal(
    buckets: Sequence[Bucket],
    text: np.ndarray,
    rate: np.ndarray,
    n_groups: int,
    item: np.ndarray,
    group: np.ndarray,
    pas: np.ndarray,
    bucket: np.ndarray,
    horizon: np.ndarray,
) -> EpochLayout:
    """The epoch's batches. rate: each bucket's clips per position (rule 1's
    expectation); the arrivals, in due order (arrays of one length): each clip's
    item, group, pass, bucket and positions until its group's next pass (< 0: none
    comes)."""
    rows = np.array([b.rows for b in buckets], np.int64)
    texts = np.array([b.text for b in buckets], np.int64)
    out, starts, kinds, o, fill, w, wq = _deal(
        item,
        group,
        pas,
        bucket,
        horizon,
        rows,
        texts,  # integer arrays of any width
        np.ascontiguousarray(text, np.int32),
        np.asarray(rate, np.float64),
        n_groups,
    )
    opened = [o[b, : fill[b], 0] for b in range(len(rows))]
    waiting = []
    for head in wq[0]:
        queue, e = [], int(head)
        while e >= 0:
            queue.append(w[e, :3])
            e = int(w[e, 3])
        waiting.append(np.array(queue, np.int64).reshape(-1, 3))
    rest = [(int(i), b) for b in reversed(range(len(rows))) for i in opened[b]]
    late = []  # rule 3's clips: their earlier clips are in `rest`
    for queue in waiting:
        if len(queue):
            first = int(queue[0, 1])
            late += [(int(k) - first, -int(b), int(i)) for i, k, b in queue]
    late.sort(key=lambda clip: clip[:2])  # pass by pass, longest first; stable
    rest += [(i, -minus_b) for _, minus_b, i in late]
    tail_starts, tail_kinds, room, shape = [], [], 0, -1
    for k, (i, b) in enumerate(rest):
        if not room or b > shape or text[i] > texts[shape]:
            tail_starts.append(len(out) + k)
            tail_kinds.append(b)
            room, shape = int(rows[b]), b
        room -= 1
    order = np.concatenate([out, np.array([i for i, _ in rest], np.int32)])
    return EpochLayout(
        order,
        np.concatenate([starts, np.array(tail_starts, np.int64)]),
        np.concatenate([kinds, np.array(tail_kinds, np.int64)]),
    )


@numba.njit(cache=True)
def _deal(item, group, pas, bucket, horizon, rows, texts, text, rate, n_groups):  # noqa: PLR0913
    """(out int32: the full batches' items in order; starts, kinds int64: each one's
    first position and bucket; the open batches' items per bucket; per group its
    waiting clips int64 [m, 3]: item, pass, bucket). The clips that need more than
    rule 1 (a gathering, a wait) come back here from _run, one at a time."""
    n_buckets, n = len(rows), len(item)
    o = np.empty((n_buckets, 2 * rows.sum() + 2, 3), np.int32)
    fill = np.zeros(n_buckets, np.int64)
    po = np.zeros((2, n_groups, n_buckets), np.int64)
    an = np.zeros((2, n_groups), np.int64)
    an[1, :] = -1
    out = np.empty(n, np.int32)
    sk = np.empty((2, n // rows.min() + 2), np.int64)
    rel = np.zeros((2, n_groups), np.int64)
    meta = np.zeros(5, np.int64)
    meta[CLIP] = -1
    st = (o, fill, po, an, out, sk, rel, meta)
    w, wq, used, i = np.empty((WAITING, 4), np.int64), np.full((2, n_groups), -1, np.int64), 0, 0
    while i < n or meta[CLIP] >= 0 or meta[RELEASED]:
        i = _run(i, item, group, pas, bucket, horizon, rows, texts, text, rate, st, wq)
        c = meta[CLIP]
        if c >= 0:
            meta[CLIP] = -1
            g, it, k, b = np.int64(group[c]), np.int64(item[c]), np.int64(pas[c]), meta[CLIP_BUCKET]
            if wq[0, g] >= 0 or not _deal_one(st, wq, g, it, k, b, rows, texts, text):
                w = _wait(w, wq, used, g, it, k, b)
                used += 1
        while meta[RELEASED]:  # rule 3: the waiting clips of groups whose earlier left
            meta[RELEASED] -= 1
            h = rel[0, meta[RELEASED]]
            rel[1, h] = 0
            while wq[0, h] >= 0 and _deal_one(
                st, wq, h, w[wq[0, h], 0], w[wq[0, h], 1], w[wq[0, h], 2], rows, texts, text
            ):
                wq[0, h] = w[wq[0, h], 3]
            if wq[0, h] < 0:
                wq[1, h] = -1
    return out[: meta[OUT]], sk[0, : meta[BATCHES]], sk[1, : meta[BATCHES]], o, fill, w, wq


@numba.njit(cache=True)
def _run(start, item, group, pas, bucket, horizon, rows, texts, text, rate, st, wq):  # noqa: PLR0913
    """Deal clips from start on while only rule 1 is needed (numba: a call per clip costs 5x
    the dealing, so this is one loop); the index to go on from, with meta[CLIP] set to a
    clip that needs more (and meta[CLIP_BUCKET] to its bucket by rule 1), or groups
    released (meta[RELEASED])."""
    o, fill, po, an, out, sk, rel, meta = st
    for i in range(start, len(item)):
        g, it, k, b = np.int64(group[i]), np.int64(item[i]), np.int64(pas[i]), np.int64(bucket[i])
        if horizon[i] >= 0:  # rule 1
            for c in range(b, len(rows)):
                if text[it] <= texts[c] and rows[c] - fill[c] - 1 <= horizon[i] * rate[c]:
                    b = c
                    break
        if k > an[1, g]:  # a new pass: every clip of g in open batches is now earlier
            for c in range(len(rows)):
                po[1, g, c] = po[0, g, c]
            an[0, g] = po[0, g, :].sum()
            an[1, g] = k
        if wq[0, g] >= 0 or an[0, g] > po[1, g, b]:  # its group waits; or rule 2
            meta[CLIP], meta[CLIP_BUCKET] = i, b
            return i + 1
        f = fill[b]
        o[b, f, 0], o[b, f, 1], o[b, f, 2] = it, g, k
        fill[b] = f + 1
        po[0, g, b] += 1
        if fill[b] >= rows[b]:
            _emit(o, fill, po, an, out, sk, rel, meta, wq, b, rows)
            if meta[RELEASED]:
                return i + 1
    return len(item)


@numba.njit(cache=True)
def _deal_one(st, wq, g, it, k, b, rows, texts, text):  # noqa: PLR0913
    """Deal one clip of group g (pass k, bucket b by rule 1) with rule 2; False where it
    has to wait (rule 3)."""
    o, fill, po, an, out, sk, rel, meta = st
    if k > an[1, g]:
        po[1, g, :] = po[0, g, :]
        an[0, g] = po[0, g, :].sum()
        an[1, g] = k
    if an[0, g] > po[1, g, b]:
        b = _gather(o, fill, po, an, out, sk, rel, meta, wq, g, it, b, rows, texts, text)
        if b < 0:
            return False
    f = fill[b]
    o[b, f, 0], o[b, f, 1], o[b, f, 2] = it, g, k
    fill[b] = f + 1
    po[0, g, b] += 1
    if fill[b] >= rows[b]:
        _emit(o, fill, po, an, out, sk, rel, meta, wq, b, rows)
    return True


@numba.njit(cache=True)
def _wait(w, wq, used, g, it, k, b):  # noqa: PLR0913
    """Rule 3: queue the clip behind its group's waiting ones; the queue (grown)."""
    if used == len(w):
        w = np.concatenate((w, np.empty_like(w)))
    w[used, 0], w[used, 1], w[used, 2], w[used, 3] = it, k, b, -1
    if wq[1, g] >= 0:
        w[wq[1, g], 3] = used
    else:
        wq[0, g] = used
    wq[1, g] = used
    return w


@numba.njit(cache=True)
def _gather(o, fill, po, an, out, sk, rel, meta, wq, g, it, b, rows, texts, text):  # noqa: PLR0913
    """Rule 2: the bucket that takes `it` (dealt to b) and every clip of g in open
    batches, the longest of theirs, where they now are; -1 where a text would not
    fit there."""
    top = b
    for c in range(len(rows)):
        if po[0, g, c] > 0 and c > top:
            top = c
    if text[it] > texts[top]:
        return -1
    for c in range(len(rows)):
        for j in range(fill[c]):
            if o[c, j, 1] == g and text[o[c, j, 0]] > texts[top]:
                return -1
    moved = po[0, g, :].sum()
    mine = np.empty((moved, 2), np.int32)  # item, pass
    m = 0
    for c in range(len(rows)):
        kept = 0
        for j in range(fill[c]):
            if o[c, j, 1] == g:
                mine[m, 0], mine[m, 1] = o[c, j, 0], o[c, j, 2]
                m += 1
            else:
                o[c, kept, :] = o[c, j, :]
                kept += 1
        fill[c] = kept
    for j in np.argsort(mine[:, 1], kind="mergesort"):  # the earlier pass first, stable
        f = fill[top]
        o[top, f, 0], o[top, f, 1], o[top, f, 2] = mine[j, 0], g, mine[j, 1]
        fill[top] = f + 1
    po[:, g, :] = 0
    po[0, g, top] = moved
    po[1, g, top] = an[0, g]
    while fill[top] >= rows[top]:
        _emit(o, fill, po, an, out, sk, rel, meta, wq, top, rows)
    return top


@numba.njit(cache=True)
def _emit(o, fill, po, an, out, sk, rel, meta, wq, b, rows):  # noqa: PLR0913
    """Out goes bucket b's batch: the first rows clips of its open batch (a gathering
    can leave more there; they wait for the next)."""
    n = rows[b]
    sk[0, meta[BATCHES]], sk[1, meta[BATCHES]] = meta[OUT], b
    meta[BATCHES] += 1
    for j in range(n):
        g, k = o[b, j, 1], o[b, j, 2]
        out[meta[OUT]] = o[b, j, 0]
        meta[OUT] += 1
        po[0, g, b] -= 1
        if k < an[1, g]:
            po[1, g, b] -= 1
            an[0, g] -= 1
        if wq[0, g] >= 0 and not rel[1, g]:
            rel[1, g] = 1
            rel[0, meta[RELEASED]] = g
            meta[RELEASED] += 1
    for j in range(n, fill[b]):  # what a gathering left over
        for x in range(3):
            o[b, j - n, x] = o[b, j, x]
    fill[b] -= n
