"""How a producer hands a prepared sample to the stager: one SlotWriter per WELCOME.

The worker (producer/process/worker.py) picks the writer once, when the stager welcomes
it, and from then on only calls ``claim``, ``write`` and ``flush``:

- :class:`LocalSlotWriter` (same host): writes the sample into its granted place
  (shared/memory/places.py): a row of the batch it will be delivered in, padded as it
  will be delivered, or a spare-ring slot; seals it, and queues a READY entry.
  ``flush`` answers each run in one READY, because per-message cost, not bytes, limits
  the ring with small work per sample: the messages per batch grow with the producers,
  not with the rows.
- :class:`RemoteSlotWriter` (another host, which cannot map the rings): queues the used
  rows of each field and sends a run's entries in one READY whose payload frames hold
  them, one frame per field (at most MAX_READY_PAYLOAD_BYTES a message); the stager copies
  them into the places.

A sample that does not fit its place (longer than its batch's length bucket: the length
table is stale) is not written: :class:`Misfit` says so, and the worker skips the item
with stage "bucket", as the stager would. A sample whose values are out of range
(shared/sample/content.py: found by the pass that copies and hashes it,
shared/memory/row_pass.py) is not sealed nor sent: :class:`BadValues` says why, and the
worker skips the item with stage "check" (the stager would refuse it, and strike us).

Called in producer processes only; never imports TensorFlow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from ringfeed.producer.sample import Sample
from ringfeed.shared.memory.places import Places, write_sample
from ringfeed.shared.memory.ring import FieldSpec
from ringfeed.shared.memory.row_pass import check_fields
from ringfeed.shared.sample.marks import MEL, TRUNCATED
from ringfeed.shared.sample.schema import SampleSchema
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.bounds import MAX_READY_PAYLOAD_BYTES

# How a writer sends a message (with raw payload frames or None): the worker's _send.
Send = Callable[[p.Message, list | None], None]


class Misfit(ValueError):
    """The sample is longer than its place holds (its batch's length bucket)."""


class BadValues(ValueError):
    """The sample's values are out of range (shared/sample/content.py): never sent."""


class SlotWriter(Protocol):
    """Writes granted samples where the stager will read them."""

    def claim(self, grant: p.GrantEntry) -> bool:
        """Before the sample is prepared: False if the stager has taken the grant back
        (then nothing is written and no READY or SKIP is sent)."""
        ...

    def write(self, grant: p.GrantEntry, sample: Sample) -> bool:
        """Hand the sample over (written and queued); False if the grant was taken back
        meanwhile; Misfit if it does not fit its place."""
        ...

    def pending(self) -> int:
        """READY entries queued and not yet sent."""
        ...

    def flush(self) -> None:
        """Answer the queued entries: one READY per run."""
        ...

    def close(self) -> None:
        """Let go of the rings (never unlinks); queued entries are dropped unsent."""
        ...


def sample_arrays(sample: Sample, fields: FieldSpec) -> list[np.ndarray]:
    """The sample's unpadded arrays in ring order."""
    return [sample.array(name) for name in fields]


def check_fit(arrays: list[np.ndarray], limits: list[int], grant: p.GrantEntry) -> None:
    """Misfit if a field holds more rows than the place (its bucket) does."""
    for arr, limit in zip(arrays, limits, strict=True):
        if arr.shape[0] > limit:
            lengths = [a.shape[0] for a in arrays]
            raise Misfit(
                f"longer than its length bucket ({lengths} > {limits}): the length table "
                "is stale; `ringfeed lengths CONFIG` measures it again"
            )


def ready_entry(
    grant: p.GrantEntry, lengths: list[int], checksum: int, sample: Sample, local: bool
) -> p.ReadyEntry:
    """The sample's entry of its READY; local: with the clip's feature-cache key, under
    which the stager keeps the mel it computes (another host's cache is its own)."""
    marks = sample.marks | (TRUNCATED if sample.truncated else 0)
    key, clip = (sample.cache_key, sample.clip_marks) if local else (b"", 0)
    return p.ReadyEntry(
        grant.place, grant.generation, grant.item, lengths, checksum, marks, key, clip
    )


def place_limits(schema: SampleSchema, grant: p.GrantEntry, sample: Sample) -> list[int]:
    """The rows each field of the granted place may hold for this sample: its wave field
    in mel values where it holds the clip's cached mel (MEL), whose frames fit the bucket
    exactly when its waveform would."""
    return schema.place_limits(*grant.shape[1:], mel=bool(sample.marks & MEL))


def by_run(entries: list[p.ReadyEntry]) -> list[list[p.ReadyEntry]]:
    """Queued entries grouped by their run (generation), in the order they came."""
    runs: dict[int, list[p.ReadyEntry]] = {}
    for e in entries:
        runs.setdefault(e.generation, []).append(e)
    return list(runs.values())


class LocalSlotWriter:
    """Writes into the rings this host shares with the stager (places: both of them)."""

    def __init__(self, places: Places, fields: FieldSpec, send: Send, vocab_size: int) -> None:
        self.places, self.fields, self.send, self.vocab = places, fields, send, vocab_size
        self.queued: list[p.ReadyEntry] = []
        self._limits: dict[tuple[int, tuple[int, int, int], bool], list[int]] = {}

    def _record(self, grant: p.GrantEntry) -> np.ndarray:
        return self.places.record(grant.batch, grant.place)

    def taken_back(self, record: np.ndarray, grant: p.GrantEntry) -> bool:
        """Has the stager taken this grant back (the generation in the place's record
        moved on)? Then we neither write nor seal that place; the stager grants the item
        again. The check narrows the window for a stale write; the stager's fences and its
        checks after the write close it (consumer/stager/ledger.py)."""
        return int(record["generation"][0]) != grant.generation

    def claim(self, grant: p.GrantEntry) -> bool:
        record = self._record(grant)
        if self.taken_back(record, grant):
            return False
        # Our progress fields only: state is the stager's.
        record["writing_generation"], record["t_write"] = grant.generation, time.time()
        return True

    def limits(self, grant: p.GrantEntry, sample: Sample) -> list[int]:
        key = (grant.batch, grant.shape, bool(sample.marks & MEL))
        if key not in self._limits:
            self._limits[key] = place_limits(self.places.schema, grant, sample)
        return self._limits[key]

    def write(self, grant: p.GrantEntry, sample: Sample) -> bool:
        record = self._record(grant)
        if self.taken_back(record, grant):  # the sample took longer than the lease
            return False
        arrays = sample_arrays(sample, self.fields)
        check_fit(arrays, self.limits(grant, sample), grant)
        dst = self.places.fields(grant.batch, grant.shape, grant.place)
        pads = self.places.pads if grant.batch >= 0 else None  # a row is delivered as it lies
        lengths, checksum, why = write_sample(dst, arrays, pads, self.places.names, self.vocab)
        if why:
            raise BadValues(why)
        record["lengths"][0, : len(lengths)] = lengths
        record["t_ready"] = time.time()
        # Last: the stager accepts the READY only if this equals the granted generation.
        if not self.taken_back(record, grant):
            record["sealed_generation"] = grant.generation
        self.queued.append(ready_entry(grant, lengths, checksum, sample, True))
        return True

    def pending(self) -> int:
        return len(self.queued)

    def flush(self) -> None:
        for run in by_run(self.queued):
            self.send(p.Ready.of(run), None)
        self.queued.clear()

    def close(self) -> None:
        self.queued.clear()
        self._limits.clear()
        self.places.forget()  # no view of a ring may outlive its map
        if self.places.batches is not None:
            self.places.batches.close()
        self.places.spares.close()


class RemoteSlotWriter:
    """Sends each run's samples over the control socket, for the stager to copy in."""

    def __init__(self, fields: FieldSpec, send: Send, schema: SampleSchema, vocab_size: int):
        """schema: the run's sample schema, for the rows each field of a granted place
        holds (its batch's bucket): a sample longer is a Misfit, never sent."""
        self.fields, self.send, self.schema, self.vocab = fields, send, schema, vocab_size
        self.names = list(fields)
        self.queued: list[tuple[p.ReadyEntry, list[memoryview]]] = []
        self.bytes = 0

    def claim(self, grant: p.GrantEntry) -> bool:
        return True  # only the stager can take it back, and it drops our late READY

    def write(self, grant: p.GrantEntry, sample: Sample) -> bool:
        arrays = sample_arrays(sample, self.fields)
        check_fit(arrays, place_limits(self.schema, grant, sample), grant)
        rows = [
            np.ascontiguousarray(a, dtype=self.fields[name][1])
            for name, a in zip(self.fields, arrays, strict=True)
        ]
        checksum, why = check_fields(self.names, rows, self.vocab)
        if why:
            raise BadValues(why)
        bufs = [memoryview(r).cast("B") for r in rows]
        lengths = [a.shape[0] for a in arrays]
        size = sum(len(b) for b in bufs)
        if self.queued and (
            self.bytes + size > MAX_READY_PAYLOAD_BYTES
            or self.queued[-1][0].generation != grant.generation
        ):
            self.flush()
        self.queued.append((ready_entry(grant, lengths, checksum, sample, False), bufs))
        self.bytes += size
        return True

    def pending(self) -> int:
        return len(self.queued)

    def flush(self) -> None:
        """One READY of the queued entries (one run), its rows one frame per field."""
        if not self.queued:
            return
        entries = [e for e, _ in self.queued]
        n_fields = len(self.fields)
        frames = [b"".join(bufs[k] for _, bufs in self.queued) for k in range(n_fields)]
        self.send(p.Ready.of(entries), frames)
        self.queued.clear()
        self.bytes = 0

    def close(self) -> None:
        self.queued.clear()
