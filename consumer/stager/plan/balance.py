"""Balanced epochs without replacement: quotas per group, interleaved, bucketed, exact.

``stager.balance.by`` (language or speaker) splits the corpus into groups; each
epoch gives group g a quota q_g of plan positions, and the epoch is exactly as
long as the corpus (n_items positions: every position arithmetic of the plan,
the cursor and the shares stays as it is). Everything below is a pure function
of (seed, epoch, temperature, weights, the items' groups, their buckets), built
with numpy and numba over int32 arrays, never a Python object per item
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
(group_walk.py) spreads each bucket's clips of the group evenly over the
pass, those of slow buckets a little earlier.

Interleaved, bucketed, in delivery order. The groups' positions are merged by
due time, the j-th of q_g at (j + 1/2) / q_g (group_walk.py: whoever is
furthest behind its target goes next), and at each a clip of its group's pass is
dealt into batches of one length bucket each (one bucket of the fixed shape without
buckets) pass by pass (pass_deal.py): in delivery order no clip of a group comes a
(k+1)-th time before every clip of its group came k times, across buckets and the
leftovers. A turn deals the walk's next clip of its pass, or another of the pass whose
batch suits the pass's end better; a clip that would otherwise wait in a slow bucket's
batch past its group's next pass rides in a longer bucket's batch; the epoch ends with
a few part-filled batches, as BucketBatches' do.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.plan.buckets import Bucket
from ringfeed.consumer.stager.plan.layout import EpochLayout
from ringfeed.consumer.stager.plan.skips import known_skips
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
# The balanced order's version, in the fingerprint: a run begun under another (2: the
# pass-by-pass dealing; 3: its clips picked as dealt, and straddle buckets) is refused on
# resume, naming the balance, instead of served another order mid-epoch.
ORDER = 3
# Groups a log line or validate names at most (the largest quotas; the rest counted).
MAX_NAMES_SHOWN = 12
# The most of a pass by which a clip of a slow bucket comes earlier in its group's walk
# (group_walk.pass_order): 0.5 kept every window of 10 batches within 0.1 of its target on the
# lopsided test corpus at temperatures 0, 0.3 and 1; 0 and 0.9 did not at 0.
TAIL_LAG = 0.5


@dataclass(frozen=True)
class Groups:
    """Each item's group (int32 [n_items], ids into names), the group names, and the items
    a run is known to skip (bool [n_items], skips.py; None: none known). A skipped item
    belongs to no group: it keeps one position an epoch, its own, and is skipped there."""

    of_item: np.ndarray
    names: tuple[str, ...]
    skipped: np.ndarray | None = None

    @functools.cached_property
    def sizes(self) -> np.ndarray:
        """Items per group, those known to be skipped left out (int64 [groups]); counted
        once (bincount casts to int64)."""
        kept = None if self.skipped is None else ~self.skipped
        counts = np.bincount(self.of_item, weights=kept, minlength=len(self.names))
        return counts.astype(np.int64)

    @property
    def usable(self) -> int:
        """The positions the groups share an epoch: one per item not known to be skipped."""
        return int(self.sizes.sum())


def plan_groups(
    balance: BalanceConfig,
    tables: IdTables,
    index: CorpusIndex,
    skipped: np.ndarray | None = None,
) -> Groups:
    """The groups of stager.balance.by: the run's speaker or language ids (the tables the
    stager built once, shared/run/id_tables.py), one int32 per item; skipped: the items
    a run is known to skip (skips.py known_skips), or None. Where every item is skipped
    nothing is left out (each run would skip them all alike, as before)."""
    speakers, languages = tables.item_ids(index)
    if skipped is not None and (skipped.all() or not skipped.any()):
        skipped = None
    if balance.by == "speaker":
        return Groups(speakers, tables.speakers, skipped)
    return Groups(languages, tables.languages, skipped)


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
    groups = plan_groups(b, tables, index, known_skips(cfg, index))
    weights = group_weights(groups.sizes, b.temperature, named_weights(b, groups))
    quota = quotas(weights, groups.usable, cfg.stager.seed, 0)
    head = (
        f"  balance       by {b.by}, temperature {b.temperature:g}: {index.n_items} "
        f"positions an epoch (as many as clips), epoch 0:"
    )
    lines = [head] + [f"    {line}" for line in describe(groups, quota)]
    skipped = index.n_items - groups.usable
    if skipped:
        lines.append(
            f"    {skipped} clips the length table says every run skips (no tokens, too "
            "long or short, out of their speaking-rate band) keep one position each, "
            "skipped; their groups' quotas go to their other clips"
        )
    return lines + crowded_lines(groups, quota, cfg.grants_in_flight, b.by)


def crowded_lines(groups: Groups, quota: np.ndarray, slots: int, by: str) -> list[str]:
    """validate's warnings for the groups whose share of the grants in flight (the
    look-ahead's rows, Config.grants_in_flight) is more than their clips: a clip has one
    grant at a time (the stager's order), so their grants wait for earlier copies to be
    delivered and the ring runs below its depth while they are due."""
    share = quota / max(1, int(quota.sum()))
    crowded = np.flatnonzero(share * slots > groups.sizes)
    lines = []
    for g in crowded[np.argsort(-share[crowded], kind="stable")][:MAX_NAMES_SHOWN]:
        lines.append(
            f"    warning: {by} {groups.names[g] or '(unnamed)'} has {int(groups.sizes[g])} "
            f"clips but {100 * share[g]:.1f} % of the epoch, about {share[g] * slots:.0f} of "
            f"the {slots} grants in flight (ring.lookahead): a clip has one grant at a time, so "
            "its grants wait for earlier copies (the ring runs shallower while it is due); "
            "raise stager.balance.temperature or lower its weight to give it fewer positions"
        )
    more = len(crowded) - len(lines)
    return lines + ([f"    ... and {more} more groups like it"] if more > 0 else [])


def drawn(groups: Groups, weights: np.ndarray) -> np.ndarray:
    """Each item's expected positions an epoch (float64 [n]): its group's exact share of
    the epoch over its clips, u x w_g / sum(w) / n_g (u: the positions the groups share,
    n_g: the group's clips not known to be skipped), 0 for a skipped one; what
    auto_buckets fit a balanced plan to (buckets.py bucket_lengths)."""
    w = np.asarray(weights, np.float64)
    per_clip = groups.usable * w / max(w.sum(), 1.0) / np.maximum(1, groups.sizes)
    out = per_clip[np.asarray(groups.of_item)]
    if groups.skipped is not None:
        out[groups.skipped] = 0.0
    return out


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


def balanced_layout(
    groups: Groups,
    weights: np.ndarray,
    of_bucket: np.ndarray,
    buckets: Sequence[Bucket],
    text: np.ndarray,
    seed: int,
    epoch: int,
) -> EpochLayout:
    """The whole epoch `epoch`: quotas, each group's walk (one shuffle of all items,
    grouped) and its turns in due order (group_walk.py), a clip of its pass dealt into
    batches at each turn (pass_deal.py). weights: from group_weights."""
    # numba: 0.25 s to import, so only a balanced plan pays it
    from ringfeed.consumer.stager.plan import group_walk, pass_deal

    of_group = np.asarray(groups.of_item)  # a mapped index array as a whole (its map)
    n, n_buckets = len(of_group), len(buckets)
    quota = quotas(weights, groups.usable, seed, epoch)
    if groups.skipped is not None:  # one more group: the skipped items, one position each
        of_group = np.where(groups.skipped, len(quota), of_group).astype(np.int32)
        quota = np.append(quota, n - groups.usable)
    counts = np.bincount(of_group, minlength=len(quota)).astype(np.int64)
    sizes = np.maximum(1, counts)
    cell = of_group.astype(np.int64) * n_buckets + of_bucket
    cells = np.bincount(cell, minlength=len(quota) * n_buckets).reshape(len(quota), n_buckets)
    del cell
    rate = (cells * (quota / sizes)[:, None]).sum(axis=0) / n  # each bucket's clips per position
    period = n / np.maximum(1, quota)  # positions between a group's turns
    rows = np.array([b.rows for b in buckets], np.float64)
    lag = (rows / np.maximum(rate, 1e-12))[None, :] / (period * sizes)[:, None]
    perm = np.arange(n, dtype=np.int32)
    np.random.default_rng([seed, SHUFFLE_STREAM, epoch]).shuffle(perm)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items, item_buckets = group_walk.grouped(perm, of_group, of_bucket, len(quota))
    del perm
    lists, partial = group_walk.pass_order(items, item_buckets, starts, lag, TAIL_LAG, quota)
    del items, item_buckets
    first = starts[:-1, None] + np.cumsum(cells, axis=1) - cells
    walks = pass_deal.Walks(lists, first, cells, partial, lag > pass_deal.SLOW_LAG)
    # the dealing needs the turns (12 bytes a clip) and the walks (8)
    return pass_deal.deal(buckets, text, rate, walks, quota, *group_walk.arrivals(starts, quota, n))


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
        """Positions of each group in `epoch` (int64 [groups]) over the clips not known
        to be skipped; the known skips are not in these (each has one position of its
        own, outside every group: balanced_layout)."""
        return quotas(self.weights, self.groups.usable, self.seed, epoch)


def balance_hash(groups: Groups, weights: np.ndarray, by: str, temperature: float) -> str:
    """What decides the balance, for the plan fingerprint (shared/run/fingerprint.py): the
    groups' names, each item's group, the items known to be skipped, the weights, the
    temperature and ORDER."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{ORDER}|{by}|{temperature!r}|{'|'.join(groups.names)}".encode())
    h.update(np.ascontiguousarray(weights, np.int64).tobytes())
    h.update(np.ascontiguousarray(groups.of_item, np.int32).tobytes())
    if groups.skipped is not None:
        h.update(np.packbits(groups.skipped).tobytes())
    return h.hexdigest()
