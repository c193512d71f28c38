"""Dealing a balanced epoch into batches pass by pass: no clip comes again early.

The balanced epoch (balance.py) gives group g a quota q_g of positions, walked as
passes over its n_g clips (each clip once a pass). Its turns come in due order
(the j-th of group g at (j + 1/2) / q_g, merged across groups); at each turn one clip
of the group's pass is dealt into the open batch of its length bucket, and a
bucket's batch leaves when it holds its rows, as BucketBatches deals a Shuffle's
order. Plain dealing lets a clip come a (k+1)-th time before its group's pass k is
out: a pass-k clip waits in the open batch of a slow bucket while pass k+1 fills a
fast bucket's batch, which leaves first (111 such early repeats an epoch at
temperature 0 on the lopsided test corpus, tests/support/lopsided.py). So:

1. A clip whose group has another pass to come goes to the shortest bucket, from
   its own up, whose open batch is expected to leave before that pass starts (a
   shorter clip fits a longer bucket's row, as the epoch's leftovers do): its
   own, unless that bucket is slow (expected: its free rows over its clips per
   position, against the pass's turns left times the group's period n / q_g).
2. A clip of pass k + 1 whose group still has clips of an earlier pass in another
   bucket's open batch (the expectation failed) goes to the longest bucket of the
   group's open clips and its own, the group's straddle bucket, with every later clip
   of the group until that bucket's batch leaves; if the earlier clips are still open
   elsewhere when it is about to leave, they move into it then, the earlier pass
   first, so they leave together in pass order (most have left by then on their own).
3. Where a text would not fit that bucket, the group's clips wait until its
   earlier clips have left, and then go first.

Which clip of its pass a turn deals is picked as the dealing goes (:func:`_pick`):
the group's walk (group_walk.pass_order) in order, but for three cases that spare
rule 1's and 2's rides: a turn of a group with earlier clips still open deals a clip
of the bucket they are in (the straddle bucket, or the one bucket that holds them all),
so the new pass joins them where they are; a turn before its group's last pass deals
the walk's next clip whose own batch is expected to leave before the next pass
(rule 1 keeps it in its bucket), or of a bucket slower than SLOW_LAG passes (it rides
wherever it comes); and when none is, a clip of the bucket where the group has most
clips open, so a pass ends in few buckets. On 2,000 lopsided clips with a small group
drawn 4 to 7 times this kept 0.76-0.79 of the frames real where the fixed walk kept
0.72-0.75, against 0.79-0.82 for plain buckets (docs/plans.md#balanced-epochs).

So in delivery order no clip of a group comes a (k+1)-th time before every clip of
its group came k times, in every epoch (tests/unit/test_balance.py). What is
left at the end (less than a batch a bucket, and waiting clips) shares a few
part-filled batches: the open batches' clips longest bucket first, then the
waiting ones pass by pass, a shorter clip riding in a longer bucket's batch where
its text fits. A pure function of the turns and the walks, so of (seed, epoch).

The dealing is one pass over the epoch with state, so it is compiled (numba, which
librosa brings): 10,000,000 clips took 20 s as a Python loop, under a second so
(docs/benchmarks.md#balanced-epochs). The state: each bucket's open batch (at most
twice the rows of all buckets: a move adds at most what the others hold),
per group and bucket its clips in open batches and those of them of an earlier
pass than its newest, its clips of this pass not dealt yet, its straddle bucket, and
per group a queue of waiting clips.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np

from ringfeed.consumer.stager.plan.buckets import Bucket
from ringfeed.consumer.stager.plan.layout import EpochLayout

# Waiting clips (rule 3) the queue holds before it grows (it doubles).
WAITING = 1024
# A bucket whose batch takes more than this many of a group's passes to fill (its lag,
# balance.py) is no reason to pick another clip of the group: its clips ride anyway, and
# walked in order they keep the windows. On the lopsided test corpus at temperature 0 the
# worst window of 10 batches strayed 0.091 from its target with it, 0.108 without (the
# bound is 0.1); 1.0 kept 0.091 too, but left 2,000 clips 0.004 more padding.
SLOW_LAG = 1.5
# A group's place in its walk after its last clip (_pick).
NONE = 1 << 62
# Counters in `meta`: clips out, batches out, groups released; a clip _run hands back
# (-1: none), its item and its bucket by rule 1.
OUT, BATCHES, RELEASED, CLIP, CLIP_ITEM, CLIP_BUCKET = 0, 1, 2, 3, 4, 5
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
#   meta  int64 [6]: OUT, BATCHES, RELEASED, CLIP, CLIP_ITEM, CLIP_BUCKET
#   top   int64 [groups]: each group's straddle bucket (rule 2; -1: none)
#   on    int64 [buckets, room + 1]: the groups that straddle into each bucket, counted
#         in the last column (a group whose straddle bucket changed stays listed: skipped)


class Walks(NamedTuple):
    """The groups' walks, as the dealing picks from them (group_walk.pass_order):
    lists int32 [n, 2]: each group's clips, bucket after bucket, each bucket's in walk
    order, with each one's place in its group's walk (one read for both: the dealing
    reads them at random); first int64 [groups, buckets]: where each group's bucket
    starts in lists; whole, partial int64 [groups, buckets]: a group's clips of each
    bucket in a whole pass, and in its last pass where that is partial; slow bool
    [groups, buckets]: SLOW_LAG's buckets."""

    lists: np.ndarray
    first: np.ndarray
    whole: np.ndarray
    partial: np.ndarray
    slow: np.ndarray


def deal(
    buckets: Sequence[Bucket],
    text: np.ndarray,
    rate: np.ndarray,
    walks: Walks,
    quota: np.ndarray,
    group: np.ndarray,
    pas: np.ndarray,
    horizon: np.ndarray,
) -> EpochLayout:
    """The epoch's batches. rate: each bucket's clips per position (rule 1's
    expectation); quota: each group's positions; the turns, in due order (arrays of one
    length): each one's group, pass and positions until its group's next pass (< 0:
    none comes)."""
    rows = np.array([b.rows for b in buckets], np.int64)
    texts = np.array([b.text for b in buckets], np.int64)
    out, starts, kinds, o, fill, w, wq = _deal(
        group,
        pas,
        horizon,
        rows,
        texts,  # integer arrays of any width
        np.ascontiguousarray(text, np.int32),
        np.asarray(rate, np.float64),
        walks,
        np.asarray(quota, np.int64),
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
def _deal(group, pas, horizon, rows, texts, text, rate, walks, quota):  # noqa: PLR0913
    """(out int32: the full batches' items in order; starts, kinds int64: each one's
    first position and bucket; the open batches' items per bucket; per group its
    waiting clips int64 [m, 3]: item, pass, bucket). The clips that need more than
    rule 1 (a straddle, a wait) come back here from _run, one at a time."""
    n_buckets, n, n_groups = len(rows), len(group), len(quota)
    room = 2 * rows.sum() + 2
    o = np.empty((n_buckets, room, 3), np.int32)
    fill = np.zeros(n_buckets, np.int64)
    po = np.zeros((2, n_groups, n_buckets), np.int64)
    an = np.zeros((2, n_groups), np.int64)
    an[1, :] = -1
    out = np.empty(n, np.int32)
    sk = np.empty((2, n // rows.min() + 2), np.int64)
    rel = np.zeros((2, n_groups), np.int64)
    meta = np.zeros(6, np.int64)
    meta[CLIP] = -1
    top = np.full(n_groups, -1, np.int64)
    on = np.zeros((n_buckets, room + 1), np.int64)
    st = (o, fill, po, an, out, sk, rel, meta, top, on)
    # the picks' state: the pass each group's is of; per group and bucket its next clip in
    # lists, that clip's place in the walk (NONE: no clip of the bucket left in the pass)
    # and where the pass's clips of the bucket end in lists
    at = np.full(n_groups, -1, np.int64)
    nxt, place = (
        np.zeros((n_groups, n_buckets), np.int64),
        np.zeros((n_groups, n_buckets), np.int64),
    )
    pk = (at, nxt, place, np.zeros((n_groups, n_buckets), np.int64), quota)
    w, wq, used, i = np.empty((WAITING, 4), np.int64), np.full((2, n_groups), -1, np.int64), 0, 0
    while i < n or meta[CLIP] >= 0 or meta[RELEASED]:
        i = _run(i, group, pas, horizon, rows, texts, text, rate, st, wq, walks, pk)
        c = meta[CLIP]
        if c >= 0:
            meta[CLIP] = -1
            g, k = np.int64(group[c]), np.int64(pas[c])
            it, b = meta[CLIP_ITEM], meta[CLIP_BUCKET]
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
    for b in range(n_buckets):  # the epoch's end: a straddle bucket takes its group's clips
        _leave(st, wq, b, rows)
    return out[: meta[OUT]], sk[0, : meta[BATCHES]], sk[1, : meta[BATCHES]], o, fill, w, wq


@numba.njit(cache=True)
def _run(start, group, pas, horizon, rows, texts, text, rate, st, wq, walks, pk):  # noqa: PLR0913
    """Deal clips from start on while only rule 1 is needed (numba: a call per clip costs 5x
    the dealing, so this is one loop); the index to go on from, with meta[CLIP] set to a
    turn that needs more (meta[CLIP_ITEM] and meta[CLIP_BUCKET] to its clip and its bucket
    by rule 1), or groups released (meta[RELEASED])."""
    o, fill, po, an, out, sk, rel, meta, top, on = st
    lists, first, whole, partial, slow = walks
    at, nxt, place, end, quota = pk
    for i in range(start, len(group)):
        g, k = np.int64(group[i]), np.int64(pas[i])
        if k > an[1, g]:  # a new pass: every clip of g in open batches is now earlier
            for c in range(len(rows)):
                po[1, g, c] = po[0, g, c]
            an[0, g] = po[0, g, :].sum()
            an[1, g] = k
        it, b = _pick(
            g,
            k,
            horizon[i],
            rows,
            fill,
            rate,
            po,
            an,
            top,
            lists,
            first,
            whole,
            partial,
            slow,
            at,
            nxt,
            place,
            end,
            quota,
        )
        if horizon[i] >= 0:  # rule 1
            for c in range(b, len(rows)):
                if text[it] <= texts[c] and rows[c] - fill[c] - 1 <= horizon[i] * rate[c]:
                    b = c
                    break
        if wq[0, g] >= 0 or an[0, g] > po[1, g, b]:  # its group waits; or rule 2
            meta[CLIP], meta[CLIP_ITEM], meta[CLIP_BUCKET] = i, it, b
            return i + 1
        f = fill[b]
        o[b, f, 0], o[b, f, 1], o[b, f, 2] = it, g, k
        fill[b] = f + 1
        po[0, g, b] += 1
        if fill[b] >= rows[b]:
            if on[b, -1]:
                _leave(st, wq, b, rows)
            else:
                _emit(o, fill, po, an, out, sk, rel, meta, wq, b, rows)
            if meta[RELEASED]:
                return i + 1
    return len(group)


@numba.njit(cache=True, inline="always")
def _pick(  # noqa: PLR0913
    g,
    k,
    horizon,
    rows,
    fill,
    rate,
    po,
    an,
    top,
    lists,
    first,
    whole,
    partial,
    slow,
    at,
    nxt,
    place,
    end,
    quota,
):
    """(item, its bucket) of the clip of group g's pass k that this turn deals (the
    module docstring's picks), taken from the pass's clips not dealt yet: the walks and
    the picks' state (_deal) as arrays, as a tuple costs a reference count per use and
    this runs once a turn. One read of the walk a turn, at random (a group's next clip of
    each bucket has its place kept)."""
    n_buckets = len(rows)
    if at[g] != k:  # a new pass: all its clips to come
        at[g] = k
        size = whole[g, :].sum()
        for c in range(n_buckets):
            nxt[g, c] = first[g, c]
            end[g, c] = first[g, c] + (whole[g, c] if (k + 1) * size <= quota[g] else partial[g, c])
            place[g, c] = lists[first[g, c], 1] if end[g, c] > first[g, c] else NONE
    b = -1
    if an[0, g] > 0 and top[g] >= 0:  # the straddle bucket, or the longest below it
        for c in range(top[g], -1, -1):
            if place[g, c] < NONE:
                b = c
                break
    elif an[0, g] > 0:  # the one bucket that holds all of g's earlier clips
        for c in range(n_buckets):
            if place[g, c] < NONE and po[1, g, c] == an[0, g]:
                b = c
    if b < 0 and horizon >= 0:  # the walk's next that rule 1 keeps in its bucket
        best = NONE
        for c in range(n_buckets):
            if place[g, c] < best and (slow[g, c] or rows[c] - fill[c] - 1 <= horizon * rate[c]):
                b, best = c, place[g, c]
        if b < 0:  # none: where g has most clips open (the longer on a tie)
            most = -1
            for c in range(n_buckets):
                if place[g, c] < NONE and po[0, g, c] >= most:
                    b, most = c, po[0, g, c]
    if b < 0:  # the walk's next
        best = NONE
        for c in range(n_buckets):
            if place[g, c] < best:
                b, best = c, place[g, c]
    j = nxt[g, b]
    nxt[g, b] = j + 1
    place[g, b] = lists[j + 1, 1] if j + 1 < end[g, b] else NONE
    return np.int64(lists[j, 0]), np.int64(b)


@numba.njit(cache=True)
def _deal_one(st, wq, g, it, k, b, rows, texts, text):  # noqa: PLR0913
    """Deal one clip of group g (pass k, bucket b by rule 1) with rule 2; False where it
    has to wait (rule 3)."""
    o, fill, po, an, out, sk, rel, meta, top, on = st
    if k > an[1, g]:
        po[1, g, :] = po[0, g, :]
        an[0, g] = po[0, g, :].sum()
        an[1, g] = k
    if an[0, g] > po[1, g, b]:
        t = _straddle(o, fill, po, g, it, b, rows, texts, text, top[g])
        if t < 0:
            return False
        if top[g] != t:
            if top[g] >= 0:  # a longer one: what the group has in open batches moves now
                _move(o, fill, po, an, g, t)
                _leave(st, wq, t, rows)
            top[g] = t
            on[t, on[t, -1]] = g
            on[t, -1] += 1
        b = t
    f = fill[b]
    o[b, f, 0], o[b, f, 1], o[b, f, 2] = it, g, k
    fill[b] = f + 1
    po[0, g, b] += 1
    if fill[b] >= rows[b]:
        _leave(st, wq, b, rows)
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
def _straddle(o, fill, po, g, it, b, rows, texts, text, was):  # noqa: PLR0913
    """Rule 2: the straddle bucket of group g for `it` (dealt to b): the longest of b, the
    group's straddle bucket `was` and those of its clips in open batches; -1 where a
    text of them would not fit there."""
    t = max(b, was)
    for c in range(len(rows)):
        if po[0, g, c] > 0 and c > t:
            t = c
    if text[it] > texts[t]:
        return -1
    if t == was:  # its other clips fitted t when it became the straddle bucket, or since
        return t
    for c in range(len(rows)):
        for j in range(fill[c]):
            if o[c, j, 1] == g and text[o[c, j, 0]] > texts[t]:
                return -1
    return t


@numba.njit(cache=True)
def _move(o, fill, po, an, g, t):  # noqa: PLR0913
    """Every clip of group g in open batches to the end of bucket t's, the earlier pass
    first (stable): they leave together in pass order."""
    moved = po[0, g, :].sum()
    mine = np.empty((moved, 2), np.int32)  # item, pass
    m = 0
    for c in range(len(fill)):
        kept = 0
        for j in range(fill[c]):
            if o[c, j, 1] == g:
                mine[m, 0], mine[m, 1] = o[c, j, 0], o[c, j, 2]
                m += 1
            else:
                o[c, kept, :] = o[c, j, :]
                kept += 1
        fill[c] = kept
    for j in np.argsort(mine[:, 1], kind="mergesort"):
        f = fill[t]
        o[t, f, 0], o[t, f, 1], o[t, f, 2] = mine[j, 0], g, mine[j, 1]
        fill[t] = f + 1
    po[:, g, :] = 0
    po[0, g, t] = moved
    po[1, g, t] = an[0, g]


@numba.njit(cache=True)
def _leave(st, wq, b, rows):
    """Bucket b's batches that are full leave (_emit); first, a group that straddles into
    b and still has earlier clips in other open batches moves them in (rule 2)."""
    o, fill, po, an, out, sk, rel, meta, top, on = st
    for j in range(on[b, -1]):
        h = on[b, j]
        if top[h] == b:
            if an[0, h] > po[1, h, b]:
                _move(o, fill, po, an, h, b)
            top[h] = -1
    on[b, -1] = 0
    while fill[b] >= rows[b]:
        _emit(o, fill, po, an, out, sk, rel, meta, wq, b, rows)


@numba.njit(cache=True)
def _emit(o, fill, po, an, out, sk, rel, meta, wq, b, rows):  # noqa: PLR0913
    """Out goes bucket b's batch: the first rows clips of its open batch (a move can
    leave more there; they wait for the next). No call in here: numba then keeps the
    arrays' reference counts out of its loop (3x the dealing, measured)."""
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
    for j in range(n, fill[b]):  # what a move left over
        for x in range(3):
            o[b, j - n, x] = o[b, j, x]
    fill[b] -= n
