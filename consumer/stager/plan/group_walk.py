"""The groups' walks of a balanced epoch, and the order their clips arrive in.

balance.py decides each group's quota q_g; this module lays out what the dealing
(pass_deal.py) is given, all compiled with numba (10,000,000 clips: numpy's sorts
took 4.5 s of the plan's 6 s here, these take well under one):

- :func:`grouped`: every group's clips, group after group, each group in the order
  of one shuffle of all items (a counting sort: stable, O(n)).
- :func:`pass_order`: the order a group walks its clips in each pass: each
  bucket's clips spread evenly over the pass (the i-th of c at (i + 1/2) / c), a
  clip of bucket b moved earlier by lag[g, b] of the pass (at most `tail`), so a
  pass ends with clips whose batches leave soon.
- :func:`arrivals`: the epoch's positions in due order, the j-th of group g at
  (j + 1/2) / q_g (whoever is furthest behind its target goes next; ties to the
  lower group), each with its clip (the walk's j % n_g-th: pass j // n_g), bucket,
  and positions until its group's next pass (-1 in its last).

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
def pass_order(items, buckets, starts, lag, tail):  # noqa: PLR0913
    """Each group's clips (items[starts[g]:starts[g + 1]], of buckets `buckets`) in its
    pass order, and their buckets (int32 each): a merge of the group's buckets by key
    (i + 1/2) / c x (1 - min(tail, lag[g, b])) for the i-th of c clips of bucket b
    (ties to the shorter bucket)."""
    n_buckets = lag.shape[1]
    walk, walk_bucket = np.empty(len(items), np.int32), np.empty(len(items), np.int32)
    for g in range(len(starts) - 1):
        lo, hi = starts[g], starts[g + 1]
        first = np.zeros(n_buckets + 1, np.int64)
        for i in range(lo, hi):
            first[buckets[i] + 1] += 1
        count = first[1:].copy()
        first = np.cumsum(first)
        at = first[:-1].copy()
        for i in range(lo, hi):  # the group's clips by bucket, in their shuffled order
            walk[lo + at[buckets[i]]] = items[i]
            at[buckets[i]] += 1
        by_bucket = walk[lo:hi].copy()
        taken = np.zeros(n_buckets, np.int64)
        for p in range(lo, hi):
            best, best_key = -1, np.inf
            for b in range(n_buckets):
                if taken[b] < count[b]:
                    key = (taken[b] + 0.5) / count[b] * (1.0 - min(tail, lag[g, b]))
                    if key < best_key:
                        best, best_key = b, key
            walk[p], walk_bucket[p] = by_bucket[first[best] + taken[best]], best
            taken[best] += 1
    return walk, walk_bucket


@numba.njit(cache=True)
def arrivals(walk, walk_bucket, starts, quota, n):  # noqa: PLR0913
    """(item, group, pass int32 [n]; bucket int16 [n]; horizon float32 [n]) of every position in
    due order: a k-way merge of the groups' due times on a binary heap of
    (due, group). walk, walk_bucket: the groups' pass orders and their buckets, group
    after group (starts)."""
    item, group = np.empty(n, np.int32), np.empty(n, np.int32)
    # 18 bytes a position: a bucket index fits int16, a horizon float32 (a count of positions)
    pas, bucket, horizon = np.empty(n, np.int32), np.empty(n, np.int16), np.empty(n, np.float32)
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
        at = starts[g] + j % size
        item[p], group[p], pas[p], bucket[p] = walk[at], g, j // size, walk_bucket[at]
        left = size - 1 - j % size  # turns of this pass after this one
        horizon[p] = -1.0 if j // size == last[g] else left * n / quota[g]
        taken[g] = j + 1
        if j + 1 < quota[g]:
            heap_due[0] = (j + 1.5) / quota[g]
        else:
            m -= 1
            heap_due[0], heap_g[0] = heap_due[m], heap_g[m]
        _sift_down(heap_due, heap_g, 0, m)
    return item, group, pas, bucket, horizon


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
