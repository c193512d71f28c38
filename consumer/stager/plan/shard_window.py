"""The shard-aware epoch order, for tar shards on object storage (data.shard_window).

With the default plan every epoch is a permutation of all items, so consecutive
grants fall in random shards and a producer whose shard cache holds C of S
shards fetches a whole shard for about (1 - C/S) of its items. With
``data.shard_window: W`` the epoch is: the shards in a random order, then, window
by window of W shards, the items of those shards in a random order. A shard is
then needed during one window only, and a shard cache that holds W shards (and
the few a window boundary overlaps) fetches each shard about once per epoch.

Still a pure function of seed and epoch, so it is deterministic, a resume is one
plan position (O(1)), and exactly-once holds as with any permutation. Items are
mixed within a window of W shards only: shuffle the clips across shards when
packing them (webdataset's advice too), or raise W as far as the cache allows.
A part of the plan (layout.py EpochSource), made by make.py when buckets and balance
are off and the stager serves the only training worker; the other combinations are
refused for now (BucketBatches could deal its order as it deals a Shuffle's).
"""

from __future__ import annotations

import numpy as np

from ringfeed.consumer.stager.plan.layout import KEPT_EPOCHS, EpochLayout
from ringfeed.shared.config import Config
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.corpus.index import CorpusIndex


class ShardWindows:
    """Epochs that deal tar shards in windows (module docstring); no batches.
    shard_starts: int [n_shards + 1], the first item of each shard and n_items."""

    buckets = ()
    kept = KEPT_EPOCHS

    def __init__(self, seed: int, shard_starts: np.ndarray, window: int) -> None:
        self.starts = np.asarray(shard_starts, np.int64)
        self.n_items = int(self.starts[-1])
        self.seed, self.window = seed, window

    def layout(self, epoch: int) -> EpochLayout:
        rng = np.random.default_rng([self.seed, epoch, 21])  # not the default plan's stream
        order = rng.permutation(len(self.starts) - 1)
        dtype = np.int32 if self.n_items < 2**31 else np.int64
        parts = []
        for w in range(0, len(order), self.window):
            items = np.concatenate(
                [
                    np.arange(self.starts[s], self.starts[s + 1], dtype=dtype)
                    for s in order[w : w + self.window]
                ]  # fmt: skip
            )
            rng.shuffle(items)
            parts.append(items)
        return EpochLayout(np.concatenate(parts) if parts else np.zeros(0, dtype))


def shard_windows(cfg: Config, index: CorpusIndex, bucketed: bool, workers: int) -> ShardWindows:
    """The order of data.shard_window (> 0); ConfigError for what it cannot serve."""
    window = cfg.data.shard_window
    starts = index.shard_starts
    if starts is None:
        raise ConfigError("data.shard_window: the corpus is not tar shards (data.format: "
                          "shards): set it to 0")  # fmt: skip
    if bucketed or workers > 1:
        raise ConfigError("data.shard_window: not yet with length buckets or several "
                          "training workers: set it to 0 there")  # fmt: skip
    return ShardWindows(cfg.stager.seed, starts, window)
