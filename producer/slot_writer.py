"""How a producer hands a prepared sample to the stager: one SlotWriter per WELCOME.

The worker (producer/worker.py) picks the writer once, when the stager welcomes
it, and from then on only calls ``claim``, ``write`` and ``flush``:

- :class:`LocalSlotWriter` (same host): copies the sample into the granted
  shared-memory slot, seals it, and queues a READY entry;
  ``flush`` announces the queued entries in one READY, because per-message
  cost, not bytes, limits the ring with small work per sample.
- :class:`RemoteSlotWriter` (another host, which cannot map the ring): sends
  the used rows of each field as raw ZeroMQ frames with a one-entry READY, and
  the stager copies them into the slot.

Called in producer processes only; never imports TensorFlow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from ringfeed.producer.sample import Sample
from ringfeed.shared.memory.ring import FieldSpec, Ring, rows_checksum
from ringfeed.shared.sample.marks import TRUNCATED
from ringfeed.shared.wire import protocol as p

# The slot header's fields a local producer reads or writes (shared/memory/ring.py SLOT_DTYPE).
PROGRESS_FIELDS = (
    "generation",
    "writing_generation",
    "sealed_generation",
    "lengths",
    "t_write",
    "t_ready",
)

# How a writer sends a message (with raw payload frames or None): the worker's _send.
Send = Callable[[p.Message, list | None], None]


class SlotWriter(Protocol):
    """Writes granted samples where the stager will read them."""

    def claim(self, grant: p.GrantEntry) -> bool:
        """Before the sample is prepared: False if the stager has taken the grant back
        (then nothing is written and no READY or SKIP is sent)."""
        ...

    def write(self, grant: p.GrantEntry, sample: Sample) -> bool:
        """Hand the sample over (written and queued, or sent); False if the grant was
        taken back meanwhile."""
        ...

    def pending(self) -> int:
        """READY entries queued and not yet sent."""
        ...

    def flush(self) -> None:
        """Send the queued READY entries in one message."""
        ...

    def close(self) -> None:
        """Let go of the ring (never unlinks); queued entries are dropped unsent."""
        ...


def sample_arrays(sample: Sample, fields: FieldSpec) -> list[np.ndarray]:
    """The sample's unpadded arrays in ring field order."""
    return [sample.array(name) for name in fields]


def ready_entry(
    grant: p.GrantEntry, lengths: list[int], checksum: int, sample: Sample
) -> p.ReadyEntry:
    marks = sample.marks | (TRUNCATED if sample.truncated else 0)
    return p.ReadyEntry(grant.slot, grant.generation, grant.item, lengths, checksum, marks)


class LocalSlotWriter:
    """Writes into the shared-memory ring this host shares with the stager.

    Only a sample's used rows are written: the rows past its length keep whatever
    the slot held before, as nothing reads them (the stager copies the used rows and
    pads its batch row itself). Zeroing them cost the ring a write of a quarter of
    each slot, through the other core's cache, per sample."""

    def __init__(self, ring: Ring, fields: FieldSpec, send: Send) -> None:
        self.ring, self.fields, self.send = ring, fields, send
        self.queued: list[p.ReadyEntry] = []
        # One column view per header field: ~10x cheaper per write than a record's.
        self.col = {name: ring.slots[name] for name in PROGRESS_FIELDS}
        self.views = [ring.view(name) for name in fields]

    def taken_back(self, grant: p.GrantEntry) -> bool:
        """Has the stager taken this grant back (the generation in the slot header moved
        on)? Then we neither write nor seal that slot; the stager re-grants the item.
        The check narrows the window for a stale write; the stager's check after copying
        closes it (shared/memory/ring.py)."""
        return int(self.col["generation"][grant.slot]) != grant.generation

    def claim(self, grant: p.GrantEntry) -> bool:
        if self.taken_back(grant):
            return False
        # Our progress fields only: state is the stager's.
        self.col["writing_generation"][grant.slot] = grant.generation
        self.col["t_write"][grant.slot] = time.time()
        return True

    def write(self, grant: p.GrantEntry, sample: Sample) -> bool:
        if self.taken_back(grant):  # the sample took longer than the lease
            return False
        lengths, checksum = self._copy(grant, sample)
        self.queued.append(ready_entry(grant, lengths, checksum, sample))
        return True

    def _copy(self, grant: p.GrantEntry, sample: Sample) -> tuple[list[int], int]:
        """Copy the used rows into the slot and seal it; returns the true lengths and the
        checksum of the rows as written (computed from our copy, not from the slot)."""
        k, lengths, written = grant.slot, [], []
        for view, arr in zip(self.views, sample_arrays(sample, self.fields), strict=True):
            dst = view[k]
            n = arr.shape[0]
            rows = np.ascontiguousarray(arr, dtype=dst.dtype)
            dst[:n] = rows
            lengths.append(n)
            written.append(rows)
        self.col["lengths"][k, : len(lengths)] = lengths
        self.col["t_ready"][k] = time.time()
        # Last: the stager accepts the READY only if this equals the granted generation.
        if not self.taken_back(grant):
            self.col["sealed_generation"][k] = grant.generation
        return lengths, rows_checksum(written)

    def pending(self) -> int:
        return len(self.queued)

    def flush(self) -> None:
        if self.queued:
            self.send(p.Ready.of(self.queued), None)
            self.queued.clear()

    def close(self) -> None:
        self.queued.clear()
        self.col, self.views = {}, []  # no view of the ring may outlive its map
        self.ring.close()


class RemoteSlotWriter:
    """Sends each sample's used rows over the control socket, for the stager to copy."""

    def __init__(self, fields: FieldSpec, send: Send) -> None:
        self.fields, self.send = fields, send

    def claim(self, grant: p.GrantEntry) -> bool:
        return True  # only the stager can take it back, and it drops our late READY

    def write(self, grant: p.GrantEntry, sample: Sample) -> bool:
        lengths, payload = self.frames(sample)
        checksum = rows_checksum(np.frombuffer(b, np.uint8) for b in payload)
        self.send(p.Ready.of([ready_entry(grant, lengths, checksum, sample)]), payload)
        return True

    def frames(self, sample: Sample) -> tuple[list[int], list[memoryview]]:
        """Used rows of each field as contiguous buffers, one payload frame per field."""
        arrays = sample_arrays(sample, self.fields)
        bufs = [
            memoryview(np.ascontiguousarray(a, dtype=self.fields[name][1])).cast("B")
            for name, a in zip(self.fields, arrays, strict=True)
        ]
        return [a.shape[0] for a in arrays], bufs

    def pending(self) -> int:
        return 0

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None
