"""The place messages of shared/wire/protocol.py: GRANT and READY, a run of places each.

A GRANT names a run: places of one batch slot (rows of a batch of the given shape) or of
the spare ring, each with its item and plan position, all under one generation. The
producer answers the run with READY messages, each naming that generation and some of
its places (a run's answer may come in parts; each place once). Lists travel in
parallel on the wire (build with ``of``, read with ``entries``): per-message cost, not
bytes, limits the ring with small work per sample, so the messages per batch grow with
the producers, not with the rows (docs/benchmarks.md#ring-throughput). Imported through
shared.wire.protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ringfeed.shared.sample.schema import SPARE_SHAPE
from ringfeed.shared.wire.bounds import CACHE_KEY_BYTES

NO_KEY = bytes(CACHE_KEY_BYTES)  # an entry of a READY's cache_keys with none to keep


class GrantEntry(NamedTuple):
    """One place of a run: fill `place` (a row of batch slot `batch`, whose batch has
    `shape` (rows, frames, text); or, batch -1, a slot of the spare ring) stamped with
    `generation`, with `item`, the plan's `position`."""

    place: int
    generation: int
    item: int
    position: int
    batch: int = -1
    shape: tuple[int, int, int] = SPARE_SHAPE


class ReadyEntry(NamedTuple):
    """One filled place: `lengths` holds the true rows of each sample field in ring order,
    `checksum` the checksum (shared/memory/row_pass.py) of those rows as written, `marks`
    the sample's bits of shared/sample/marks.py (truncated, near-silent, clipped; MEL:
    its wave field holds the clip's cached mel). `cache_key`: a local producer's
    feature-cache key of the clip whose waveform it sent (CACHE_KEY_BYTES), under which
    the stager keeps the mel it computes, with `clip_marks`, the clip's marks as the cache
    keeps them (marks.ALL; the sample's `marks` are after data.outliers and a cut text);
    b"" and 0: none to keep (read back from a READY whose other entries carry keys, an
    entry without one reads as NO_KEY, zeros: also none)."""

    place: int
    generation: int
    item: int
    lengths: list[int]
    checksum: int
    marks: int
    cache_key: bytes = b""
    clip_marks: int = 0


@dataclass(frozen=True)
class Grant:
    """A run of places under one generation (see the module docstring): rows of batch
    slot `batch` (spare False; the batch's shape is rows x frames x text), or slots of the
    spare ring (spare True). Build with :meth:`of`, read with :meth:`entries`; a GRANT
    whose lists differ in length is refused at decode."""

    generation: int
    spare: bool
    batch: int
    rows: int
    frames: int
    text: int
    places: list[int]
    items: list[int]
    positions: list[int]

    @classmethod
    def of(cls, entries: list[GrantEntry]) -> Grant:
        """One run: entries of one generation and one batch slot (or the spare ring)."""
        first = entries[0]
        spare = first.batch < 0
        return cls(
            first.generation,
            spare,
            0 if spare else first.batch,
            *first.shape,
            [e.place for e in entries],
            [e.item for e in entries],
            [e.position for e in entries],
        )

    @classmethod
    def of_run(
        cls,
        generation: int,
        slot: int,
        shape: tuple[int, int, int],
        places: list[int],
        items: list[int],
        positions: list[int],
    ) -> Grant:
        """One run as parallel lists: places of batch slot `slot` (-1: the spare ring)."""
        spare = slot < 0
        return cls(generation, spare, 0 if spare else slot, *shape, places, items, positions)

    def entries(self) -> list[GrantEntry]:
        batch = -1 if self.spare else self.batch
        shape = (self.rows, self.frames, self.text)
        columns = (self.places, self.items, self.positions)
        return [
            GrantEntry(place, self.generation, item, position, batch, shape)
            for place, item, position in zip(*columns, strict=True)
        ]


@dataclass(frozen=True)
class Ready:
    """Some filled places of one run (:class:`ReadyEntry`), as parallel lists on the wire:
    lengths holds n_fields true sizes per entry, flattened; marks one int per entry;
    cache_keys CACHE_KEY_BYTES per entry, one after another (NO_KEY for an entry without)
    and clip_marks one int per entry, or both empty when no entry has a key (producer
    mels, the cache off, a remote producer). Build with :meth:`of`, read with
    :meth:`entries`. A remote producer sends the rows as raw payload frames, one per
    sample field: the entries' used rows of that field, one after another."""

    generation: int
    places: list[int]
    items: list[int]
    lengths: list[int]
    checksums: list[int]
    marks: list[int]
    cache_keys: bytes = b""
    clip_marks: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, entries: list[ReadyEntry]) -> Ready:
        """Entries of one run (one generation)."""
        keyed = any(e.cache_key for e in entries)
        return cls(
            entries[0].generation,
            [e.place for e in entries],
            [e.item for e in entries],
            [n for e in entries for n in e.lengths],
            [e.checksum for e in entries],
            [int(e.marks) for e in entries],
            b"".join(e.cache_key or NO_KEY for e in entries) if keyed else b"",
            [int(e.clip_marks) for e in entries] if keyed else [],
        )

    def consistent(self, n_fields: int) -> bool:
        """Do its lists line up (n_fields: the run's sample fields, which decode cannot
        know)? The stager refuses a READY whose lists do not, whole."""
        n = len(self.places)
        keys = len(self.cache_keys) // CACHE_KEY_BYTES
        return (
            n > 0
            and len(self.items) == len(self.checksums) == len(self.marks) == n
            and len(self.lengths) == n * n_fields
            and keys == len(self.clip_marks) in (0, n)
        )

    def entries(self, n_fields: int) -> list[ReadyEntry] | str:
        """The entries, or why the lists do not line up (consistent)."""
        n = len(self.places)
        if not self.consistent(n_fields):
            return f"READY with inconsistent list sizes ({n} places)"
        g, k = self.generation, CACHE_KEY_BYTES
        return [
            ReadyEntry(
                self.places[i],
                g,
                self.items[i],
                self.lengths[i * n_fields : (i + 1) * n_fields],
                self.checksums[i],
                self.marks[i],
                self.cache_keys[i * k : (i + 1) * k] if self.clip_marks else b"",
                self.clip_marks[i] if self.clip_marks else 0,
            )
            for i in range(n)
        ]
