"""Length buckets: batch shapes by clip length, with a frame budget per batch.

With ``stager.buckets`` (or ``stager.auto_buckets``) each item goes to the
shortest bucket its clip fits (by the length table, shared/corpus/lengths.py), and
each bucket has its own batch shape [rows, frames, n_mels] / [rows, text]:
frames is the bucket's length, text the longest text among its items, and rows
= stager.batch_frames // frames, so every batch holds about the same number of
frames and memory stays flat (short clips in big batches, long ones in small).

:class:`BucketBatches` is the part of the plan (layout.py EpochSource) that cuts
batches: per epoch, the items in another part's order (a Shuffle's, the seeded
permutation) are dealt to their buckets, and a bucket's batch is emitted when it
holds its rows; what is left at the end of the epoch goes out as partial batches,
longest bucket first. Plan positions follow the emitted order, so a batch is a
contiguous range of positions, and everything (which items, which batch, which
order) is a pure function of seed, epoch and length table: exactly-once, the cursor
and O(1) resume work as without buckets. Producers never know about buckets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.plan.layout import KEPT_EPOCHS, EpochLayout, EpochSource
from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.config.stager import MIN_BUCKET_FRACTION
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.lengths import Lengths, load_lengths

log = logging.getLogger(__name__)

# Bucket lengths and text lengths are rounded up to a multiple of this (friendlier
# shapes for the accelerator's kernels).
ALIGN = 8


@dataclass(frozen=True)
class Bucket:
    frames: int  # mel frames of its batch shape
    text: int  # tokens of its batch shape
    rows: int  # its batch size

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.rows, self.frames, self.text


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def bucket_lengths(cfg: Config, table: Lengths, drawn: np.ndarray | None = None) -> list[int]:
    """stager.buckets, or the stager.auto_buckets lengths that pad the length table's clips
    least (multiples of ALIGN, at least max_frames // MIN_BUCKET_FRACTION, the last
    max_frames). Quantiles, the usual choice, leave the first bucket spanning the short
    tail: on LJSpeech-shaped lengths they kept 84 % of frames real, this keeps 9x %.
    drawn: each clip's expected positions an epoch (a balanced plan's: a clip of an
    upsampled group counts more), so the buckets fit the epoch as drawn, not the corpus."""
    if cfg.stager.buckets:
        return list(cfg.stager.buckets)
    top = cfg.features.max_frames
    floor = max(1, top // MIN_BUCKET_FRACTION)
    frames = np.where(table.frames > 0, table.frames, top)
    padded = np.minimum(top, np.maximum(floor, -(-frames // ALIGN) * ALIGN))
    values, inverse = np.unique(np.append(padded, top), return_inverse=True)
    weight = np.ones(len(frames)) if drawn is None else np.asarray(drawn, np.float64)
    counts = np.bincount(inverse, weights=np.append(weight, 0.0))  # top: a bucket, counted or not
    return least_padding(values, counts, cfg.stager.auto_buckets)


def least_padding(values: np.ndarray, counts: np.ndarray, k: int) -> list[int]:
    """The <= k bucket lengths among `values` (ascending, the last included) that
    minimize the padded frames sum(count x (bucket - value)): dynamic programming over
    prefix sums, O(k x m^2) numpy work for m distinct values (m <= max_frames / ALIGN)."""
    m = len(values)
    n = np.concatenate([[0], np.cumsum(counts)])  # items among values[:j]
    s = np.concatenate([[0], np.cumsum(counts * values)])
    # cost[i, j]: the items of values[i..j] padded to values[j] (inf when i > j)
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    cost = np.where(i <= j, (n[j + 1] - n[i]) * values[j] - (s[j + 1] - s[i]), np.inf)
    best, came_from = cost[0].copy(), [np.zeros(m, int)]
    for _ in range(1, min(k, m)):
        # best ending at j with one more bucket: a bucket ending at i - 1, then i..j
        options = np.vstack([np.full(m, np.inf), best[:-1, None] + cost[1:]])
        options[0] = cost[0]  # or one bucket for all of 0..j
        came_from.append(np.argmin(options, axis=0))
        best = options.min(axis=0)
    lengths, j = [], m - 1
    for step in reversed(came_from):
        lengths.append(int(values[j]))
        start = int(step[j])
        if start == 0:
            break
        j = start - 1
    return sorted(set(lengths))


def assign(frames: np.ndarray, lengths: list[int]) -> np.ndarray:
    """Bucket index of each item: the shortest that fits it; unknown or too long
    lengths go to the last (the producer skips or truncates those as without buckets)."""
    index = np.searchsorted(np.asarray(lengths), frames, side="left")
    index[(frames <= 0) | (index >= len(lengths))] = len(lengths) - 1
    return index.astype(np.int32)


def make_buckets(
    cfg: Config, table: Lengths, drawn: np.ndarray | None = None
) -> tuple[list[Bucket], np.ndarray]:
    """(the buckets, each item's bucket index); drawn: see bucket_lengths."""
    lengths = bucket_lengths(cfg, table, drawn)
    of_item = assign(table.frames, lengths)
    buckets = []
    for b, frames in enumerate(lengths):
        texts = table.text[of_item == b]
        longest = int(texts.max()) if texts.size else 1
        text = min(cfg.text.max_text_len, _round_up(max(1, longest)))
        rows = min(cfg.max_batch_rows, max(1, cfg.batch_frames // frames))
        buckets.append(Bucket(frames, text, rows))
    return buckets, of_item


class BucketBatches:
    """Another part's epochs (`order`), dealt into batches of one length bucket each."""

    kept = KEPT_EPOCHS

    def __init__(
        self,
        order: EpochSource,
        buckets: list[Bucket],
        of_item: np.ndarray,
        text: np.ndarray | None = None,
    ) -> None:
        """order: the part whose epochs are dealt (a Shuffle in the stager); of_item:
        each item's bucket; text: its tokens (the length table's), so a leftover joins a
        longer bucket's batch only if its text fits there too."""
        self.order, self.buckets = order, buckets
        self.of_item = np.asarray(of_item).astype(np.int32, copy=False)  # bucket indices
        self.n_items = len(of_item)
        self.text = text if text is not None else np.zeros(len(of_item), np.int32)

    def layout(self, epoch: int) -> EpochLayout:
        return deal_batches(self.order.layout(epoch).order, self.of_item, self.buckets, self.text)


def deal_batches(
    permutation: np.ndarray, of_item: np.ndarray, buckets: list[Bucket], text: np.ndarray
) -> EpochLayout:
    """The permutation (int32: items, all of an epoch or of a shard window) dealt to its
    buckets: a bucket's batch leaves when its last row is dealt, so the full batches
    are in the order of their last item's place in the permutation (a sort of them,
    not a loop over items: 10**7 items took 3.3 s as a Python loop); the leftovers
    follow (:func:`leftover_batches`)."""
    rows = np.array([b.rows for b in buckets], np.int64)
    bucket = of_item[permutation].astype(np.uint8 if len(rows) <= 256 else np.int32)
    counts = np.bincount(bucket, minlength=len(rows))
    by_bucket = np.argsort(bucket, kind="stable")  # a radix sort: each bucket in deal order
    del bucket
    first = np.concatenate([[0], np.cumsum(counts)])
    full = counts // rows
    kinds = np.repeat(np.arange(len(rows)), full)
    index = np.arange(int(full.sum())) - np.repeat(np.cumsum(full) - full, full)
    head = first[:-1][kinds] + index * rows[kinds]  # each full batch's first in by_bucket
    leaves = by_bucket[head + rows[kinds] - 1]  # where its last item is dealt
    pick = np.argsort(leaves, kind="stable")
    kinds, head = kinds[pick], head[pick]
    sizes = rows[kinds]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    order = np.empty(len(permutation), np.int32)
    done = int(starts[-1])
    at = np.arange(done, dtype=np.int64) + np.repeat(head - starts[:-1], sizes)
    order[:done] = permutation[by_bucket[at]]
    rest = [
        permutation[by_bucket[first[b] + full[b] * rows[b] : first[b + 1]]]
        for b in reversed(range(len(rows)))
    ]
    tail_starts, tail_kinds = leftover_batches(rest, buckets, text)
    order[done:] = np.concatenate(rest) if rest else []
    return EpochLayout(
        order,
        np.concatenate([starts[:-1], np.asarray(tail_starts, np.int64) + done]),
        np.concatenate([kinds, np.asarray(tail_kinds, np.int64)]).astype(np.int64),
    )


def leftover_batches(rest: list[np.ndarray], buckets: list[Bucket], text: np.ndarray):
    """(starts, buckets) of the epoch's last, part-filled batches over the leftovers
    (`rest`: each bucket's, longest first, in deal order): they share batches, a
    shorter clip taking a longer bucket's row when its text fits there too, so the
    epoch ends with few part-filled batches instead of one per bucket. Fewer than a
    batch per bucket: a Python loop."""
    starts, kinds, room, at = [], [], 0, 0
    for part, b in zip(rest, reversed(range(len(buckets))), strict=True):
        for item in part.tolist():
            shape = buckets[kinds[-1]] if room else None
            if shape is None or text[item] > shape.text:
                starts.append(at)
                kinds.append(b)
                room = buckets[b].rows
            at += 1
            room -= 1
    return starts, kinds


def length_table(cfg: Config, index: CorpusIndex, needed_by: str = "stager.buckets") -> Lengths:
    """The length table preparation measured (producer/prepare/prepare.py); ConfigError,
    naming needed_by (the key that asked for it: buckets, or data.outliers' band) and
    what to run, when it is missing or stale. Nothing is measured here: the stager never
    starts preparation."""
    table, stale = load_lengths(cfg, index)
    if stale.any():
        raise ConfigError(
            f"{needed_by}: the length table of {index.location} lacks {int(stale.sum())} of "
            f"{index.n_items} items (the corpus is not prepared, or it or a length setting "
            "changed since): run `ringfeed prepare CONFIG` first (`ringfeed run` does)"
        )
    return table
