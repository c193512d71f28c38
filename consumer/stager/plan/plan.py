"""The plan: plan positions -> (epoch, item), their batches and this worker's share.

Positions. The plan is the endless concatenation of epochs; plan position p is
epoch ``p // n_items`` and item ``layout(epoch).order[p % n_items]``, where the
layout comes from the plan's part (consumer/stager/plan/__init__.py lists them).
A cursor is one position, so resuming is O(1) (docs/design.md#contract-4).

Batches. When the part cuts batches (length buckets, balance, several workers), a
batch is a fixed range of positions (:meth:`Plan.batch_at`) of one bucket; this
worker's batches have its share's rows of each (:attr:`Plan.buckets`). Otherwise a
batch is the next stager.batch_size samples to finish (:attr:`Plan.batched` False).

Shares. With several training workers, this worker's positions are its rows of every
global batch (shared/run/share.py); the others are passed over (:meth:`Plan.next_owned`).

The fingerprint (shared/run/fingerprint.py) is given when the plan is made, by
make.py, and never changes: the stager sends it in its WELCOMEs, and a consumer
resuming with another is refused (consumer/stager/consumer_side.py).

One object for every part of the stager that needs the plan (the slot ledger,
the intake, delivery, the consumer side, the stats), and for tests and
benchmarks that check what a run delivered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from ringfeed.consumer.stager.plan.buckets import Bucket
from ringfeed.consumer.stager.plan.layout import EpochLayout, EpochSource, kept_epochs
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.run.share import ONE_WORKER, Share


class Plan:
    """Positions, batches and this worker's share over one part that orders epochs."""

    def __init__(
        self,
        source: EpochSource,
        epochs: int = 0,
        share: Share = ONE_WORKER,
        fingerprint: Mapping[str, str] | None = None,
    ) -> None:
        """source: the part that orders each epoch; epochs: how many (0: no end);
        share: this worker's (several workers need a part that cuts batches);
        fingerprint: per plan part, the hash of what decides the plan."""
        if source.n_items <= 0:
            raise ConfigError(
                "data.path: the dataset has no usable items; see quarantine.jsonl for why"
            )
        if share.count > 1 and not source.buckets:
            raise ValueError(f"{share}: a share of several workers needs batches to share")
        self.source, self.epochs, self.share = source, epochs, share
        self.n_items = source.n_items
        self.end = epochs * self.n_items if epochs > 0 else None
        # This worker's batch shapes: its share's rows of each global batch's bucket.
        self.buckets: list[Bucket] = [replace(b, rows=share.rows(b.rows)) for b in source.buckets]
        self.fingerprint: Mapping[str, str] = MappingProxyType(dict(fingerprint or {}))
        self._layouts: dict[int, EpochLayout] = {}
        self.kept = kept_epochs(source)

    @property
    def batched(self) -> bool:
        """Is every batch a fixed range of positions (batch_at)?"""
        return bool(self.buckets)

    @property
    def lockstep(self) -> bool:
        """Do several training workers train each global batch together? Then every
        worker sends one batch per global batch, an empty one too, and its cursor is
        the end of the global batch it last sent (consumer/stager/delivery.py)."""
        return self.share.count > 1

    def with_share(self, share: Share) -> Plan:
        """The same plan for another worker's share (tests walk every worker's)."""
        return Plan(self.source, self.epochs, share, self.fingerprint)

    def layout(self, epoch: int) -> EpochLayout:
        """Epoch `epoch` as the part orders it; the kept_epochs(source) epochs nearest the
        one asked for are kept."""
        if epoch not in self._layouts:
            while len(self._layouts) >= self.kept:
                self._layouts.pop(max(self._layouts, key=lambda e: abs(e - epoch)))
            self._layouts[epoch] = self.source.layout(epoch)
        return self._layouts[epoch]

    def item_at(self, position: int) -> int:
        epoch, offset = divmod(position, self.n_items)
        return int(self.layout(epoch).order[offset])

    def items_at(self, positions: np.ndarray) -> np.ndarray:
        """item_at of every position (int64 [n], ascending): the items of a batch at once,
        an epoch's layout looked up once."""
        if not len(positions):
            return np.zeros(0, np.int64)
        first, last = int(positions[0]) // self.n_items, int(positions[-1]) // self.n_items
        out = np.empty(len(positions), np.int64)
        for epoch in range(first, last + 1):  # one, or two where a batch spans epochs
            at = positions // self.n_items == epoch if last > first else slice(None)
            out[at] = self.layout(epoch).order[positions[at] - epoch * self.n_items]
        return out

    def epoch_of(self, position: int) -> int:
        return position // self.n_items

    def batch_at(self, position: int) -> tuple[int, int, int]:
        """(bucket index, first position, position after the last) of the global batch
        that holds plan position `position`; a batched plan only."""
        epoch, offset = divmod(position, self.n_items)
        layout = self.layout(epoch)
        starts, buckets = layout.starts, layout.buckets
        if starts is None or buckets is None:
            raise ValueError("batch_at: this plan cuts no batches (Plan.batched is False)")
        k = int(np.searchsorted(starts, offset, side="right")) - 1
        end = int(starts[k + 1]) if k + 1 < len(starts) else self.n_items
        base = epoch * self.n_items
        return int(buckets[k]), base + int(starts[k]), base + end

    def bucket_at(self, position: int) -> Bucket:
        """This worker's batch shape for the batch that holds `position` (batched)."""
        return self.buckets[self.batch_at(position)[0]]

    def owns(self, position: int) -> bool:
        """Is `position` this worker's? Every one is, with one worker."""
        if self.share.count == 1:
            return True
        _, first, end = self.batch_at(position)
        k, n = self.share.index, self.share.count
        return end - first >= n and (position - first) % n == k

    def next_owned(self, position: int) -> int:
        """The first position at or after `position` of this worker's share (the plan's
        end if none is left): O(1) within a batch, one step per batch it passes over."""
        k, n = self.share.index, self.share.count
        if n == 1:
            return position
        start = position
        while self.end is None or position < self.end:
            _, first, end = self.batch_at(position)
            if end - first >= n:
                mine = first + k + max(0, -(-(position - first - k) // n)) * n
                if mine < end:
                    return mine
            position = end
            if position - start > 2 * self.n_items:  # a whole epoch without a batch of n
                raise ConfigError(
                    f"--worker: no global batch of epoch {self.epoch_of(start)} has {n} items "
                    f"for the {n} workers (a dataset of {self.n_items}): use fewer workers"
                )
        return self.end

    def remainder(self, epoch: int) -> int:
        """Items of `epoch` in global batches too small to give every worker a row."""
        starts = self.layout(epoch).starts
        if starts is None:
            return 0
        sizes = np.diff(np.append(starts, self.n_items))
        return int(sizes[sizes < self.share.count].sum())
