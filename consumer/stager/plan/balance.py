"""Balanced epochs without replacement: quotas per group, interleaved, bucketed, exact.

``stager.balance.by`` (language or speaker) splits the corpus into groups; each
epoch gives group g a quota q_g of plan positions, and the epoch is exactly as
long as the corpus (n_items positions: every position arithmetic of the plan,
the cursor and the shares stays as it is). Everything below is a pure function
of (seed, epoch, temperature, weights, the items' groups, their buckets), built
with numpy over int32 arrays, never a Python object per item
(docs/plans.md#balanced-epochs). :class:`BalancedBatches` is the part of the plan
that serves them (layout.py EpochSource, made by make.py); `validate` calls
:func:`balance_lines`; tests and benchmarks/balance.py call the rest.

Quotas. Group g of n_g clips weighs w_g = weights[g] x n_g ** temperature:
temperature 1 is the corpus as it is (q_g = n_g exactly), 0 is uniform (every
group the same number of positions), between flattens (mT5's 0.3). Its share of
the epoch's n positions is n x w_g / sum(w), floored; the r positions the floors
leave (r < number of groups) go to groups by systematic sampling with an offset
drawn from (seed, epoch): group g gets one more with a probability equal to its
fractional part, so over epochs each group's mean is its exact share. In integer
arithmetic (weights scaled to integers), so every host computes the same quotas.

Without replacement. Each epoch shuffles each group once (its own permutation,
from (seed, epoch)) and walks it: a quota above n_g takes the whole permutation
q_g // n_g times and then its first q_g % n_g items, so an item appears
floor(q_g / n_g) or one more times in the epoch, at most once per repeat; a
quota below n_g takes a prefix (a different one each epoch).

Interleaved and bucketed. Within each length bucket (one bucket of the fixed
shape without buckets) the group's occurrences are merged by due time: the k-th
of c occurrences of group g in bucket b is due at (k + 1/2) / c, so any stretch
of a bucket's order holds every group within about one item of its share there
(the "furthest behind its target goes next" rule, computed as a merge of sorted
runs: :func:`merge_by_due`). A batch is rows consecutive items of its bucket's order; the buckets'
full batches are merged the same way (batch j of f is due at (j + 1/2) / f), so
every window of batches holds each bucket within a batch of its share, and the
leftovers (fewer than a batch per bucket) share a few part-filled batches at the
epoch's end, as in BucketBatches. Padding stays the bucketed plan's: every batch
but those last ones is full and of one bucket.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.plan.buckets import Bucket
from ringfeed.consumer.stager.plan.layout import EpochLayout
from ringfeed.shared.config import Config
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.config.stager import BalanceConfig
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.language.codes import language_code
from ringfeed.shared.run.id_tables import IdTables

# Streams of the seed used here, apart from the Shuffle's ([seed, epoch], shuffle.py).
QUOTA_STREAM = 0xBA1A
SHUFFLE_STREAM = 0xBA1B
# Weights that are not integers are scaled to integers up to this before the quotas
# are apportioned (exact integer arithmetic from there on: the same on every host).
WEIGHT_SCALE = 2**31
# Epochs whose layout the plan keeps of a BalancedBatches (the current one, and the next
# that grants run into): 4 bytes per item each.
KEPT_LAYOUTS = 2
# Positions computed at once where a pass needs int64 temporaries (8 MiB each).
CHUNK = 2**20
# Groups a log line or validate names at most (the largest quotas; the rest counted).
MAX_NAMES_SHOWN = 12


@dataclass(frozen=True)
class Groups:
    """Each item's group (int32 [n_items], ids into names) and the group names."""

    of_item: np.ndarray
    names: tuple[str, ...]

    @functools.cached_property
    def sizes(self) -> np.ndarray:
        """Items per group (int64 [groups]); counted once (bincount casts to int64)."""
        return np.bincount(self.of_item, minlength=len(self.names)).astype(np.int64)


def plan_groups(balance: BalanceConfig, tables: IdTables, index: CorpusIndex) -> Groups:
    """The groups of stager.balance.by: the run's speaker or language ids (the tables the
    stager built once, shared/run/id_tables.py), one int32 per item."""
    speakers, languages = tables.item_ids(index)
    if balance.by == "speaker":
        return Groups(speakers, tables.speakers)
    return Groups(languages, tables.languages)


def named_weights(balance: BalanceConfig, groups: Groups) -> list[float]:
    """stager.balance.weights as one multiplier per group (1 where unnamed); a name the
    run does not know is a ConfigError naming it."""
    known = {name: g for g, name in enumerate(groups.names)}
    out = [1.0] * len(groups.names)
    for name, weight in balance.weights.items():
        key = language_code(name) if balance.by == "language" else name
        if key not in known:
            shown = ", ".join(repr(n) for n in groups.names[:MAX_NAMES_SHOWN])
            raise ConfigError(
                f"stager.balance.weights.{name}: no {balance.by} of that name in this run "
                f"(it has {shown}{' ...' if len(known) > MAX_NAMES_SHOWN else ''}): fix the name"
            )
        out[known[key]] = weight
    return out


def describe(groups: Groups, quota: np.ndarray, limit: int = MAX_NAMES_SHOWN) -> list[str]:
    """'name: quota of size clips (x repeats)' for the `limit` largest quotas, then a
    count of the rest (validate, the stager's log)."""
    sizes = groups.sizes
    top = np.argsort(-quota, kind="stable")[:limit]
    lines = []
    for g in top:
        if not sizes[g]:
            continue
        repeats, more = divmod(int(quota[g]), int(sizes[g]))
        times = f"{repeats}" if not more else f"{repeats} or {repeats + 1}"
        lines.append(
            f"{groups.names[g] or '(unnamed)'}: {int(quota[g])} of {int(sizes[g])} clips"
            f" ({100 * quota[g] / max(1, quota.sum()):.1f} %, each clip {times} times)"
        )
    rest = int(np.count_nonzero(sizes)) - len(lines)
    return lines + ([f"... and {rest} more groups"] if rest > 0 else [])


def balance_lines(cfg: Config, index: CorpusIndex, tables: IdTables) -> list[str]:
    """validate's lines: the epoch's length and every group's quota in epoch 0 (later
    epochs move a group's by at most one: the remainder's draw)."""
    b = cfg.stager.balance
    if not b.on:
        return []
    groups = plan_groups(b, tables, index)
    weights = group_weights(groups.sizes, b.temperature, named_weights(b, groups))
    quota = quotas(weights, index.n_items, cfg.stager.seed, 0)
    head = (f"  balance       by {b.by}, temperature {b.temperature:g}: {index.n_items} "
            f"positions an epoch (as many as clips), epoch 0:")  # fmt: skip
    return [head] + [f"    {line}" for line in describe(groups, quota)]


def group_weights(sizes: np.ndarray, temperature: float, weights: Sequence[float]) -> np.ndarray:
    """Integer weights (int64 [groups]) proportional to weights[g] x sizes[g] ** temperature;
    0 for an empty group. Integral weights (temperature 0 or 1 with whole multipliers)
    are used as they are, so temperature 1 gives every group exactly its size."""
    sizes = np.asarray(sizes, np.int64)
    w = np.asarray(weights, np.float64) * np.power(sizes.astype(np.float64), temperature)
    w[sizes == 0] = 0.0
    if np.all(w == np.floor(w)) and w.sum() < 2**53 / max(1, int(sizes.sum())):
        return w.astype(np.int64)
    return np.round(w * (WEIGHT_SCALE / w.max())).astype(np.int64)


def quotas(weights: np.ndarray, total: int, seed: int, epoch: int) -> np.ndarray:
    """Positions of each group in `epoch` (int64 [groups], summing to `total`): the floor
    of total x w_g / sum(w), plus one for the groups that systematic sampling with an
    offset from (seed, epoch) picks among the fractional parts
    (docs/plans.md#balanced-epochs). Exact integers throughout."""
    w = np.asarray(weights, np.int64)
    whole = int(w.sum())
    if whole <= 0:
        raise ConfigError("stager.balance.weights: every group has weight 0: give one a weight")
    scaled = [total * int(x) for x in w]  # Python ints: total x w never overflows
    base = np.array([s // whole for s in scaled], np.int64)
    fraction = np.array([s % whole for s in scaled], dtype=object)
    cum = np.cumsum(fraction)  # ends at (total - base.sum()) x whole
    u = int(np.random.default_rng([seed, QUOTA_STREAM, epoch]).integers(whole))
    # points u, u + whole, u + 2 whole, ...: group g gets those in [cum[g-1], cum[g])
    above = np.array([-((u - int(c)) // whole) for c in cum], np.int64)  # ceil((c - u) / W)
    extra = np.diff(np.concatenate([[0], above]))
    return base + extra


def shuffled_groups(groups: Groups, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(items int32 [n]: every group's items, group after group, each group in its own
    random order for `epoch`; starts int64 [groups + 1]: where each group begins).
    One shuffle of all items, then a sort by group that keeps the shuffled order:
    in-place on one int64 key (group x n + place), so 16 bytes per item at most."""
    n = len(groups.of_item)
    starts = np.concatenate([[0], np.cumsum(groups.sizes)])
    perm = np.arange(n, dtype=np.int32)
    np.random.default_rng([seed, SHUFFLE_STREAM, epoch]).shuffle(perm)
    key = np.empty(n, np.int64)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        key[lo:hi] = groups.of_item[perm[lo:hi]]
        key[lo:hi] *= n
        key[lo:hi] += np.arange(lo, hi)
    key.sort()
    key %= n  # the place in perm
    return perm[key], starts


def occurrences(items: np.ndarray, starts: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """The epoch's items (int32 [sum(quota)]), group after group: group g's q_g items walk
    its permutation (items[starts[g]:starts[g+1]]) q_g // n_g times, then a prefix.
    Computed in chunks of CHUNK positions, so the temporaries stay small."""
    sizes = np.diff(starts)
    ends = np.cumsum(quota)
    out = np.empty(int(ends[-1]), np.int32)
    for lo in range(0, len(out), CHUNK):
        position = np.arange(lo, min(lo + CHUNK, len(out)), dtype=np.int64)
        group = np.searchsorted(ends, position, side="right")
        position -= ends[group] - quota[group]  # t: the position within its group
        position %= sizes[group]
        position += starts[group]
        out[lo : lo + CHUNK] = items[position]
    return out


def group_runs(occ: np.ndarray, quota: np.ndarray, bucket: np.ndarray, n_buckets: int):
    """runs[b, g]: occurrences of group g in bucket b (int64 [buckets, groups])."""
    n_groups = len(quota)
    ends = np.cumsum(quota)
    runs = np.zeros(n_buckets * n_groups, np.int64)
    for lo in range(0, len(occ), CHUNK):
        position = np.arange(lo, min(lo + CHUNK, len(occ)), dtype=np.int64)
        key = np.searchsorted(ends, position, side="right")
        key += bucket[lo : lo + CHUNK].astype(np.int64) * n_groups
        runs += np.bincount(key, minlength=len(runs))
    return runs.reshape(n_buckets, n_groups)


def merge_by_due(runs: np.ndarray) -> np.ndarray:
    """Order (int64) that merges runs of lengths `runs` (laid out one after another) so
    that the k-th element of a run of length c comes at due time (k + 1/2) / c; ties go
    to the earlier run. Up to due time t a run has had round(c t) elements, so a prefix
    of m holds a run of share p within 1/2 + p x len(runs) / 2 of m p (in practice
    about one element: tests/unit/test_balance.py)."""
    runs = np.asarray(runs, np.int64)
    due = np.arange(int(runs.sum()), dtype=np.float64)  # k, then (k + 1/2) / c, in place
    due -= np.repeat((np.cumsum(runs) - runs).astype(np.float64), runs)
    due += 0.5
    due /= np.repeat(runs.astype(np.float64), runs)
    return np.argsort(due, kind="stable")  # a merge of sorted runs (timsort)


def bucket_sequences(
    occ: np.ndarray, quota: np.ndarray, of_bucket: np.ndarray, n_buckets: int
) -> tuple[np.ndarray, np.ndarray]:
    """(items int32: each bucket's balanced order, bucket after bucket; starts int64
    [buckets + 1]). occ: the epoch's items group after group (:func:`occurrences`, with
    quota[g] of group g); their order within a group is kept within each bucket."""
    bucket = of_bucket[occ].astype(np.uint8 if n_buckets <= 2**8 else np.int32)
    runs = group_runs(occ, quota, bucket, n_buckets)
    order = np.argsort(bucket, kind="stable")  # a radix sort: O(n)
    del bucket
    occ = occ[order]
    del order
    starts = np.concatenate([[0], np.cumsum(runs.sum(axis=1))]).astype(np.int64)
    for b in range(n_buckets):
        lo, hi = starts[b], starts[b + 1]
        occ[lo:hi] = occ[lo:hi][merge_by_due(runs[b][runs[b] > 0])]
    return occ, starts


def batch_layout(
    seq: np.ndarray, starts: np.ndarray, buckets: Sequence[Bucket], text: np.ndarray
) -> EpochLayout:
    """Batches of rows consecutive items of each bucket's order, the buckets' full batches
    merged by due time, then the leftovers sharing part-filled batches (longest bucket
    first; a shorter clip joins a longer bucket's batch when its text fits there)."""
    rows = np.array([b.rows for b in buckets], np.int64)
    counts = np.diff(starts)
    full = counts // rows
    pick = merge_by_due(full)  # the full batches of all buckets, in step
    batch_bucket = np.repeat(np.arange(len(buckets)), full)[pick]
    batch_index = (np.arange(int(full.sum())) - np.repeat(np.cumsum(full) - full, full))[pick]
    first = starts[:-1][batch_bucket] + batch_index * rows[batch_bucket]
    lengths = rows[batch_bucket]
    left_starts, left_kinds, left_items = _leftovers(seq, starts, full * rows, buckets, text)
    out_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    done = int(out_starts[-1])
    order = np.empty(done + len(left_items), np.int32)
    order[done:] = left_items
    step = max(1, CHUNK // int(rows.max()))  # batches gathered at once
    for i in range(0, len(lengths), step):
        j = min(i + step, len(lengths))
        position = np.arange(out_starts[i], out_starts[j], dtype=np.int64)
        order[out_starts[i] : out_starts[j]] = seq[
            position + np.repeat(first[i:j] - out_starts[i:j], lengths[i:j])
        ]
    out_starts = out_starts[:-1]
    return EpochLayout(
        order,
        np.concatenate([out_starts, np.asarray(left_starts, np.int64) + done]).astype(np.int64),
        np.concatenate([batch_bucket, np.asarray(left_kinds, np.int64)]).astype(np.int64),
    )


def _leftovers(seq, starts, used, buckets, text) -> tuple[list[int], list[int], list[int]]:
    """(batch starts, bucket of each, items) of the epoch's last, part-filled batches:
    fewer than one batch per bucket of items, so a Python loop."""
    batch_starts: list[int] = []
    kinds: list[int] = []
    items: list[int] = []
    room = 0
    for b in reversed(range(len(buckets))):
        for item in seq[starts[b] + used[b] : starts[b + 1]].tolist():
            shape = buckets[kinds[-1]] if room else None
            if shape is None or text[item] > shape.text:
                batch_starts.append(len(items))
                kinds.append(b)
                room = buckets[b].rows
            items.append(item)
            room -= 1
    return batch_starts, kinds, items


def balanced_layout(
    groups: Groups,
    weights: np.ndarray,
    of_bucket: np.ndarray,
    buckets: Sequence[Bucket],
    text: np.ndarray,
    seed: int,
    epoch: int,
) -> EpochLayout:
    """The whole epoch `epoch`: quotas, each group's walk, the balanced order within each
    bucket, and its batches. weights: from group_weights."""
    n = len(groups.of_item)
    quota = quotas(weights, n, seed, epoch)
    items, starts = shuffled_groups(groups, seed, epoch)
    occ = occurrences(items, starts, quota)
    del items
    seq, bucket_starts = bucket_sequences(occ, quota, of_bucket, len(buckets))
    del occ
    return batch_layout(seq, bucket_starts, buckets, text)


class BalancedBatches:
    """Balanced epochs (:func:`balanced_layout`) in batches of one length bucket each (one
    bucket of the fixed shape when buckets are off): positions, batches, shares, the
    cursor and resume work as with any part; an item may sit at several positions of
    an epoch."""

    kept = KEPT_LAYOUTS

    def __init__(
        self,
        seed: int,
        buckets: list[Bucket],
        of_item: np.ndarray,
        groups: Groups,
        weights: np.ndarray,
        text: np.ndarray | None = None,
    ) -> None:
        """of_item: each item's bucket; weights: from group_weights; text: each item's
        tokens (the manifest's), so a leftover joins a longer bucket's batch only if its
        text fits there too."""
        self.seed, self.buckets, self.of_item = seed, buckets, of_item
        self.groups, self.weights = groups, weights
        self.n_items = len(of_item)
        self.text = text if text is not None else np.zeros(len(of_item), np.int32)

    def layout(self, epoch: int) -> EpochLayout:
        return balanced_layout(
            self.groups, self.weights, self.of_item, self.buckets, self.text, self.seed, epoch
        )

    def quotas(self, epoch: int) -> np.ndarray:
        """Positions of each group in `epoch` (int64 [groups])."""
        return quotas(self.weights, self.n_items, self.seed, epoch)


def balance_hash(groups: Groups, weights: np.ndarray, by: str, temperature: float) -> str:
    """What decides the balance, for the plan fingerprint (shared/run/fingerprint.py): the
    groups' names, each item's group, the weights and the temperature."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{by}|{temperature!r}|{'|'.join(groups.names)}".encode())
    h.update(np.ascontiguousarray(weights, np.int64).tobytes())
    h.update(np.ascontiguousarray(groups.of_item, np.int32).tobytes())
    return h.hexdigest()
