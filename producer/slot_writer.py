"""How a producer hands a prepared sample to the stager: one SlotWriter per WELCOME.

The worker (producer/worker.py) picks the writer once, when the stager welcomes
it, and from then on only calls ``claim``, ``write`` and ``flush``:

- :class:`LocalSlotWriter` (same host): copies the sample into the granted
  shared-memory slot, zeroes the padding, seals it, and queues a READY entry;
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
from ringfeed.shared import protocol as p
from ringfeed.shared.ring import FieldSpec, Ring, rows_checksum

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
    truncated = sample.truncated
    return p.ReadyEntry(grant.slot, grant.generation, grant.item, lengths, checksum, truncated)


class LocalSlotWriter:
    """Writes into the shared-memory ring this host shares with the stager."""

    def __init__(self, ring: Ring, fields: FieldSpec, send: Send) -> None:
        self.ring, self.fields, self.send = ring, fields, send
        self.queued: list[p.ReadyEntry] = []

    def taken_back(self, grant: p.GrantEntry) -> bool:
        """Has the stager taken this grant back (the generation in the slot header moved
        on)? Then we neither write nor seal that slot; the stager re-grants the item.
        The check narrows the window for a stale write; the stager's check after copying
        closes it (shared/ring.py)."""
        return int(self.ring.slots[grant.slot]["generation"]) != grant.generation

    def claim(self, grant: p.GrantEntry) -> bool:
        if self.taken_back(grant):
            return False
        header = self.ring.slots[grant.slot]  # our progress fields only: state is the stager's
        header["writing_generation"], header["t_write"] = grant.generation, time.time()
        return True

    def write(self, grant: p.GrantEntry, sample: Sample) -> bool:
        if self.taken_back(grant):  # the sample took longer than the lease
            return False
        lengths, checksum = self._copy(grant, sample)
        self.queued.append(ready_entry(grant, lengths, checksum, sample))
        return True

    def _copy(self, grant: p.GrantEntry, sample: Sample) -> tuple[list[int], int]:
        """Copy into the slot, zero the padding, seal; returns the true lengths and the
        checksum of the rows as written (computed from our copy, not from the slot)."""
        lengths, written = [], []
        for name, arr in zip(self.fields, sample_arrays(sample, self.fields), strict=True):
            dst = self.ring.view(name)[grant.slot]
            n = arr.shape[0]
            rows = np.ascontiguousarray(arr, dtype=dst.dtype)
            dst[:n] = rows
            dst[n:] = 0
            lengths.append(n)
            written.append(rows)
        header = self.ring.slots[grant.slot]
        header["lengths"][: len(lengths)] = lengths
        header["t_ready"] = time.time()
        # Last: the stager accepts the READY only if this equals the granted generation.
        if not self.taken_back(grant):
            header["sealed_generation"] = grant.generation
        return lengths, rows_checksum(written)

    def pending(self) -> int:
        return len(self.queued)

    def flush(self) -> None:
        if self.queued:
            self.send(p.Ready.of(self.queued), None)
            self.queued.clear()

    def close(self) -> None:
        self.queued.clear()
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
