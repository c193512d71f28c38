"""The stager's intake of filled samples: READY checks, and the check after copy.

A part of the stager (consumer/stager/stager.py). A READY is accepted only
for a grant its producer holds, sealed with that grant's generation (local)
or with payload frames of exactly the used rows (remote), and fitting its
length bucket. When delivery later copies the rows into a batch, :meth:`take`
checks again (seqlock, README "Design", contract 7): the slot still carries
the accepted generation in both producer fields, and the copied rows hash to
the checksum of the READY. A READY that fails for a slot its producer holds
costs that producer its grants at once, so a bad READY never waits out a
lease and never leaves a slot or item held.
"""

from __future__ import annotations

from consumer.stager.batch_builder import BatchBuilder
from consumer.stager.buckets import Bucket
from consumer.stager.drops import Drops
from consumer.stager.plan import Event
from consumer.stager.producer_book import ProducerBook
from consumer.stager.ready import copy_payload, lengths_error, payload_error, row_limits
from consumer.stager.slot_manager import SlotManager
from consumer.stager.state import Producer
from shared import protocol as p
from shared.ring import Ring, rows_checksum


class Intake:
    """READY handling, and the checked copy of each accepted sample into its batch."""

    def __init__(
        self,
        samples: Ring,
        slots: SlotManager,
        book: ProducerBook,
        builder: BatchBuilder,
        buckets: list[Bucket],
        hop_length: int,
        drop: Drops,
    ) -> None:
        """buckets: the length buckets ([]: one fixed batch shape); hop_length turns a
        bucket's frames into samples when slots hold waveforms."""
        self.samples, self.slots, self.book, self.builder = samples, slots, book, builder
        self.buckets, self.hop_length, self.drop = buckets, hop_length, drop
        self.limits = row_limits(samples.fields)
        # Producers' progress fields, read per READY and per copy (column views: cheap).
        self.seals = samples.slots["sealed_generation"]
        self.writing = samples.slots["writing_generation"]
        # slot -> the READY entry accepted for it, checked again at copy.
        self.accepted: dict[int, p.ReadyEntry] = {}

    def on_ready(self, msg: p.Ready, producer: Producer, payload: list[bytes]) -> None:
        """Accept each filled slot of a READY that its producer still holds."""
        entries = msg.entries(len(self.limits))
        if isinstance(entries, str):
            self.reject(producer, "malformed", entries, msg.slots)
            return
        self.book.credit(producer.ident, len(entries))  # each entry asks for a grant
        if producer.remote:
            why = self.remote_error(entries, payload)
            if why:
                self.reject(producer, "malformed", why, [e.slot for e in entries])
                return
        for entry in entries:
            self.accept(producer, entry, payload)

    def remote_error(self, entries: list[p.ReadyEntry], payload: list[bytes]) -> str:
        """'' if a remote READY is one entry whose payload frames are its used rows."""
        if len(entries) != 1:
            return f"remote READY with {len(entries)} entries, need 1 with payload"
        return payload_error(self.samples.fields, entries[0].lengths, payload)

    def reject(self, producer: Producer, why: str, detail: str, slots: list[int]) -> None:
        """Drop and count a READY; if it names a slot its producer holds, that producer's
        grants come back now instead of after a lease."""
        self.drop(why, f"{detail} (from {producer.name})")
        if any(self.slots.holds(producer.ident, slot) for slot in slots):
            self.book.revoke(producer.ident)

    def accept(self, producer: Producer, e: p.ReadyEntry, payload: list[bytes]) -> None:
        why = lengths_error(e.lengths, self.limits)
        if why:
            self.reject(producer, "malformed", why, [e.slot])
            return
        if not self.slots.owns(producer.ident, e.slot, e.generation, e.item):
            detail = f"READY of slot {e.slot} gen {e.generation} item {e.item}"
            if self.slots.holds(producer.ident, e.slot, e.generation):
                self.reject(producer, "malformed", f"{detail}: not the item granted", [e.slot])
            else:  # a late READY of a grant taken back: nothing of its producer's to return
                self.drop("stale", detail)
            return
        if producer.remote:
            copy_payload(self.samples, e.slot, e.generation, e.lengths, payload)
        elif int(self.seals[e.slot]) != e.generation:
            why = f"slot {e.slot} is not sealed with generation {e.generation}"
            self.reject(producer, "unsealed", why, [e.slot])
            return
        producer.samples += 1
        why = self.misfit(e)
        if why:
            self.slots.skip(producer.ident, e.slot, e.generation, e.item, why, "bucket", "")
            return
        self.slots.ready(producer.ident, e.slot, e.generation, e.item)
        self.accepted[e.slot] = e

    def misfit(self, e: p.ReadyEntry) -> str:
        """'' if the sample fits its batch's bucket, else why not (the length manifest
        said otherwise: a changed file, or a header that lies)."""
        if not self.buckets:
            return ""
        position = self.slots.slots[e.slot].position
        b = self.buckets[self.slots.plan.batch_at(position)[0]]
        limit = b.frames if "mel" in self.samples.fields else b.frames * self.hop_length
        if e.lengths[0] <= b.text and e.lengths[1] <= limit:
            return ""
        return (
            f"longer than its length bucket ({e.lengths} > text {b.text}, {limit}): the "
            "length manifest is stale; `ringfeed manifest CONFIG` measures it again"
        )

    def take(self, event: Event) -> bool:
        """Copy a READY sample into the batch, then check it (seqlock): the slot still
        carries the generation it was accepted with, and the copied rows hash to the
        checksum its producer sent. False (nothing taken) if a stale writer touched it."""
        entry = self.accepted.pop(event.slot)
        copies = self.builder.add(self.samples, event.slot, event.item, entry.lengths)
        k, generation = event.slot, self.slots.slots[event.slot].generation
        if (
            self.writing[k] != generation
            or self.seals[k] != generation
            or rows_checksum(copies) != entry.checksum
        ):
            self.builder.drop_last()
            self.drop("torn", f"slot {event.slot} item {event.item} changed after its READY")
            return False
        self.slots.release(event.slot)
        return True

    def forget_views(self) -> None:
        """Before the ring is unmapped: no view of it may outlive the map."""
        self.seals = self.writing = None
