"""The shard-aware epoch plan, for tar shards on object storage (data.shard_window).

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
Called by the stager (consumer/stager/stager.py make_plan) when buckets are off
and it is the only training worker; the stager refuses the other combinations.
"""

from __future__ import annotations

import numpy as np

from ringfeed.consumer.stager.plan import EpochPlan
from ringfeed.shared.config import Config
from ringfeed.shared.config.loader import ConfigError


class ShardWindowPlan(EpochPlan):
    """EpochPlan whose permutation deals shards in windows (module docstring).
    shard_starts: int [n_shards + 1], the first item of each shard and n_items."""

    def __init__(self, seed: int, epochs: int, shard_starts: np.ndarray, window: int) -> None:
        super().__init__(int(shard_starts[-1]), seed, epochs)
        self.starts = np.asarray(shard_starts, np.int64)
        self.window = window

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm:
            if len(self._perm) > 4:
                self._perm.pop(min(self._perm))
            self._perm[epoch] = self._deal(epoch)
        return self._perm[epoch]

    def _deal(self, epoch: int) -> np.ndarray:
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
        return np.concatenate(parts) if parts else np.zeros(0, dtype)


def shard_window_plan(cfg: Config, index: object, bucketed: bool, workers: int) -> ShardWindowPlan:
    """The plan for data.shard_window (> 0); ConfigError for what it cannot serve."""
    window = cfg.data.shard_window
    starts = index.shard_starts
    if starts is None:
        raise ConfigError("data.shard_window: the corpus is not tar shards (data.format: "
                          "shards): set it to 0")  # fmt: skip
    if bucketed or workers > 1:
        raise ConfigError("data.shard_window: not yet with length buckets or several "
                          "training workers: set it to 0 there")  # fmt: skip
    return ShardWindowPlan(cfg.stager.seed, cfg.stager.epochs, starts, window)
