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

from dataclasses import dataclass
from typing import NamedTuple

from ringfeed.shared.sample.schema import SPARE_SHAPE


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
    the sample's bits of shared/sample/marks.py (truncated, near-silent, clipped)."""

    place: int
    generation: int
    item: int
    lengths: list[int]
    checksum: int
    marks: int


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
    lengths holds n_fields true sizes per entry, flattened; marks one int per entry.
    Build with :meth:`of`, read with :meth:`entries`. A remote producer sends the rows
    as raw payload frames, one per sample field: the entries' used rows of that field,
    one after another."""

    generation: int
    places: list[int]
    items: list[int]
    lengths: list[int]
    checksums: list[int]
    marks: list[int]

    @classmethod
    def of(cls, entries: list[ReadyEntry]) -> Ready:
        """Entries of one run (one generation)."""
        return cls(
            entries[0].generation,
            [e.place for e in entries],
            [e.item for e in entries],
            [n for e in entries for n in e.lengths],
            [e.checksum for e in entries],
            [int(e.marks) for e in entries],
        )

    def entries(self, n_fields: int) -> list[ReadyEntry] | str:
        """The entries, or why the lists do not line up (the stager refuses the whole
        READY: n_fields depends on the run, so decode cannot check it)."""
        n = len(self.places)
        if not (len(self.items) == len(self.checksums) == len(self.marks) == n) or (
            len(self.lengths) != n * n_fields or n == 0
        ):
            return f"READY with inconsistent list sizes ({n} places)"
        g = self.generation
        return [
            ReadyEntry(
                self.places[i],
                g,
                self.items[i],
                self.lengths[i * n_fields : (i + 1) * n_fields],
                self.checksums[i],
                self.marks[i],
            )
            for i in range(n)
        ]
