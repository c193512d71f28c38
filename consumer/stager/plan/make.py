"""make_plan: the plan a config asks for, made of its parts, with its fingerprint.

Called once by the stager (consumer/stager/stager.py build), and by tests. The
parts (consumer/stager/plan/__init__.py): a Shuffle of the items, or the tar
shards dealt in windows (data.shard_window); with length buckets, balance or
several training workers, batches cut by BucketBatches or BalancedBatches (one
bucket of the fixed shape when buckets are off); and this worker's Share. The
fingerprint (shared/run/fingerprint.py) is computed here once, before the plan
exists, and is the same for any number of workers.
"""

from __future__ import annotations

import logging

import numpy as np

from ringfeed.consumer.stager.plan import balance
from ringfeed.consumer.stager.plan.buckets import (
    Bucket,
    BucketBatches,
    length_table,
    make_buckets,
)
from ringfeed.consumer.stager.plan.layout import EpochSource
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shard_window import ShardWindows, WindowedBatches, shard_windows
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.plan.skips import known_skips
from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.run.fingerprint import plan_fingerprint
from ringfeed.shared.run.id_tables import IdTables, corpus_tables
from ringfeed.shared.run.share import ONE_WORKER, Share

log = logging.getLogger(__name__)


def make_plan(
    cfg: Config, index: CorpusIndex, share: Share = ONE_WORKER, tables: IdTables | None = None
) -> Plan:
    """The stager's plan. tables: the run's id tables (balance groups; read from the
    corpus when None); share: this worker's, of one global plan whose batches are fixed
    ranges of positions, whose buckets have this worker's rows of each global batch. The
    length table is the one preparation measured (buckets.py length_table)."""
    st = cfg.stager
    windows = shard_windows(cfg, index) if cfg.data.shard_window else None
    # the window decides the order: a resume with another is refused
    window_part = [(0, cfg.data.shard_window)] if windows else []
    if not st.bucketed and share.count == 1 and not st.balance.on:
        fingerprint = plan_fingerprint(cfg, index, window_part, [])
        return Plan(windows or Shuffle(index.n_items, st.seed), st.epochs, share, fingerprint)
    grouping = balance_groups(cfg, index, tables) if st.balance.on else None
    drawn = balance.drawn(*grouping) if grouping else None
    buckets, of_item, lengths, text = length_buckets(cfg, index, drawn)
    # Buckets off and no balance: the positions are the shuffle's whatever the workers, so
    # the fixed shape the shares are cut from is no part of the plan, as with one worker.
    shapes = [(b.frames, b.text, b.rows) for b in buckets] if st.bucketed or st.balance.on else []
    fingerprint = plan_fingerprint(cfg, index, window_part + shapes, lengths)
    if grouping:
        source, balance_part = balanced(cfg, index, grouping, buckets, of_item, text, windows)
        fingerprint = fingerprint | balance_part
    elif windows:
        source = WindowedBatches(windows, buckets, of_item, text, None)
    else:
        source = BucketBatches(Shuffle(index.n_items, st.seed), buckets, of_item, text)
    check_share(cfg, buckets, share)
    plan = Plan(source, st.epochs, share, fingerprint)
    if share.count > 1:
        log.info(
            "worker %d of %d: rows %d, %d, ... of every global batch (%s rows per batch); "
            "epoch 0 leaves %d of %d items to nobody (global batches smaller than %d)",
            share.index,
            share.count,
            share.index,
            share.index + share.count,
            "/".join(str(b.rows) for b in plan.buckets),
            plan.remainder(0),
            index.n_items,
            share.count,
        )
    return plan


def length_buckets(
    cfg: Config, index: CorpusIndex, drawn: np.ndarray | None = None
) -> tuple[list[Bucket], np.ndarray, list[np.ndarray], np.ndarray | None]:
    """(the buckets, each item's bucket index, the length arrays the fingerprint hashes,
    each item's tokens or None): by the length table with stager.buckets or
    auto_buckets (drawn: each item's expected positions an epoch, for auto_buckets of a
    balanced plan), else one bucket of the fixed shape that every item is in."""
    st = cfg.stager
    if st.bucketed:
        table = length_table(cfg, index)
        buckets, of_item = make_buckets(cfg, table, drawn)
        lengths, text = [table.frames, table.text], table.text
    else:
        buckets = [Bucket(cfg.features.max_frames, cfg.text.max_text_len, st.batch_size)]
        of_item, lengths, text = np.zeros(index.n_items, np.int32), [], None
    counts = np.bincount(of_item, minlength=len(buckets))
    log.info(
        "length buckets: %s",
        ", ".join(
            f"{b.frames} frames x {b.rows} rows, text {b.text} ({n} items)"
            for b, n in zip(buckets, counts, strict=True)
        ),
    )
    return buckets, of_item, lengths, text


def balance_groups(
    cfg: Config, index: CorpusIndex, tables: IdTables | None
) -> tuple[balance.Groups, np.ndarray]:
    """(the groups of stager.balance.by, the items a run is known to skip left out of
    them (skips.py), their integer weights)."""
    b = cfg.stager.balance
    groups = balance.plan_groups(
        b, tables or corpus_tables(cfg, index), index, known_skips(cfg, index)
    )
    return groups, balance.group_weights(
        groups.sizes, b.temperature, balance.named_weights(b, groups)
    )


def balanced(
    cfg: Config,
    index: CorpusIndex,
    grouping: tuple[balance.Groups, np.ndarray],
    buckets: list[Bucket],
    of_item: np.ndarray,
    text: np.ndarray | None,
    windows: ShardWindows | None = None,
) -> tuple[EpochSource, dict[str, str]]:
    """The balanced part (stager.balance; within each shard window with windows) and its
    part of the plan fingerprint."""
    b, st = cfg.stager.balance, cfg.stager
    groups, weights = grouping
    source = balance.BalancedBatches(st.seed, buckets, of_item, groups, weights, text)
    quota = "; ".join(balance.describe(groups, source.quotas(0)))
    if windows:
        multipliers = balance.named_weights(b, groups)
        source = WindowedBatches(
            windows, buckets, of_item, text, (groups, b.temperature, multipliers)
        )
    skipped = index.n_items - groups.usable
    log.info(
        "balanced epochs by %s (temperature %g): %d positions per epoch%s; epoch 0: %s",
        b.by,
        b.temperature,
        index.n_items,
        f" ({skipped} of them the clips the length table says every run skips, one each)"
        if skipped
        else "",
        quota,
    )
    return source, {"balance": balance.balance_hash(groups, weights, b.by, b.temperature)}


def check_share(cfg: Config, buckets: list[Bucket], share: Share) -> None:
    """ConfigError when the global plan cannot be shared by share.count workers."""
    if share.count == 1:
        return
    if not cfg.stager.deterministic:  # out of order, a batch may take another batch's positions
        raise ConfigError(
            "stager.deterministic: several training workers need it true, so "
            "that every worker takes its part of the same global batch"
        )
    if any(b.rows < share.count for b in buckets):  # its every batch would go to nobody
        raise ConfigError(
            f"stager.batch_frames: a global batch of {min(b.rows for b in buckets)} rows "
            f"cannot give each of {share.count} workers a row: raise stager.batch_size "
            "(or stager.batch_frames)"
        )


def compile_kernels() -> None:
    """Build a small balanced, bucketed plan, so that numba compiles and caches the
    balanced plan's kernels now (scripts/setup.sh): about 15 s once per install, which
    a run's stager would otherwise spend before its first grant."""
    from ringfeed.shared.config import config_from_dict
    from ringfeed.shared.corpus.open import open_prepared

    stager = {"batch_size": 4, "balance": {"by": "language"}}
    cfg = config_from_dict(
        {"data": {"format": "synthetic", "synthetic_items": 64}, "stager": stager}
    )
    make_plan(cfg, open_prepared(cfg)).item_at(0)
