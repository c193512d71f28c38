"""The stager's intake of filled samples: READY checks, and the check after copy.

Mixed into consumer/stager/stager.py's Stager. A READY is accepted only for a
grant its producer holds, sealed with that grant's generation (local) or with
payload frames of exactly the used rows (remote), and fitting its length
bucket. When the stager later copies the rows into a batch it checks again
(seqlock): the slot still carries the accepted generation in both producer
fields, and the copied rows hash to the checksum of the READY. A READY that
fails for a slot its producer holds costs that producer its grants at once,
so a bad READY never waits out a lease and never leaves a slot or item held.
"""

from __future__ import annotations

import logging

from consumer.stager.plan import Event
from consumer.stager.ready import copy_payload, lengths_error, payload_error
from consumer.stager.state import Producer
from shared import protocol as p
from shared.ring import rows_checksum

log = logging.getLogger(__name__)


class Intake:
    """READY handling of the Stager (uses its manager, rings, builder and drop)."""

    def on_ready(self, msg: p.Ready, producer: Producer, payload: list[bytes]) -> None:
        """Accept each filled slot of a READY that its producer still holds."""
        entries = msg.entries(len(self.fields))
        if isinstance(entries, str):
            self.reject(producer, "malformed", entries, msg.slots)
            return
        self.manager.credit(producer.ident, len(entries))  # each entry asks for a grant
        if producer.remote:
            slots = [e.slot for e in entries]
            if len(entries) != 1:
                why = f"remote READY with {len(entries)} entries, need 1 with payload"
                self.reject(producer, "malformed", why, slots)
                return
            why = payload_error(self.fields, entries[0].lengths, payload)
            if why:
                self.reject(producer, "malformed", why, slots)
                return
        for entry in entries:
            self.accept(producer, entry, payload)

    def reject(self, producer: Producer, why: str, detail: str, slots: list[int]) -> None:
        """Drop and count a READY; if it names a slot its producer holds, that producer's
        grants come back now instead of after a lease."""
        self.drop(why, f"{detail} (from {producer.name})")
        if any(self.manager.holds(producer.ident, slot) for slot in slots):
            self.manager.revoke(producer.ident)

    def accept(self, producer: Producer, e: p.ReadyEntry, payload: list[bytes]) -> None:
        why = lengths_error(e.lengths, self.limits)
        if why:
            self.reject(producer, "malformed", why, [e.slot])
            return
        if not self.manager.owns(producer.ident, e.slot, e.generation, e.item):
            detail = f"READY of slot {e.slot} gen {e.generation} item {e.item}"
            if self.manager.holds(producer.ident, e.slot, e.generation):
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
        why = self.misfit(e)
        if why:
            self.manager.skip(producer.ident, e.slot, e.generation, e.item, why, "bucket", "")
            return
        self.manager.ready(producer.ident, e.slot, e.generation, e.item)
        self.accepted[e.slot] = (e.lengths, e.checksum)

    def misfit(self, e: p.ReadyEntry) -> str:
        """'' if the sample fits its batch's bucket, else why not (the length manifest
        said otherwise: a changed file, or a header that lies)."""
        if not self.buckets:
            return ""
        position = self.manager.slots[e.slot].position
        b = self.buckets[self.manager.plan.batch_at(position)[0]]
        limit = b.frames if "mel" in self.fields else b.frames * self.cfg.features.hop_length
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
        lengths, checksum = self.accepted.pop(event.slot)
        copies = self.builder.add(self.samples, event.slot, event.item, lengths)
        k, generation = event.slot, self.manager.slots[event.slot].generation
        if (
            self.writing[k] != generation
            or self.seals[k] != generation
            or rows_checksum(copies) != checksum
        ):
            self.builder.drop_last()
            self.drop("torn", f"slot {event.slot} item {event.item} changed after its READY")
            return False
        if self.builder.rows == 1:
            self.first_position = event.position
        self.last_position = event.position
        self.manager.release(event.slot)
        return True
