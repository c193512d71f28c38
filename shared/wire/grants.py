"""The slot messages of shared/wire/protocol.py: GRANT and READY, several slots per message.

They travel as parallel lists on the wire (build with ``of``, read with
``entries``) because per-message cost, not bytes, limits the ring with small
work per sample (docs/benchmarks.md#ring-throughput). Imported through shared.wire.protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class GrantEntry(NamedTuple):
    """One grant: fill `slot` (stamped with `generation`) with `item`, the plan's
    `position`."""

    slot: int
    generation: int
    item: int
    position: int


class ReadyEntry(NamedTuple):
    """One filled slot: `lengths` holds the true rows of each ring field in ring order,
    `checksum` the rows_checksum (shared/memory/ring.py) of those rows as written, `marks`
    the sample's bits of shared/sample/marks.py (truncated, near-silent, clipped)."""

    slot: int
    generation: int
    item: int
    lengths: list[int]
    checksum: int
    marks: int


@dataclass(frozen=True)
class Grant:
    """One or more grants (:class:`GrantEntry`), as parallel lists on the wire: build
    with :meth:`of`, read with :meth:`entries`.

    Grants travel in batches because per-message cost, not bytes, limits the
    ring with small work per sample (docs/benchmarks.md#ring-throughput)."""

    slots: list[int]
    generations: list[int]
    items: list[int]
    positions: list[int]

    @classmethod
    def of(cls, entries: list[GrantEntry]) -> Grant:
        return cls(*(list(column) for column in zip(*entries, strict=True)))

    def entries(self) -> list[GrantEntry]:
        """The grants; a GRANT whose lists differ in length is refused at decode."""
        columns = (self.slots, self.generations, self.items, self.positions)
        return [GrantEntry(*g) for g in zip(*columns, strict=True)]


@dataclass(frozen=True)
class Ready:
    """One or more filled slots (:class:`ReadyEntry`), as parallel lists on the wire:
    lengths holds n_fields true sizes per entry, flattened; marks one int per entry (was
    0/1 for truncated, its bit 1, before the audio marks: the layout is the same).
    Build with :meth:`of`, read with :meth:`entries`. A remote producer sends one entry
    and its rows as raw payload frames, one per field."""

    slots: list[int]
    generations: list[int]
    items: list[int]
    lengths: list[int]
    checksums: list[int]
    marks: list[int]

    @classmethod
    def of(cls, entries: list[ReadyEntry]) -> Ready:
        return cls(
            [e.slot for e in entries],
            [e.generation for e in entries],
            [e.item for e in entries],
            [n for e in entries for n in e.lengths],
            [e.checksum for e in entries],
            [int(e.marks) for e in entries],
        )

    def entries(self, n_fields: int) -> list[ReadyEntry] | str:
        """The entries, or why the lists do not line up (the stager rejects the READY:
        n_fields depends on the run, so decode cannot check it)."""
        n = len(self.slots)
        if not (len(self.generations) == len(self.items) == len(self.checksums) == n) or (
            len(self.marks) != n or len(self.lengths) != n * n_fields
        ):
            return f"READY with inconsistent list sizes ({n} slots)"
        return [
            ReadyEntry(
                self.slots[i],
                self.generations[i],
                self.items[i],
                self.lengths[i * n_fields : (i + 1) * n_fields],
                self.checksums[i],
                self.marks[i],
            )
            for i in range(n)
        ]
