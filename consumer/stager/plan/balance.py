"""Balanced epochs without replacement: quotas per group, interleaved, bucketed, exact.

``stager.balance.by`` (language or speaker) splits the corpus into groups; each
epoch gives group g a quota q_g of plan positions, and the epoch is exactly as
long as the corpus (n_items positions: every position arithmetic of the plan,
the cursor and the shares stays as it is). Everything below is a pure function
of (seed, epoch, temperature, weights, the items' groups, their buckets), built
with numpy over int32 arrays but for the dealing (pass_deal.py, a Python loop)
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
q_g // n_g times and then its first q_g % n_g clips, so a clip appears
floor(q_g / n_g) or one more times in the epoch; a quota below n_g takes a prefix
(a different one each epoch). The walk's order within a pass
(:func:`pass_orders`) spreads each bucket's clips of the group evenly over the
pass, those of slow buckets a little earlier.

Interleaved, bucketed, in delivery order. The groups' positions are merged by
due time, the j-th of q_g at (j + 1/2) / q_g (:func:`merge_by_due`: whoever is
furthest behind its target goes next), and dealt into batches of one length
bucket each (one bucket of the fixed shape without buckets) pass by pass
(pass_deal.py): in delivery order no clip of a group comes a (k+1)-th time
before every clip of its group came k times, across buckets and the leftovers.
A clip that would otherwise wait in a slow bucket's batch past its group's next
pass rides in a longer bucket's batch; the epoch ends with a few part-filled
batches, as BucketBatches' do.
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
# The most of a pass by which a clip of a slow bucket comes earlier in its group's walk
# (pass_orders): 0.5 kept every window of 10 batches within 0.1 of its target on the
# lopsided test corpus at temperatures 0, 0.3 and 1; 0 and 0.9 did not at 0.
TAIL_LAG = 0.5


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


def pass_orders(
    items: np.ndarray, starts: np.ndarray, of_bucket: np.ndarray, lag: np.ndarray
) -> np.ndarray:
    """The order each group walks its clips in a pass (int32, group after group as in
    items): each bucket's clips spread evenly over the pass (the i-th of c at (i + 1/2)
    / c, so the group feeds every bucket steadily), a clip of bucket b moved earlier
    by lag[g, b] of the pass (the share of the pass its bucket's batch takes to fill,
    at most TAIL_LAG), so a pass ends with clips whose batches leave soon (rule 1 of
    pass_deal.py needs to send fewer clips to a longer bucket)."""
    n_groups, n_buckets = lag.shape
    group = np.repeat(np.arange(n_groups, dtype=np.int64), np.diff(starts))
    bucket = of_bucket[items].astype(np.int64)
    cell = group * n_buckets + bucket
    by_cell = np.argsort(cell, kind="stable")  # keeps the shuffled order within a cell
    counts = np.bincount(cell, minlength=n_groups * n_buckets)
    rank = np.empty(len(items), np.float64)
    rank[by_cell] = np.arange(len(items)) - np.repeat(np.cumsum(counts) - counts, counts)
    rank += 0.5
    rank /= counts[cell]
    rank *= 1 - np.minimum(TAIL_LAG, lag.ravel()[cell])
    return items[np.lexsort((rank, group))]


def arrivals(occ: np.ndarray, quota: np.ndarray, sizes: np.ndarray, of_bucket: np.ndarray):
    """(item, group, pass, bucket int32; horizon float64) of every position in due order:
    occ holds the epoch's items group after group (:func:`occurrences`); the j-th of
    group g is in its pass j // n_g, due at (j + 1/2) / q_g; horizon: positions until
    its group's next pass starts (-1 in its last pass)."""
    n = len(occ)
    pick = merge_by_due(quota)
    group = np.repeat(np.arange(len(quota), dtype=np.int32), quota)[pick]
    j = pick - np.repeat(np.cumsum(quota) - quota, quota)[pick]
    size = np.maximum(1, sizes)[group]
    k = j // size
    horizon = (size - 1 - j % size) * (n / np.maximum(1, quota))[group]
    horizon[k == ((quota - 1) // np.maximum(1, sizes))[group]] = -1.0
    item = occ[pick]
    return item, group, k.astype(np.int32), of_bucket[item].astype(np.int32), horizon


def balanced_layout(
    groups: Groups,
    weights: np.ndarray,
    of_bucket: np.ndarray,
    buckets: Sequence[Bucket],
    text: np.ndarray,
    seed: int,
    epoch: int,
) -> EpochLayout:
    """The whole epoch `epoch`: quotas, each group's walk, its clips in due order dealt
    into batches pass by pass (pass_deal.py). weights: from group_weights."""
    n = len(groups.of_item)
    quota = quotas(weights, n, seed, epoch)
    sizes = np.maximum(1, groups.sizes)
    per_group = np.zeros((len(quota), len(buckets)))
    np.add.at(per_group, (groups.of_item, of_bucket), 1)
    rate = (per_group * (quota / sizes)[:, None]).sum(axis=0) / n  # clips per position
    rows = np.array([b.rows for b in buckets], np.float64)
    lag = (rows / np.maximum(rate, 1e-12))[None, :] / (n / np.maximum(1, quota))[:, None]
    lag /= sizes[:, None]  # a batch's fill time over the pass's positions
    items, starts = shuffled_groups(groups, seed, epoch)
    occ = occurrences(pass_orders(items, starts, of_bucket, lag), starts, quota)
    del items
    from ringfeed.consumer.stager.plan import pass_deal  # numba: 0.25 s to import, so here

    return pass_deal.deal(
        buckets, text, rate, len(quota), *arrivals(occ, quota, groups.sizes, of_bucket)
    )


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
