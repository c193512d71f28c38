"""The groups' walks of a balanced epoch, and their turns in due order.

balance.py decides each group's quota q_g; this module lays out what the dealing
(pass_deal.py) is given, all compiled with numba (10,000,000 clips: numpy's sorts
took 4.5 s of the plan's 6 s here, these take well under one):

- :func:`grouped`: every group's clips, group after group, each group in the order
  of one shuffle of all items (a counting sort: stable, O(n)).
- :func:`pass_order`: the order a group walks its clips in each pass, given as each
  bucket's clips in that order and each clip's place in it: each bucket's clips
  spread evenly over the pass (the i-th of c at (i + 1/2) / c), a clip of bucket b
  moved earlier by lag[g, b] of the pass (at most `tail`), so a pass ends with clips
  whose batches leave soon. The dealing walks it, and leaves it where a clip of
  another bucket suits the open batches better (pass_deal.py's picks).
- :func:`arrivals`: the epoch's positions in due order, the j-th of group g at
  (j + 1/2) / q_g (whoever is furthest behind its target goes next; ties to the
  lower group), each with its group, pass (j // n_g) and positions until its group's
  next pass (-1 in its last).

Pure functions of their arrays, so of (seed, epoch) through balance.py.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def grouped(perm, of_item, of_bucket, n_groups):
    """perm's items and their buckets (int32 [n] each) sorted by group, keeping perm's
    order within one: two passes, each reading of_item and of_bucket once at random
    (the cost at 10**7 items: a cache miss each)."""
    n = len(perm)
    group, bucket = np.empty(n, np.int32), np.empty(n, np.int32)
    at = np.zeros(n_groups + 1, np.int64)
    for i in range(n):
        group[i], bucket[i] = of_item[perm[i]], of_bucket[perm[i]]
        at[group[i] + 1] += 1
    at = np.cumsum(at)
    items, buckets = np.empty(n, np.int32), np.empty(n, np.int32)
    for i in range(n):
        g = group[i]
        items[at[g]], buckets[at[g]] = perm[i], bucket[i]
        at[g] += 1
    return items, buckets


@numba.njit(cache=True)
def pass_order(items, buckets, starts, lag, tail, quota):  # noqa: PLR0913
    """Each group's pass order, by bucket: (its clips and each one's place in its group's
    pass, int32 [n, 2]: group after group, each group's bucket after bucket, each
    bucket's in the order of the pass; per group and bucket its clips in the last pass
    when that pass is partial, int64 [groups, buckets]: those placed before q_g % n_g).
    The order is a merge of the group's buckets by key (i + 1/2) / c x (1 - min(tail,
    lag[g, b])) for the i-th of c clips of bucket b (ties to the shorter bucket)."""
    n_buckets = lag.shape[1]
    lists = np.empty((len(items), 2), np.int32)
    partial = np.zeros((len(starts) - 1, n_buckets), np.int64)
    for g in range(len(starts) - 1):
        lo, hi = starts[g], starts[g + 1]
        first = np.zeros(n_buckets + 1, np.int64)
        for i in range(lo, hi):
            first[buckets[i] + 1] += 1
        count = first[1:].copy()
        first = np.cumsum(first)
        at = first[:-1].copy()
        for i in range(lo, hi):  # the group's clips by bucket, in their shuffled order
            lists[lo + at[buckets[i]], 0] = items[i]
            at[buckets[i]] += 1
        size = hi - lo
        cut = quota[g] % size if size and quota[g] % size else -1  # the last pass's clips
        taken = np.zeros(n_buckets, np.int64)
        for p in range(size):
            best, best_key = -1, np.inf
            for b in range(n_buckets):
                if taken[b] < count[b]:
                    key = (taken[b] + 0.5) / count[b] * (1.0 - min(tail, lag[g, b]))
                    if key < best_key:
                        best, best_key = b, key
            lists[lo + first[best] + taken[best], 1] = p
            taken[best] += 1
            if p < cut:
                partial[g, best] += 1
    return lists, partial


@numba.njit(cache=True)
def arrivals(starts, quota, n):
    """(group, pass int32 [n]; horizon float32 [n]) of every position in due order: a k-way
    merge of the groups' due times on a binary heap of (due, group); which clip of its
    group's pass each position holds, the dealing decides (pass_deal.py)."""
    group, pas = np.empty(n, np.int32), np.empty(n, np.int32)
    # 12 bytes a position: a horizon fits float32 (a count of positions)
    horizon = np.empty(n, np.float32)
    heap_due, heap_g = np.empty(len(quota)), np.empty(len(quota), np.int64)
    m = 0
    for g in range(len(quota)):
        if quota[g] > 0:
            heap_due[m], heap_g[m] = 0.5 / quota[g], g
            _sift_up(heap_due, heap_g, m)
            m += 1
    taken = np.zeros(len(quota), np.int64)
    last = (quota - 1) // np.maximum(1, starts[1:] - starts[:-1])
    for p in range(n):
        g = heap_g[0]
        size, j = max(1, starts[g + 1] - starts[g]), taken[g]
        group[p], pas[p] = g, j // size
        left = size - 1 - j % size  # turns of this pass after this one
        horizon[p] = -1.0 if j // size == last[g] else left * n / quota[g]
        taken[g] = j + 1
        if j + 1 < quota[g]:
            heap_due[0] = (j + 1.5) / quota[g]
        else:
            m -= 1
            heap_due[0], heap_g[0] = heap_due[m], heap_g[m]
        _sift_down(heap_due, heap_g, 0, m)
    return group, pas, horizon


@numba.njit(cache=True, inline="always")
def _before(due, gs, a, b) -> bool:
    return due[a] < due[b] or (due[a] == due[b] and gs[a] < gs[b])


@numba.njit(cache=True)
def _sift_up(due, gs, i):
    while i > 0:
        parent = (i - 1) // 2
        if not _before(due, gs, i, parent):
            return
        due[i], due[parent] = due[parent], due[i]
        gs[i], gs[parent] = gs[parent], gs[i]
        i = parent


@numba.njit(cache=True)
def _sift_down(due, gs, i, m):
    while True:
        child = 2 * i + 1
        if child >= m:
            return
        if child + 1 < m and _before(due, gs, child + 1, child):
            child += 1
        if not _before(due, gs, child, i):
            return
        due[i], due[child] = due[child], due[i]
        gs[i], gs[child] = gs[child], gs[i]
        i = child
