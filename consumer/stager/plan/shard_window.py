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
A part of the plan (layout.py EpochSource), made by make.py. With length buckets,
balance or several training workers, :class:`WindowedBatches` cuts each window into
batches on its own: its items dealt to their buckets (buckets.py deal_batches), or
with stager.balance its groups balanced within it (balance.py balanced_layout over
the window's items: quotas from the groups' sizes in the window, each clip at most
once a pass before its group's others came, the ratios per window of batches), its
leftovers in a few part-filled batches at the window's end. So a window's batches
hold only its shards' items (the cache's bound holds), the plan is batches of fixed
positions (shares, the cursor and O(1) resume as with any batched plan), and each
item comes exactly once an epoch without balance. What balance can promise inside
a window: a group absent from the window's shards cannot be drawn there, and a
group's share is its share of the window's clips, weighted; pack shards with every
group spread over them (webdataset's advice) and the windows' shares are the
corpus's. The cost: one or two part-filled batches per window (padding) where the
plain bucketed plan has them once an epoch.
"""

from __future__ import annotations

import numpy as np

from ringfeed.consumer.stager.plan.balance import Groups, balanced_layout, group_weights
from ringfeed.consumer.stager.plan.buckets import Bucket, deal_batches
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
        parts = self.windows(epoch)
        return EpochLayout(np.concatenate(parts) if parts else np.zeros(0, np.int32))

    def windows(self, epoch: int) -> list[np.ndarray]:
        """Each window's items, shuffled, in the epoch's order of windows."""
        rng = np.random.default_rng([self.seed, epoch, 21])  # not the default plan's stream
        order = rng.permutation(len(self.starts) - 1)
        dtype = np.int32 if self.n_items < 2**31 else np.int64
        parts = []
        for w in range(0, len(order), self.window):
            items = np.concatenate(
                [
                    np.arange(self.starts[s], self.starts[s + 1], dtype=dtype)
                    for s in order[w : w + self.window]
                ]
            )
            rng.shuffle(items)
            parts.append(items)
        return parts


class WindowedBatches:
    """ShardWindows' epochs, each window cut into batches on its own (module docstring).
    balanced: (the groups, temperature, each group's weight multiplier) or None."""

    kept = KEPT_EPOCHS

    def __init__(
        self,
        windows: ShardWindows,
        buckets: list[Bucket],
        of_item: np.ndarray,
        text: np.ndarray | None,
        balanced: tuple[Groups, float, list[float]] | None,
    ) -> None:
        self.windows, self.buckets, self.balanced = windows, buckets, balanced
        self.of_item = np.asarray(of_item).astype(np.int32, copy=False)
        self.n_items = windows.n_items
        self.text = text if text is not None else np.zeros(self.n_items, np.int32)

    def layout(self, epoch: int) -> EpochLayout:
        orders, starts, kinds, done = [], [], [], 0
        parts = self.windows.windows(epoch)
        for w, items in enumerate(parts):
            if self.balanced is None:
                part = deal_batches(items, self.of_item, self.buckets, self.text)
                order = part.order
            else:
                part = self._balanced(items, epoch * len(parts) + w)
                order = items[part.order]
            orders.append(order)
            starts.append(part.starts + done)
            kinds.append(part.buckets)
            done += len(order)
        return EpochLayout(
            np.concatenate(orders).astype(np.int32), np.concatenate(starts), np.concatenate(kinds)
        )

    def _balanced(self, items: np.ndarray, stream: int) -> EpochLayout:
        """The window balanced on its own (local item numbers: places in `items`)."""
        groups, temperature, multipliers = self.balanced
        skipped = None if groups.skipped is None else groups.skipped[items]
        if skipped is not None and (skipped.all() or not skipped.any()):
            skipped = None
        local = Groups(np.asarray(groups.of_item)[items].astype(np.int32), groups.names, skipped)
        weights = group_weights(local.sizes, temperature, multipliers)
        return balanced_layout(
            local,
            weights,
            self.of_item[items],
            self.buckets,
            self.text[items],
            self.windows.seed,
            stream,
        )


def shard_windows(cfg: Config, index: CorpusIndex) -> ShardWindows:
    """The order of data.shard_window (> 0); ConfigError for a corpus of no shards."""
    starts = index.shard_starts
    if starts is None:
        raise ConfigError(
            "data.shard_window: the corpus is not tar shards (data.format: shards): set it to 0"
        )
    return ShardWindows(cfg.stager.seed, starts, cfg.data.shard_window)
