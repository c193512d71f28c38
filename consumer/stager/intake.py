"""The stager's intake of filled samples: READY checks, and the check after copy.

A part of the stager (consumer/stager/stager.py). A READY is accepted only
for a grant its producer holds, sealed with that grant's generation (local)
or with payload frames of exactly the used rows (remote), and fitting its
length bucket. When delivery later copies the rows into a batch, :meth:`take`
checks again (seqlock, docs/design.md#contract-7): the slot still carries
the accepted generation in both producer fields, and the copied rows hash to
the checksum of the READY, and hold nothing out of range (shared/sample/content.py).

Whatever fails these checks is a strike against the producer that sent it
(docs/design.md#contract-10): its grants come back at once and uncharged, so
a bad READY never waits out a lease, never leaves a slot held, and never counts
against an innocent item. Not a strike: a late READY of a grant taken back, and
rows changed under intact seals after a local READY (a stale writer's doing,
counted torn; a remote producer's rows are hashed when its READY arrives). An
item is skipped for its content only when two peers sent bad rows for it.

Audits (consumer/stager/audits.py): some READYs, every SKIP and every READY too long
for its bucket of a remote producer wait until a local producer has computed the item
too; the intake takes the local answer and decides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ringfeed.consumer.stager import audits
from ringfeed.consumer.stager.audits import AuditPolicy, disagreement
from ringfeed.consumer.stager.batch_builder import BatchBuilder
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.producer_book import ProducerBook
from ringfeed.consumer.stager.ready import copy_payload, lengths_error, payload_error, row_limits
from ringfeed.consumer.stager.slot_manager import SlotManager
from ringfeed.consumer.stager.state import Event, Producer, Slot
from ringfeed.consumer.stager.twins import Skipped, Twin
from ringfeed.shared.memory.ring import Ring, rows_checksum
from ringfeed.shared.sample.content import content_error
from ringfeed.shared.sample.marks import AUDIO
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# Items remembered with the peer that first sent bad rows for them.
MAX_SUSPECTS = 4096


class Intake:
    """READY handling, and the checked copy of each accepted sample into its batch."""

    def __init__(
        self,
        samples: Ring,
        slots: SlotManager,
        book: ProducerBook,
        builder: BatchBuilder,
        plan: Plan,
        hop_length: int,
        vocab_size: int,
        drop: Drops,
        audits: AuditPolicy,
        marked: Callable[[int, int], None] | None = None,
    ) -> None:
        """plan: which bucket's batch each position goes into (when it cuts batches);
        hop_length turns a bucket's frames into samples when slots hold waveforms;
        vocab_size bounds the token ids a sample may hold; marked(item, marks): told of
        each sample taken into a batch whose READY carried audio marks (near-silent,
        clipped: consumer/stager/outliers.py lists it); audits: which remote samples
        wait for an audit."""
        self.samples, self.slots, self.book, self.builder = samples, slots, book, builder
        self.plan, self.hop_length, self.drop, self.audits = plan, hop_length, drop, audits
        self.vocab, self.marked = vocab_size, marked
        self.limits = row_limits(samples.fields)
        # Optional fields' lengths must agree with the mel's or the text's (one check a
        # READY, only when the schema declares any).
        self.schema = builder.cfg.schema if builder.cfg.schema.extras else None
        # Producers' progress fields, read per READY and per copy (column views: cheap).
        self.seals = samples.slots["sealed_generation"]
        self.writing = samples.slots["writing_generation"]
        # slot -> the READY entry accepted for it, checked again at copy.
        self.accepted: dict[int, p.ReadyEntry] = {}
        # item -> the peer (account) that first sent bad rows for it.
        self.suspects: dict[int, str] = {}
        self.no_auditor = False  # an audit found no local producer for a lease
        # item -> the account whose SKIP of it no local producer checked (tried again).
        self.doubted: dict[int, str] = {}

    def on_ready(self, msg: p.Ready, producer: Producer, payload: list[bytes]) -> None:
        """Accept each filled slot of a READY that its producer still holds."""
        entries = msg.entries(len(self.limits))
        if isinstance(entries, str):
            self.reject(producer, "malformed", entries)
            return
        self.book.credit(producer.ident, len(entries))  # each entry asks for a grant
        if producer.remote:
            why = self.remote_error(entries, payload)
            if why:
                self.reject(producer, "malformed", why)
                return
        for entry in entries:
            if producer.ident not in self.book.producers:
                return  # struck out by an earlier entry of this READY
            self.accept(producer, entry, payload)

    def remote_error(self, entries: list[p.ReadyEntry], payload: list[bytes]) -> str:
        """'' if a remote READY is one entry whose payload frames are its used rows."""
        if len(entries) != 1:
            return f"remote READY with {len(entries)} entries, need 1 with payload"
        return payload_error(self.samples.fields, entries[0].lengths, payload)

    def reject(self, producer: Producer, why: str, detail: str) -> None:
        """Drop and count a READY, and strike its producer: its grants come back now,
        uncharged, instead of after a lease (docs/design.md#contract-10)."""
        self.drop(why, f"{detail} (from {producer.name})")
        self.book.strike(producer.ident, f"{why}: {detail}")

    def accept(self, producer: Producer, e: p.ReadyEntry, payload: list[bytes]) -> None:
        why = lengths_error(e.lengths, self.limits)
        if not why and self.schema is not None:
            why = self.schema.lengths_error(e.lengths)
        if why:
            self.reject(producer, "malformed", why)
            return
        if not self.slots.owns(producer.ident, e.slot, e.generation, e.item):
            detail = f"READY of slot {e.slot} gen {e.generation} item {e.item}"
            if self.slots.holds(producer.ident, e.slot, e.generation):
                self.reject(producer, "malformed", f"{detail}: not the item granted")
            elif not self.slots.granted_ever(e.slot, e.generation):
                self.reject(producer, "malformed", f"{detail}: never granted")
            else:  # a late READY of a grant taken back: nothing of its producer's to return
                self.late(producer, e.slot, e.generation, detail)
            return
        if producer.remote:
            copy_payload(self.samples, e.slot, e.generation, e.lengths, payload)
            if self.slot_checksum(e.slot, e.lengths) != e.checksum:  # a lie, or a bug
                # What it sent, we copied: a mismatch is its own (a stale local writer
                # can touch the slot only later, which take() checks).
                why = f"READY of slot {e.slot} item {e.item}: rows that do not hash to its checksum"
                self.reject(producer, "bad-rows", why)
                return
        elif int(self.seals[e.slot]) != e.generation:
            why = f"slot {e.slot} is not sealed with generation {e.generation}"
            self.reject(producer, "unsealed", why)
            return
        if (twin := self.slots.twins.audit_of(e.slot)) is not None:
            self.answer_audit(producer, e, twin)
            return
        why = self.misfit(e)
        if why and producer.remote:  # a remote producer's word that the item is too long
            if self.doubt_skip(producer, (producer.ident, e.slot, e.generation, e.item),
                               Skipped(why, "bucket", "", "")):  # fmt: skip
                self.book.delivered(producer)
            return
        self.book.delivered(producer)
        if why:
            self.slots.skip(producer.ident, e.slot, e.generation, e.item, why, "bucket", "")
            return
        self.accepted[e.slot] = e
        self.no_auditor &= producer.remote  # a local producer delivers: it can audit
        if producer.remote and self.audits.due(producer.peer.ban) and self.may_audit():
            self.slots.twins.hold(producer.ident, e.slot, e.generation, e.item, producer.name)
            self.slots.count("audits")
        else:
            self.slots.ready(producer.ident, e.slot, e.generation, e.item)

    def may_audit(self) -> bool:
        """Hold a remote answer for an audit? Not once an audit went unanswered, until a
        local producer delivers again (a local producer that joins and never answers
        must not hold every remote sample a lease: audits.py)."""
        return not self.no_auditor

    def late(self, producer: Producer, slot: int, generation: int, detail: str) -> None:
        """A READY or SKIP of a grant taken back: dropped, counted "beaten" when a backup
        had beaten it (twins.py), else "stale"."""
        beaten = self.slots.twins.late(producer.ident, slot, generation)
        self.drop("beaten" if beaten else "stale", detail)

    def on_skip(self, msg: p.Skip, producer: Producer) -> None:
        """The grantee cannot use this input: the item is skipped, unless the SKIP answers
        an audit or comes from a remote producer (then a local one decides: audits.py)."""
        self.book.credit(producer.ident, 1)
        grant = (producer.ident, msg.slot, msg.generation, msg.item)
        cause = producer.causes.get(msg.stage, "")
        owned = self.slots.owns(*grant)
        if owned and (twin := self.slots.twins.audit_of(msg.slot)) is not None:
            self.skipped_audit(producer, msg, twin, cause)
        elif owned and producer.remote:  # counted as its answer once a local one agrees
            if not self.doubt_skip(producer, grant, Skipped(msg.reason, msg.stage, msg.path,
                                                             cause)):  # fmt: skip
                return
        elif self.slots.skip(*grant, msg.reason, msg.stage, msg.path, cause):
            pass
        else:
            self.late(producer, msg.slot, msg.generation, f"SKIP of slot {msg.slot} "
                      f"generation {msg.generation}")  # fmt: skip
            return
        self.book.delivered(producer)

    def doubt_skip(self, producer: Producer, grant: tuple[bytes, int, int, int],
                   said: Skipped) -> bool:  # fmt: skip
        """A remote producer says its grant's item cannot be used (a SKIP, or a READY too
        long for the item's bucket): held until a local producer has tried the item
        (audits.py); with no local producer to ask, skipped only if believe_skip says
        so, else granted again elsewhere, uncharged. True if skipped now. Believed at
        once, either would let one peer quarantine any item it is granted; counted as
        the peer's answer before it is confirmed, skips would shield a peer that holds
        grants from its strikes for holding (consumer/stager/peers.py)."""
        if self.may_audit():
            self.slots.twins.hold(*grant, producer.name, said)
            self.slots.count("audits")
            return False
        if self.believe_skip(grant[3], producer.peer):
            self.slots.skip(*grant, said.reason, said.stage, said.path, said.cause)
            return True
        self.slots.reclaim(grant[1], fence=False, charged=False)
        return False

    def answer_audit(self, producer: Producer, e: p.ReadyEntry, twin: Twin) -> None:
        """A local producer's READY for an audit: the remote sample is delivered if the two
        agree; else this one is, and the remote peer is struck. A remote SKIP it
        overrules costs its peer half its grant limit (it may be honest)."""
        self.slots.answered(producer.ident, e.slot, e.generation, e.item)
        self.book.delivered(producer)
        position, keep = self.slots.slots[e.slot].position, e.slot
        if twin.skipped is not None:
            self.slots.count("skips_overruled")
            self.book.beaten(twin.ident, twin.peer)
            self.drop("overruled-skip", f"item {e.item}: {twin.name} skipped it "
                      f"({twin.skipped.reason}), {producer.name} did not")  # fmt: skip
        else:
            held = self.accepted[twin.first]
            why = disagreement(self.samples, twin.first, held.lengths, e.slot, e.lengths)
            self.slots.count("audits_failed" if why else "audits_passed")
            if why:
                self.caught(twin, e.item, why)
            else:
                keep = twin.first
                if twin.peer is not None:
                    self.audits.passed(twin.peer.ban)
        if keep != e.slot:
            self.slots.twins.settle(Event("sample", position, e.item, slot=keep))
            return
        self.accepted.pop(twin.first, None)
        if misfit := self.misfit(e):
            self.slots.twins.settle(Event("skip", position, e.item, reason=misfit, stage="bucket"))
            return
        self.accepted[e.slot] = e
        self.slots.twins.settle(Event("sample", position, e.item, slot=e.slot))

    def skipped_audit(self, producer: Producer, msg: p.Skip, twin: Twin, cause: str) -> None:
        """A local producer cannot use the item of an audit: skipped if the remote one
        said so too; else the remote sample is delivered (inconclusive: this host may
        lack what the other has)."""
        self.slots.answered(producer.ident, msg.slot, msg.generation, msg.item)
        position = self.slots.slots[msg.slot].position
        if twin.skipped is not None:
            self.confirmed(twin)
            self.slots.twins.settle(Event("skip", position, msg.item, reason=msg.reason,
                                          stage=msg.stage, path=msg.path, cause=cause))  # fmt: skip
            return
        self.slots.count("audits_inconclusive")
        self.slots.twins.settle(Event("sample", position, msg.item, slot=twin.first))

    def confirmed(self, twin: Twin) -> None:
        """A remote SKIP held for an audit stands: it counts as its producer's answer."""
        if (remote := self.book.producers.get(twin.ident)) is not None:
            self.book.delivered(remote)

    def caught(self, twin: Twin, item: int, why: str) -> None:
        """A remote peer's sample differs from this host's: a strike, and its samples
        still waiting to leave are granted again (audits.py)."""
        self.drop("audit-failed", f"item {item} from {twin.name}: {why}")
        if twin.peer is None:
            return
        for k in self.slots.twins.unfinish(twin.peer.ban):
            self.accepted.pop(k, None)
        self.book.strike(twin.ident, f"audit: its sample differs from this host's: {why}",
                         twin.peer)  # fmt: skip

    def expire_audits(self) -> None:
        """Audits no local producer took in time are given up (audits.py): a lease once a
        local producer has joined the run (counted from then), else AUDIT_GRACE_S (one
        may be starting beside the stager). A held sample is delivered unchecked; a held
        SKIP is believed only if the item was doubted before, else tried again."""
        lease_s, since = self.slots.lease_s, self.book.first_local_at
        wait_s = lease_s if since is not None else max(lease_s, audits.AUDIT_GRACE_S)
        for position, twin in self.slots.twins.overdue(self.book.clock(), wait_s, since or 0):
            self.slots.count("audits_unanswered")
            if not self.no_auditor:
                log.warning("no local producer audited a remote sample in %.0f s: remote"
                            " samples are not audited until one delivers (audits.py)",
                            wait_s)  # fmt: skip
                self.no_auditor = True
            item, sk = self.plan.item_at(position), twin.skipped
            if sk is None:
                self.slots.twins.settle(Event("sample", position, item, slot=twin.first))
            elif self.believe_skip(item, twin.peer):
                self.confirmed(twin)
                self.slots.twins.settle(
                    Event(
                        "skip",
                        position,
                        item,
                        reason=sk.reason,
                        stage=sk.stage,
                        path=sk.path,
                        cause=sk.cause,
                    )
                )
            else:
                self.slots.twins.retry(position)

    def believe_skip(self, item: int, peer: PeerId | None) -> bool:
        """A remote SKIP no local producer checked: believed if another account doubted
        the item before (or none other works), else doubted now and tried again
        elsewhere (an item is charged only for failures that follow it across producers:
        docs/design.md#contract-10)."""
        account = peer.account if peer is not None else ""
        first = self.doubted.get(item)
        if first is not None and (first != account or len(self.book.allowances()[0]) <= 1):
            del self.doubted[item]
            return True
        self.doubted[item] = account
        while len(self.doubted) > MAX_SUSPECTS:
            del self.doubted[next(iter(self.doubted))]
        self.slots.count("skips_doubted")
        return False

    def misfit(self, e: p.ReadyEntry) -> str:
        """'' if the sample fits its batch's bucket, else why not (the length table
        said otherwise: a changed file, or a header that lies)."""
        if not self.plan.batched:
            return ""
        b = self.plan.bucket_at(self.slots.slots[e.slot].position)
        limit = b.frames if "mel" in self.samples.fields else b.frames * self.hop_length
        if e.lengths[0] <= b.text and e.lengths[1] <= limit:
            return ""
        return (
            f"longer than its length bucket ({e.lengths} > text {b.text}, {limit}): the "
            "length table is stale; `ringfeed lengths CONFIG` measures it again"
        )

    def take(self, event: Event) -> str | None:
        """Copy a READY sample into the batch, then check it: None if it is taken.
        A stale writer touched the slot (seqlock: either producer field moved) or its
        producer's rows fail the check (checksum, content): nothing is taken, and the
        answer is '' (grant the item again) or, when a second peer sent bad content for
        the item, the reason to skip it."""
        entry = self.accepted.pop(event.slot)
        copies = self.builder.add(self.samples, event.slot, event.item, entry.lengths,
                                  event.position)  # fmt: skip
        k, slot = event.slot, self.slots.slots[event.slot]
        if self.writing[k] != slot.generation or self.seals[k] != slot.generation:
            self.builder.drop_last()
            self.drop("torn", f"slot {k} item {event.item} changed after its READY")
            return ""
        if rows_checksum(copies) != entry.checksum:
            # Rows changed under intact seals: a stale writer (stopped past its lease, in
            # another PID namespace) wrote into a slot granted since; not the grantee's
            # doing (a remote grantee's rows were checked at READY), so no strike.
            self.builder.drop_last()
            self.drop("torn", f"slot {k} item {event.item}: rows changed after its READY")
            return ""
        why = content_error(zip(self.samples.fields, copies, strict=True), self.vocab)
        if why:
            self.builder.drop_last()
            return self.bad_rows(event, slot, why)
        self.slots.release(event.slot)
        if entry.marks & AUDIO and self.marked is not None:
            self.marked(event.item, entry.marks)
        return None

    def bad_rows(self, event: Event, slot: Slot, why: str) -> str:
        """A producer's rows, hashed as it said, hold values out of range: a strike
        against its peer. Its item is skipped only when another peer (another key,
        host or local pool) sent out-of-range rows for it too."""
        producer = self.book.producers.get(slot.producer) if slot.producer else None
        name = producer.name if producer is not None else "a producer gone since"
        self.drop("bad-rows", f"item {event.item} from {name}: {why}")
        if slot.producer is None or slot.peer is None:
            return ""
        self.book.strike(slot.producer, why, slot.peer)
        first = self.suspects.pop(event.item, None)
        if first is not None and first != slot.peer.account:
            return f"two producers sent bad rows for it ({first}; {slot.peer.account}): {why}"
        self.suspects[event.item] = slot.peer.account
        while len(self.suspects) > MAX_SUSPECTS:
            del self.suspects[next(iter(self.suspects))]
        return ""

    def slot_checksum(self, slot: int, lengths: list[int]) -> int:
        fields = zip(self.samples.fields, lengths, strict=True)
        return rows_checksum(self.samples.view(name)[slot][:n] for name, n in fields)

    def forget_views(self) -> None:
        """Before the ring is unmapped: no view of it may outlive the map."""
        self.seals = self.writing = None
