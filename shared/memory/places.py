"""Places: where one sample is written, and how.

A place is a row of a batch-ring slot (the sample is written straight into the batch it
will be delivered in: docs/design.md#rows-written-once) or a slot of the spare ring (for
what cannot be written where it is delivered: the stager copies it in). Producers write
their samples here (producer/process/slot_writer.py) and so does the stager for a remote
producer's rows and for each copy (consumer/stager/intake.py, consumer/stager/assembly.py):
one definition of where a place's fields lie and of how a sample is written into them.

Writing a sample: the used rows of each field, in ring order, copied, checked and hashed
in one pass (shared/memory/row_pass.py); into a batch row, the field's pad value after
them too (the batch is delivered as it lies); into a spare, the rows past the sample's
length are left as they were (the stager copies used rows only).
The seal protocol around a write is the caller's: ``writing_generation`` before,
``sealed_generation`` after (shared/memory/ring.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ringfeed.shared.memory.batch_ring import batch_views
from ringfeed.shared.memory.ring import Ring
from ringfeed.shared.memory.row_pass import check_fields
from ringfeed.shared.sample.schema import SampleSchema


class Places:
    """The places of one run: rows of the batch ring's slots (batches may be None where
    only spares are written, or the batch ring's fields are not the sample's: stager
    mels) and the spare ring's slots. names: the sample fields, in ring order."""

    def __init__(self, batches: Ring | None, spares: Ring, schema: SampleSchema) -> None:
        self.batches, self.spares, self.schema = batches, spares, schema
        self.names = tuple(f.name for f in schema.fields)
        self.pads = tuple(f.pad for f in schema.fields)
        self.rows_per_slot = batches.rows_per_slot if batches is not None else 0
        self._views: dict[tuple[int, tuple[int, int, int]], dict[str, np.ndarray]] = {}

    def batch(self, slot: int, shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
        """The views of a batch of `shape` in batch slot `slot` (batch_views), kept."""
        key = (slot, shape)
        views = self._views.get(key)
        if views is None:
            assert self.batches is not None
            flat = {name: self.batches.view(name)[slot] for name in self.batches.fields}
            views = self._views[key] = batch_views(flat, *shape, self.schema)
        return views

    def fields(self, slot: int, shape: tuple[int, int, int], index: int) -> list[np.ndarray]:
        """The sample fields of one place, ring order: row `index` of the batch of `shape`
        in batch slot `slot`, or (slot -1) spare slot `index`."""
        if slot < 0:
            return [self.spares.view(name)[index] for name in self.names]
        views = self.batch(slot, shape)
        return [views[name][index] for name in self.names]

    def record(self, slot: int, index: int) -> np.ndarray:
        """The place's SLOT_DTYPE record (a one-element view, writable)."""
        if slot < 0:
            return self.spares.slots[index : index + 1]
        k = slot * self.rows_per_slot + index
        assert self.batches is not None
        return self.batches.rows[k : k + 1]

    def limits(self, slot: int, shape: tuple[int, int, int], mel: bool = False) -> list[int]:
        """Rows each sample field may hold for a place granted with this batch's shape
        (a spare's too: the batch its position is delivered in), or any bucket's
        (SPARE_SHAPE): the most a READY may claim; mel: for a sample whose wave field
        holds its cached mel (shared/sample/marks.py MEL)."""
        _, frames, text = shape
        return self.schema.place_limits(frames, text, mel)

    def forget(self) -> None:
        """Before the rings are unmapped: no view of them may outlive the map."""
        self._views.clear()


def write_sample(
    dst: Sequence[np.ndarray],
    arrays: Sequence[np.ndarray],
    pads: Sequence[float] | None,
    names: Sequence[str],
    vocab_size: int,
) -> tuple[list[int], int, str]:
    """Write `arrays` (a sample's fields `names`, ring order, unpadded) into the place's
    fields `dst`: the used rows, then, given `pads`, each field's pad value after them.
    One pass over each field's bytes copies, checks and hashes them (row_pass.py).
    Returns the true lengths, the checksum of the rows as written, and '' or why their
    values are out of range (shared/sample/content.py; the place then holds them, and
    its producer must not seal it)."""
    pairs = zip(arrays, dst, strict=True)
    rows = [a if a.dtype == d.dtype else a.astype(d.dtype) for a, d in pairs]
    checksum, why = check_fields(names, rows, vocab_size, dst)
    lengths = []
    for k, (view, arr) in enumerate(zip(dst, rows, strict=True)):
        n = arr.shape[0]
        if pads is not None and n < view.shape[0]:
            view[n:] = pads[k]
        lengths.append(n)
    return lengths, checksum, why


def write_frames(
    dst: Sequence[np.ndarray],
    frames: Sequence[bytes | memoryview],
    offsets: Sequence[int],
    lengths: Sequence[int],
    pads: Sequence[float] | None,
    names: Sequence[str],
    vocab_size: int,
) -> tuple[int, str]:
    """Write one entry of a remote READY into a place: for each field, `lengths[k]` rows
    starting at byte `offsets[k]` of payload frame k (the frames are checked for size
    already); pads as in write_sample. Returns the checksum of the rows as copied and
    whether their values are in range, as write_sample (a remote producer's rows are
    hashed where they landed, in the pass that copies them)."""
    rows = []
    for k, (view, frame) in enumerate(zip(dst, frames, strict=True)):
        n = lengths[k]
        row_bytes = int(np.prod(view.shape[1:], dtype=np.int64)) * view.dtype.itemsize
        src = np.frombuffer(
            frame, dtype=view.dtype, count=n * row_bytes // view.dtype.itemsize, offset=offsets[k]
        ).reshape(n, *view.shape[1:])
        rows.append(src)
    checksum, why = check_fields(names, rows, vocab_size, dst)
    if pads is not None:
        for k, (view, n) in enumerate(zip(dst, lengths, strict=True)):
            if n < view.shape[0]:
                view[n:] = pads[k]
    return checksum, why
