"""The stager's intake of answers: the checks of each READY and SKIP, and audit verdicts.

A part of the stager (consumer/stager/stager.py). A READY answers places of one run
(shared/wire/grants.py); it is refused whole when it names what its producer was not
granted (a generation never granted or granted to another, a place twice, a place not in
the run, not the item granted) or does not line up. Places taken back from its producer
since are dropped and counted ("stale", or "beaten" by a backup), never a strike. Each
place it still holds is accepted when its true lengths fit the place (its batch's length
bucket, or a spare) and agree with each other, and, local, its record is sealed with the
run's generation; a remote producer's rows come as payload frames, copied into the
places here and hashed where they landed (shared/memory/places.py): rows that do not hash
to their READY's checksum are that producer's lie. Then every value of the answered rows
must be in range (shared/sample/content.py): a producer that skipped that check of its
own is struck at once, and the item skipped only when a second peer sent bad values for
it too. The check after the write (seqlock, and the rows hash to the READY's checksum) is
the assembly's, when the batch is complete (consumer/stager/assembly.py,
docs/design.md#contract-7): what fails it there is torn (a stale writer's doing, or a
local producer's), granted again uncharged.

Whatever fails these checks is a strike against the producer that sent it
(docs/design.md#contract-10): its grants come back at once and uncharged, so a bad
READY never waits out a lease, never leaves a place held, and never counts against an
innocent item.

Audits (consumer/stager/audits.py): some READYs and every SKIP of a remote producer
wait until a local producer has computed the item too; the intake takes the local
answer and decides.
"""

from __future__ import annotations

import logging

import numpy as np

from ringfeed.consumer.stager import audits
from ringfeed.consumer.stager.audits import AuditPolicy, disagreement
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.ledger import Answer, Ledger
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.producer_book import ProducerBook
from ringfeed.consumer.stager.state import Finished, Position, Producer
from ringfeed.consumer.stager.twins import Skipped, Twin
from ringfeed.shared.memory.places import Places, write_frames
from ringfeed.shared.memory.ring import rows_checksum
from ringfeed.shared.sample.content import content_error
from ringfeed.shared.sample.schema import SampleSchema
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# Items remembered with the account that first doubted them.
MAX_SUSPECTS = 4096


class Intake:
    """READY and SKIP handling, and the verdicts of audits."""

    def __init__(
        self,
        places: Places,
        ledger: Ledger,
        book: ProducerBook,
        schema: SampleSchema,
        drop: Drops,
        audit_policy: AuditPolicy,
        vocab_size: int,
    ) -> None:
        """places: where samples lie (both rings); schema: the sample schema (what a
        READY's lengths may be); audit_policy: which remote samples wait for an audit;
        vocab_size: the token ids a sample may hold."""
        self.places, self.ledger, self.book, self.schema = places, ledger, book, schema
        self.drop, self.audits, self.vocab = drop, audit_policy, vocab_size
        self.n_fields = len(schema.fields)
        self.row_bytes = [
            int(np.prod(f.inner if f.length != "none" else f.shape[1:], dtype=np.int64))
            * f.dtype.itemsize
            for f in schema.fields
        ]
        self.check_lengths = bool(schema.extras)
        self.no_auditor = False  # an audit found no local producer for a lease
        # item -> the account whose SKIP of it no local producer checked (tried again).
        self.doubted: dict[int, str] = {}
        # item -> the account (peer) that first sent bad values for it.
        self.suspects: dict[int, str] = {}

    # ------------------------------------------------------------ READY
    def on_ready(self, msg: p.Ready, producer: Producer, payload: list[bytes]) -> None:
        """Accept each place of a READY that its producer still holds (module docstring)."""
        entries = msg.entries(self.n_fields)
        if isinstance(entries, str):
            self.reject(producer, "malformed", entries)
            return
        self.book.credit(producer.ident, len(entries))  # each entry asks for a grant
        verdict = self.ledger.answer(
            producer.ident, msg.generation, [e.place for e in entries], [e.item for e in entries]
        )
        if verdict.refused:
            self.reject(producer, verdict.why, f"READY: {verdict.refused}")
            return
        slot, shape = verdict.slot, verdict.shape
        why = self.lengths_error(entries, slot, shape)
        if not why and producer.remote:
            why = self.payload_error(entries, payload)
        if why:
            self.reject(producer, "malformed", why)
            return
        self.stale(producer, verdict, msg.generation, "READY")
        owned = [(k, e) for k, e in zip(verdict.places, entries, strict=True) if k in verdict.owned]
        if producer.remote:
            offsets = [0] * self.n_fields
            for k, e in zip(verdict.places, entries, strict=True):
                copied = self.copy_in(k, slot, shape, e, payload, offsets)
                if k in verdict.owned and copied != e.checksum:  # a lie, or a bug: theirs
                    why = f"READY of item {e.item}: rows that do not hash to its checksum"
                    self.reject(producer, "bad-rows", why)
                    return
        elif unsealed := [e for k, e in owned if self.ledger.seal(k) != e.generation]:
            why = f"place {unsealed[0].place} is not sealed with generation {msg.generation}"
            self.reject(producer, "unsealed", why)
            return
        bad = self.bad_values(slot, shape, owned)
        for k, e in owned:
            if not self.ledger.holds_answer(k, e.generation, producer.ident):
                return  # struck out by an earlier entry of this READY
            if k in bad:
                self.bad_rows(producer, k, e, bad[k])
            else:
                self.accept(producer, k, e)

    def lengths_error(
        self, entries: list[p.ReadyEntry], slot: int, shape: tuple[int, int, int]
    ) -> str:
        """'' if every entry's lengths are within 1..what its place holds (and agree with
        each other when the schema declares more fields), else why not."""
        limits = np.asarray(self.places.limits(slot, shape))
        lengths = np.asarray([e.lengths for e in entries])
        if not ((lengths > 0) & (lengths <= limits)).all():
            bad = lengths[~((lengths > 0) & (lengths <= limits)).all(axis=1)][0]
            return f"READY lengths {list(bad)} outside 1..{list(limits)}"
        if self.check_lengths:
            for e in entries:
                if why := self.schema.lengths_error(e.lengths):
                    return why
        return ""

    def payload_error(self, entries: list[p.ReadyEntry], payload: list[bytes]) -> str:
        """'' if a remote READY's frames are exactly its entries' used rows, field by field."""
        if len(payload) != self.n_fields:
            return f"remote READY with {len(payload)} payload frames, need {self.n_fields}"
        for k, frame in enumerate(payload):
            need = sum(e.lengths[k] for e in entries) * self.row_bytes[k]
            if len(frame) != need:
                name = self.schema.fields[k].name
                return f"{name} frame of {len(frame)} bytes, need {need}"
        return ""

    def copy_in(
        self,
        k: int,
        slot: int,
        shape: tuple[int, int, int],
        e: p.ReadyEntry,
        payload: list[bytes],
        offsets: list[int],
    ) -> int:
        """Copy one remote entry's rows into its place, sealed as its producer would have
        (a place it no longer holds is only skipped over); returns their checksum as
        copied, or -1 when not copied."""
        index = self.ledger.locate(k)[1]
        here = list(offsets)
        for j in range(self.n_fields):
            offsets[j] += e.lengths[j] * self.row_bytes[j]
        if not self.ledger.holds_answer(k, e.generation):
            return -1
        record = self.places.record(slot, index)
        record["writing_generation"] = e.generation
        dst = self.places.fields(slot, shape, index)
        pads = self.places.pads if slot >= 0 else None
        checksum = write_frames(dst, payload, here, e.lengths, pads)
        record["lengths"][0, : len(e.lengths)] = e.lengths
        record["sealed_generation"] = e.generation
        return checksum

    def stale(self, producer: Producer, verdict: Answer, generation: int, what: str) -> None:
        """Places of an answer taken back from its producer since: dropped, counted
        "beaten" when a backup had beaten it (twins.py), else "stale"."""
        if verdict.late and not verdict.stale:
            self.drop("stale", f"{what} of generation {generation} from {producer.name}")
        for k in verdict.stale:
            beaten = self.ledger.beaten_answer(producer.ident, k, generation)
            self.drop(
                "beaten" if beaten else "stale",
                f"{what} of place {k} generation {generation} from {producer.name}",
            )

    def reject(self, producer: Producer, why: str, detail: str) -> None:
        """Drop and count a READY, and strike its producer: its grants come back now,
        uncharged, instead of after a lease (docs/design.md#contract-10)."""
        self.drop(why, f"{detail} (from {producer.name})")
        self.book.strike(producer.ident, f"{why}: {detail}")

    def bad_values(
        self, slot: int, shape: tuple[int, int, int], owned: list[tuple[int, p.ReadyEntry]]
    ) -> dict[int, str]:
        """place -> why, for each answered place whose used rows hold values out of range;
        place by place (the rows of a run are more than a cache holds: a row's second
        reduction finds it in this core's cache after its first)."""
        bad, names = {}, self.places.names
        for k, e in owned:
            fields = self.places.fields(slot, shape, self.ledger.locate(k)[1])
            used = [(name, f[:n]) for name, f, n in zip(names, fields, e.lengths, strict=True)]
            if why := content_error(used, self.vocab):
                bad[k] = why
        return bad

    def salvage(self, producer: Producer) -> None:
        """A local producer died (the kernel's pid is gone): each place it holds that it
        wrote whole is taken as its READY would have been (it died before sending it):
        the lengths from the place's record, the rows hashed and their values checked
        here; a place whose lengths or values fail is left to be taken back. The producer
        book then takes the rest back, charging the one it was writing
        (docs/faults-and-security.md#a-producer-dies)."""
        for k, e in self.ledger.written(producer.ident, self.n_fields):
            slot, shape, index = self.ledger.where(k)
            if self.lengths_error([e], slot, shape):
                continue
            fields = self.places.fields(slot, shape, index)
            used = [f[:n] for f, n in zip(fields, e.lengths, strict=True)]
            if content_error(zip(self.places.names, used, strict=True), self.vocab):
                continue
            entry = e._replace(checksum=rows_checksum(used))
            self.ledger.answered(k)
            self.ledger.ready(k, entry, producer.ident, producer.peer)
            self.ledger.count("salvaged")
            self.book.delivered(producer)

    def bad_rows(self, producer: Producer, k: int, e: p.ReadyEntry, why: str) -> None:
        """A producer's rows, hashed as it said, hold values out of range: a strike against
        its peer (its grants come back, uncharged). Its item is skipped only when another
        peer (another key, host or local pool) sent out-of-range rows for it too."""
        account = producer.peer.account
        first = self.suspects.pop(e.item, None)
        if first is not None and first != account:
            pos = self.ledger.answered(k)
            bad = f"two producers sent bad rows for it ({first}; {account}): {why}"
            how = Finished("skip", pos.position, pos.item, reason=bad, stage="content")
            self.ledger.skip(k, how)
        else:
            self.suspects[e.item] = account
            while len(self.suspects) > MAX_SUSPECTS:
                del self.suspects[next(iter(self.suspects))]
        self.reject(producer, "bad-rows", f"item {e.item}: {why}")

    def accept(self, producer: Producer, k: int, e: p.ReadyEntry) -> None:
        """One place its producer holds, its lengths, seal and values fine: taken as its
        position's sample, an audit's answer, or held for an audit."""
        if (audit := self.ledger.twins.audit_of(k)) is not None:
            self.answer_audit(producer, k, e, *audit)
            return
        pos = self.ledger.answered(k)
        self.book.delivered(producer)
        self.no_auditor &= producer.remote  # a local producer delivers: it can audit
        if producer.remote and self.audits.due(producer.peer.ban) and self.may_audit():
            self.ledger.twins.hold(pos, k, producer.ident, producer.peer, producer.name, entry=e)
            self.ledger.count("audits")
        else:
            self.ledger.ready(k, e, producer.ident, producer.peer)

    def may_audit(self) -> bool:
        """Hold a remote answer for an audit? Not once an audit went unanswered, until a
        local producer delivers again (a local producer that joins and never answers
        must not hold every remote sample a lease: audits.py)."""
        return not self.no_auditor

    # ------------------------------------------------------------ SKIP
    def on_skip(self, msg: p.Skip, producer: Producer) -> None:
        """The grantee cannot use this input: the item is skipped, unless the SKIP answers
        an audit or comes from a remote producer (then a local one decides: audits.py)."""
        self.book.credit(producer.ident, 1)
        verdict = self.ledger.answer(producer.ident, msg.generation, [msg.place], [msg.item])
        if verdict.refused:
            self.reject(producer, verdict.why, f"SKIP: {verdict.refused}")
            return
        if not verdict.owned:
            self.stale(producer, verdict, msg.generation, "SKIP")
            return
        k = verdict.places[0]
        cause = producer.causes.get(msg.stage, "")
        said = Skipped(msg.reason, msg.stage, msg.path, cause)
        if (audit := self.ledger.twins.audit_of(k)) is not None:
            self.skipped_audit(producer, k, msg, *audit, cause)
            self.book.delivered(producer)
            return
        pos = self.ledger.answered(k)
        if producer.remote:  # counted as its answer once a local producer agrees
            if self.doubt_skip(producer, k, pos, said):
                self.book.delivered(producer)
            return
        self.ledger.skip(k, self.skipped(pos, said, producer))
        self.book.delivered(producer)

    @staticmethod
    def skipped(pos: Position, said: Skipped, producer: Producer | None = None) -> Finished:
        return Finished(
            "skip",
            pos.position,
            pos.item,
            reason=said.reason,
            stage=said.stage,
            path=said.path,
            cause=said.cause,
            ident=producer.ident if producer else None,
            peer=producer.peer if producer else None,
        )

    def doubt_skip(self, producer: Producer, k: int, pos: Position, said: Skipped) -> bool:
        """A remote producer says its grant's item cannot be used (a SKIP, answered
        already): held until a local producer has tried the item (audits.py); with no
        local producer to ask, skipped only if believe_skip says so, else granted again
        elsewhere, uncharged. True if skipped now. Believed at once, either would let one
        peer quarantine any item it is granted; counted as the peer's answer before it is
        confirmed, skips would shield a peer that holds grants from its strikes for
        holding (consumer/stager/peers.py)."""
        if self.may_audit():
            self.ledger.twins.hold(pos, k, producer.ident, producer.peer, producer.name, said)
            self.ledger.count("audits")
            return False
        if self.believe_skip(pos.item, producer.peer):
            self.ledger.skip(k, self.skipped(pos, said, producer))
            return True
        self.ledger.free_place(k)
        self.ledger.again(pos, False, producer.peer.account)
        return False

    # ------------------------------------------------------------ audit verdicts
    def answer_audit(
        self, producer: Producer, k: int, e: p.ReadyEntry, pos: Position, twin: Twin
    ) -> None:
        """A local producer's READY for an audit: the remote sample is delivered if the two
        agree; else this one is, and the remote peer is struck. A remote SKIP it
        overrules costs its peer half its grant limit (it may be honest)."""
        self.ledger.answered(k)
        self.book.delivered(producer)
        keep, kept_entry = k, e
        if twin.skipped is not None:
            self.ledger.count("skips_overruled")
            self.book.beaten(twin.ident, twin.peer)
            self.drop(
                "overruled-skip",
                f"item {e.item}: {twin.name} skipped it "
                f"({twin.skipped.reason}), {producer.name} did not",
            )
        else:
            held = twin.entry
            assert held is not None
            why = disagreement(
                self.places,
                self.ledger.where(twin.first),
                held.lengths,
                self.ledger.where(k),
                e.lengths,
            )
            self.ledger.count("audits_failed" if why else "audits_passed")
            if why:
                self.caught(twin, e.item, why)
            else:
                keep, kept_entry = twin.first, held
                if twin.peer is not None:
                    self.audits.passed(twin.peer.ban)
        who = (twin.ident, twin.peer) if keep == twin.first else (producer.ident, producer.peer)
        self.ledger.twins.settle(
            pos,
            Finished("sample", pos.position, pos.item, keep, kept_entry, ident=who[0], peer=who[1]),
        )

    def skipped_audit(
        self, producer: Producer, k: int, msg: p.Skip, pos: Position, twin: Twin, cause: str
    ) -> None:
        """A local producer cannot use the item of an audit: skipped if the remote one
        said so too; else the remote sample is delivered (inconclusive: this host may
        lack what the other has)."""
        self.ledger.answered(k)
        if twin.skipped is not None:
            self.confirmed(twin)
            said = Skipped(msg.reason, msg.stage, msg.path, cause)
            self.ledger.twins.settle(pos, self.skipped(pos, said, producer))
            return
        self.ledger.count("audits_inconclusive")
        self.ledger.twins.settle(pos, held_sample(pos, twin))

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
        self.ledger.twins.unfinish(twin.peer.ban)
        self.book.strike(
            twin.ident, f"audit: its sample differs from this host's: {why}", twin.peer
        )

    def expire_audits(self) -> None:
        """Audits no local producer took in time are given up (audits.py): a lease once a
        local producer has joined the run (counted from then), else AUDIT_GRACE_S (one
        may be starting beside the stager). A held sample is delivered unchecked; a held
        SKIP is believed only if the item was doubted before, else tried again."""
        lease_s, since = self.ledger.lease_s, self.book.first_local_at
        wait_s = lease_s if since is not None else max(lease_s, audits.AUDIT_GRACE_S)
        for pos in self.ledger.twins.overdue(self.book.clock(), wait_s, since or 0):
            twin = pos.twin
            assert twin is not None
            self.ledger.count("audits_unanswered")
            if not self.no_auditor:
                log.warning(
                    "no local producer audited a remote sample in %.0f s: remote"
                    " samples are not audited until one delivers (audits.py)",
                    wait_s,
                )
                self.no_auditor = True
            sk = twin.skipped
            if sk is None:
                self.ledger.twins.settle(pos, held_sample(pos, twin))
            elif self.believe_skip(pos.item, twin.peer):
                self.confirmed(twin)
                self.ledger.twins.settle(pos, self.skipped(pos, sk))
            else:
                self.ledger.twins.retry(pos)

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
        self.ledger.count("skips_doubted")
        return False


def held_sample(pos: Position, twin: Twin) -> Finished:
    """The sample a held remote READY answered, as its position's finish: delivered once
    its audit passed, or once no local producer could audit it."""
    return Finished(
        "sample", pos.position, pos.item, twin.first, twin.entry, ident=twin.ident, peer=twin.peer
    )
