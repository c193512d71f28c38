"""The stager's intake of answers: the checks of each READY and SKIP, audit verdicts, and
who pays for rows that fail.

A part of the stager (consumer/stager/stager.py). A READY answers places of one run
(shared/wire/grants.py); it is refused whole when it names what its producer was not
granted (a generation never granted or granted to another, a place twice, a place not in
the run, not the item granted: the slot ledger's check) or does not line up. Places
taken back from its producer since are dropped and counted ("stale", or "beaten" by a
backup), never a strike. The places it still holds are accepted at once, a run in one
call of the ledger, when their true lengths fit the place (its batch's length bucket,
or a spare) and agree with each other, and, local, their records are sealed with the
run's generation. A remote producer's rows come as payload frames, copied into the
places here and checked as they land (shared/memory/row_pass.py: values in range, and
the hash of what landed against its READY's checksum): rows that do not hash to their
checksum are that producer's lie, refused whole; rows whose values are out of range are
refused alone. A local producer's rows are read once, by the assembly
(consumer/stager/assembly.py, docs/design.md#contract-7): the seqlock, their values and
their hash in one pass, when the batch is complete; what fails comes back here
(:meth:`Intake.rows_failed`).

Whatever fails these checks is a strike against the producer that sent it
(docs/design.md#contract-10): its grants come back at once and uncharged, so a bad
READY never waits out a lease, never leaves a place held, and never counts against an
innocent item. Only the failing rows go back to be granted again; a row torn (a stale
writer's doing, or its producer's) is granted again uncharged and is no strike; an item
is skipped only when a second peer (another account) sent out-of-range rows for it too.

Audits (consumer/stager/audits.py): some READYs and every SKIP of a remote producer
wait until a local producer has computed the item too; the intake compares the two and
the ledger settles the position by that verdict.

With stager mels (features.device: stager) a row's wave field may hold its clip's
cached log-mel instead (shared/sample/marks.py MEL): its length must be whole frames of
n_mels, at most its batch's bucket frames, or the READY is refused like any wrong
length (and a MEL row where the producers compute the mels, like any lie). A local
producer's keys for the mels the stager will compute are noted for the cache writer
(consumer/stager/cache_writer.py); a remote producer's never are.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from ringfeed.consumer.stager.audits import AuditPolicy, Side, disagreement
from ringfeed.consumer.stager.cache_writer import CacheWriter
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.ledger.face import (
    AGAIN,
    TORN,
    Accepted,
    Answer,
    AuditCase,
    BatchOut,
    Skip,
    SlotLedger,
)
from ringfeed.consumer.stager.numpy_mel import NumpyLogMel
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.producer_book import Producer, ProducerBook, Salvage
from ringfeed.shared.memory.places import Places, write_frames
from ringfeed.shared.memory.row_pass import check_fields
from ringfeed.shared.sample.marks import MEL
from ringfeed.shared.sample.schema import SampleSchema
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# Items remembered with the account that first doubted them.
MAX_SUSPECTS = 4096


class Intake:
    """READY and SKIP handling, audit verdicts, rows that failed their checks."""

    def __init__(
        self,
        *,
        places: Places,
        ledger: SlotLedger,
        book: ProducerBook,
        schema: SampleSchema,
        drop: Drops,
        audit_policy: AuditPolicy,
        vocab_size: int,
        audit_mel: NumpyLogMel | None = None,
        cache_writer: CacheWriter | None = None,
    ) -> None:
        """places: where samples lie (both rings); schema: the sample schema (what a
        READY's lengths may be); audit_policy: which remote samples wait for an audit;
        vocab_size: the token ids a sample may hold; audit_mel: with stager mels, the
        CPU's, for an audit of a mel against a waveform; cache_writer: where a local
        producer's cache keys go (stager mels with the feature cache on)."""
        self.places, self.ledger, self.book, self.schema = places, ledger, book, schema
        self.drop, self.audits, self.vocab = drop, audit_policy, vocab_size
        self.audit_mel, self.cache_writer = audit_mel, cache_writer
        self.n_fields = len(schema.fields)
        names = [f.name for f in schema.fields]
        self.wave = names.index("wave") if "wave" in names else -1  # stager mels
        # Spare places whose sample is a cached mel (MEL), as their last READY said: an
        # audit's held sample (its marks are its READY's only).
        self.spare_mel = np.zeros(places.spares.slots.shape[0], bool)
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
        """Accept the places of a READY that its producer still holds (module docstring)."""
        n = len(msg.places)
        if not msg.consistent(self.n_fields):
            self.reject(producer, "malformed", f"READY with inconsistent list sizes ({n} places)")
            return
        self.book.credit(producer.ident, n)  # each entry asks for a grant
        answer = self.ledger.check(producer.ident, msg.generation, msg.places, msg.items)
        if answer.refused:
            self.reject(producer, answer.why, f"READY: {answer.refused}")
            return
        # As sent (any wire integer, below 2**53), bounded by the places, then narrowed.
        lengths = np.asarray(msg.lengths, np.int64).reshape(n, self.n_fields)
        marks = np.asarray(msg.marks, np.int64)
        mel = (marks & MEL) != 0
        why = self.lengths_error(lengths, answer.slot, answer.shape, mel)
        if not why and producer.remote:
            why = self.payload_error(lengths, payload)
        if why:
            self.reject(producer, "malformed", why)
            return
        lengths = lengths.astype(np.int32)
        keep = answer.owned.copy()
        checksums = np.asarray(msg.checksums, np.int64)
        bad: dict[int, str] = {}
        if producer.remote:
            copied, bad = self.copy_in(answer, lengths, payload)
            lied = answer.owned & (copied != checksums)
            if np.logical_or.reduce(lied):  # a lie, or a bug: theirs
                item = msg.items[int(lied.argmax())]
                self.reject(
                    producer,
                    "bad-rows",
                    f"READY of item {item}: rows that do not hash to its checksum",
                )
                return
            keep[list(bad)] = False
        elif np.logical_or.reduce(unsealed := answer.owned & ~answer.sealed):
            place = int(answer.index[unsealed.argmax()])
            why = f"place {place} is not sealed with generation {msg.generation}"
            self.reject(producer, "unsealed", why)
            return
        if answer.slot < 0:
            self.spare_mel[answer.index[keep]] = mel[keep]
            if self.cache_writer is not None and msg.clip_marks and not producer.remote:
                writer, rows = self.cache_writer, keep & ~mel  # a cached mel is kept already
                writer.noted(answer.index, msg.generation, msg.cache_keys, msg.clip_marks, rows)
        verdicts = self.verdicts(answer, lengths, mel) if answer.audits else None
        hold = self.held_for_audit(producer, answer) if producer.remote else None
        done = self.ledger.accept(answer, keep, lengths, checksums, marks, hold, verdicts)
        self.counted(producer, answer, done, "READY")
        self.no_auditor &= producer.remote  # a local producer delivers: it can audit
        if bad:
            self.bad_rows(producer, answer, msg.items, bad)

    def lengths_error(
        self, lengths: np.ndarray, slot: int, shape: tuple[int, int, int], mel: np.ndarray
    ) -> str:
        """'' if every row's lengths are within 1..what its place holds (and agree with
        each other when the schema declares more fields), else why not. mel (bool [n]):
        the rows whose wave field holds a cached mel (MEL): whole frames of n_mels, at
        most the place's frames (its batch's bucket)."""
        limits = np.asarray(self.places.limits(slot, shape))
        if np.logical_or.reduce(mel):
            if self.wave < 0:
                return "READY of a mel marked as a waveform's (MEL): the producers compute the mels"
            if not self.schema.mels_fit_waves:  # no producer sends one: it would not fit
                return (
                    f"READY of a mel marked cached (MEL) where none fits: n_mels "
                    f"{self.schema.mel_bins} > hop_length {self.schema.hop_length}"
                )
            mel_limits = np.asarray(self.places.limits(slot, shape, mel=True))
            limits = np.where(mel[:, None], mel_limits, limits)
            odd = mel & (lengths[:, self.wave] % self.schema.mel_bins != 0)
            if np.logical_or.reduce(odd):
                n = int(lengths[odd.argmax(), self.wave])
                return f"READY of a mel of {n} values: not whole frames of {self.schema.mel_bins}"
        fits = np.logical_and.reduce((lengths > 0) & (lengths <= limits), axis=1)
        if not np.logical_and.reduce(fits):
            return f"READY lengths {lengths[fits.argmin()].tolist()} outside 1..{limits.tolist()}"
        if self.check_lengths:
            for row in lengths.tolist():
                if why := self.schema.lengths_error(row):
                    return why
        return ""

    def payload_error(self, lengths: np.ndarray, payload: list[bytes]) -> str:
        """'' if a remote READY's frames are exactly its rows' used rows, field by field."""
        if len(payload) != self.n_fields:
            return f"remote READY with {len(payload)} payload frames, need {self.n_fields}"
        for k, frame in enumerate(payload):
            need = int(lengths[:, k].sum()) * self.row_bytes[k]
            if len(frame) != need:
                name = self.schema.fields[k].name
                return f"{name} frame of {len(frame)} bytes, need {need}"
        return ""

    def copy_in(
        self, answer: Answer, lengths: np.ndarray, payload: list[bytes]
    ) -> tuple[np.ndarray, dict[int, str]]:
        """Copy a remote READY's rows into the places its producer still holds, sealed as
        its producer would have (the others are only skipped over); returns each row's
        checksum as copied (-1 where not copied) and the rows whose values are out of
        range (row -> why)."""
        copied = np.full(len(lengths), -1, np.int64)
        bad = {}
        offsets = [0] * self.n_fields
        ends = np.cumsum(lengths, axis=0) * np.asarray(self.row_bytes)
        for row, index in enumerate(answer.index.tolist()):
            here = offsets
            offsets = ends[row].tolist()
            if not answer.owned[row]:
                continue
            record = self.places.record(answer.slot, index)
            record["writing_generation"] = answer.generation
            dst = self.places.fields(answer.slot, answer.shape, index)
            pads = self.places.pads if answer.slot >= 0 else None
            n = lengths[row].tolist()
            names = self.places.names
            copied[row], why = write_frames(dst, payload, here, n, pads, names, self.vocab)
            record["lengths"][0, : self.n_fields] = n
            record["sealed_generation"] = answer.generation
            if why:
                bad[row] = why
        return copied, bad

    def counted(self, producer: Producer, answer: Answer, done: Accepted, what: str) -> None:
        """Drops for the stale rows of an answer ("beaten" when a backup had beaten them,
        ledger/twins.py), the producers a backup beat, and the samples it delivered."""
        if answer.late and not done.stale:
            self.drop("stale", f"{what} of generation {answer.generation} from {producer.name}")
        for _ in range(done.beaten):
            self.drop("beaten", f"{what} of generation {answer.generation} from {producer.name}")
        for _ in range(done.stale - done.beaten):
            self.drop("stale", f"{what} of generation {answer.generation} from {producer.name}")
        for ident, peer in done.beaten_holders:
            self.book.beaten(ident, peer)
        if done.samples:
            self.book.delivered(producer, done.samples)

    def reject(self, producer: Producer, why: str, detail: str) -> None:
        """Drop and count a READY, and strike its producer: its grants come back now,
        uncharged, instead of after a lease (docs/design.md#contract-10)."""
        self.drop(why, f"{detail} (from {producer.name})")
        self.book.strike(producer.ident, f"{why}: {detail}")

    def held_for_audit(self, producer: Producer, answer: Answer) -> np.ndarray | None:
        """bool [n]: the rows of a remote READY held for an audit (audits.py), or None."""
        if not self.may_audit():
            return None
        ban = producer.peer.ban
        hold = np.array([self.audits.due(ban) for _ in range(len(answer.index))], bool)
        hold &= answer.owned
        for row in answer.audits:  # a row that answers an audit is no sample to hold
            hold[row] = False
        return hold if hold.any() else None

    def may_audit(self) -> bool:
        """Hold a remote answer for an audit? Not once an audit went unanswered, until a
        local producer delivers again (a local producer that joins and never answers
        must not hold every remote sample a lease: audits.py)."""
        return not self.no_auditor

    def bad_rows(
        self, producer: Producer, answer: Answer, items: list[int], bad: dict[int, str]
    ) -> None:
        """A remote producer's rows, hashed as it said, hold values out of range: each
        item is skipped if another peer sent bad rows for it too (suspect), else granted
        again; a strike against the peer."""
        for row, why in bad.items():
            if skip := self.suspect(items[row], producer.peer, why):
                self.ledger.skip(one_row(answer, row), Skip(skip, "content"), "skip")
        first = next(iter(bad.values()))
        self.reject(
            producer, "bad-rows", f"{len(bad)} rows of generation {answer.generation}: {first}"
        )

    def suspect(self, item: int, peer: PeerId | None, why: str) -> str:
        """Bad values of `item` from `peer`: why it is skipped when another account sent
        bad values for it before, else '' (it is remembered as a suspect)."""
        account = peer.account if peer is not None else ""
        first = self.suspects.pop(item, None)
        if first is not None and first != account:
            return f"two producers sent bad rows for it ({first}; {account}): {why}"
        self.suspects[item] = account
        while len(self.suspects) > MAX_SUSPECTS:
            del self.suspects[next(iter(self.suspects))]
        return ""

    # ------------------------------------------------------------ after the assembly
    def rows_failed(self, batch: BatchOut, finals: np.ndarray, failed: dict[int, str]) -> None:
        """Rows of a complete batch failed the assembly's checks (failed: row -> why,
        'torn: ...' or the values out of range): a torn row is granted again, uncharged,
        no strike; bad values are a strike against the producer that wrote them, and
        skip the item when another account wrote bad values for it too."""
        verdicts: dict[int, str] = {}
        struck: dict[bytes, str] = {}
        for row, why in failed.items():
            torn = why.startswith("torn")
            self.drop("torn" if torn else "bad-rows", f"item {int(batch.items[row])}: {why}")
            if torn:
                verdicts[row] = TORN
                continue
            skip = self.suspect(int(batch.items[row]), batch.peers[row], why)
            verdicts[row] = skip or AGAIN
            ident = batch.by[row]
            if ident is not None:
                struck.setdefault(ident, f"bad-rows: item {int(batch.items[row])}: {why}")
        self.ledger.returned(batch, finals, verdicts)
        for ident, why in struck.items():
            peer = batch.peers[batch.by.index(ident)]
            self.book.strike(ident, why, peer)

    # ------------------------------------------------------------ salvage
    def salvage(self, salvage: Salvage) -> None:
        """Local producers died: each place one wrote whole is taken as its READY would
        have been (it died before sending it): the lengths from the place's record, the
        rows hashed and their values checked here; a place whose lengths or values fail
        is taken back. The rest was taken back already, charging the one it was writing
        (docs/faults-and-security.md#a-producer-dies)."""
        for producer, answers in salvage:
            for answer in answers:
                self.salvage_run(producer, answer)

    def salvage_run(self, producer: Producer, answer: Answer) -> None:
        assert answer.lengths is not None
        lengths = answer.lengths
        n = len(lengths)
        # With stager mels a wave field may hold a cached mel, which only its READY's
        # marks say (MEL): a place written whole without one is granted again.
        keep = np.full(n, self.wave < 0)
        checksums = np.zeros(n, np.int64)
        limits = np.asarray(self.places.limits(answer.slot, answer.shape))
        for row, index in enumerate(answer.index.tolist()):
            if not keep[row] or not ((lengths[row] > 0) & (lengths[row] <= limits)).all():
                keep[row] = False
                continue
            fields = self.places.fields(answer.slot, answer.shape, index)
            used = [f[:k] for f, k in zip(fields, lengths[row].tolist(), strict=True)]
            checksums[row], why = check_fields(self.places.names, used, self.vocab)
            keep[row] = not why
        if (~keep).any():
            self.ledger.take_back(producer.ident, tuple(answer.keys[~keep].tolist()))
        if keep.any():
            done = self.ledger.accept(answer, keep, lengths, checksums, np.zeros(n, np.int64))
            self.book.delivered(producer, done.samples)

    # ------------------------------------------------------------ SKIP
    def on_skip(self, msg: p.Skip, producer: Producer) -> None:
        """The grantee cannot use this input: the item is skipped, unless the SKIP answers
        an audit or comes from a remote producer (then a local one decides: audits.py)."""
        self.book.credit(producer.ident, 1)
        answer = self.ledger.check(producer.ident, msg.generation, [msg.place], [msg.item])
        if answer.refused:
            self.reject(producer, answer.why, f"SKIP: {answer.refused}")
            return
        if not answer.owned[0]:
            self.counted(
                producer,
                answer,
                self.ledger.accept(answer, answer.owned, *no_rows(1, self.n_fields)),
                "SKIP",
            )
            return
        cause = producer.causes.get(msg.stage, "")
        said = Skip(msg.reason, msg.stage, msg.path, cause)
        if (case := answer.audits.get(0)) is not None:
            self.skipped_audit(producer, answer, said, case)
            self.book.delivered(producer)
            return
        if not producer.remote:
            self.ledger.skip(answer, said, "skip")
            self.book.delivered(producer)
            return
        # A remote SKIP is held until a local producer has tried the item (audits.py); with
        # no local producer to ask, skipped only if believe_skip says so, else granted
        # again elsewhere, uncharged. Believed at once, either would let one peer
        # quarantine any item it is granted; counted as the peer's answer before it is
        # confirmed, skips would shield a peer that holds grants from its strikes for
        # holding (consumer/stager/peers.py).
        if self.may_audit():
            self.ledger.skip(answer, said, "hold")
        elif self.believe_skip(msg.item, producer.peer):
            self.ledger.skip(answer, said, "skip")
            self.book.delivered(producer)
        else:
            self.ledger.skip(answer, said, "retry")

    # ------------------------------------------------------------ audit verdicts
    def verdicts(self, answer: Answer, lengths: np.ndarray, mel: np.ndarray) -> dict[int, str]:
        """A local producer's READY rows that answer audits: 'agree' (the remote sample is
        delivered), 'differ' (this one is, and the remote peer is struck: its samples not
        yet sent are granted again), 'overruled' (the remote SKIP was wrong: its peer's
        grant limit halves, it may be honest). mel: its rows that are cached mels."""
        out = {}
        for row, case in answer.audits.items():
            if not answer.owned[row]:
                continue
            if case.held_skip is not None:
                out[row] = "overruled"
                self.book.beaten(case.ident, case.peer)
                self.drop(
                    "overruled-skip",
                    f"item {case.item}: {case.name} skipped it ({case.held_skip.reason}), "
                    "a local producer did not",
                )
                continue
            assert case.held_at is not None and case.held_lengths is not None
            assert case.audit_at is not None
            at = case.held_at
            held = Side(at, case.held_lengths.tolist(), at[0] < 0 and bool(self.spare_mel[at[2]]))
            mine = Side(case.audit_at, lengths[row].tolist(), bool(mel[row]))
            why = disagreement(self.places, held, mine, self.audit_mel)
            out[row] = "differ" if why else "agree"
            if why:
                self.caught(case, why)
            elif case.peer is not None:
                self.audits.passed(case.peer.ban)
        return out

    def skipped_audit(
        self, producer: Producer, answer: Answer, said: Skip, case: AuditCase
    ) -> None:
        """A local producer cannot use the item of an audit: skipped if the remote one
        said so too; else the remote sample is delivered (inconclusive: this host may
        lack what the other has)."""
        if case.held_skip is not None:
            self.confirmed(case)
            self.ledger.skip(answer, said, "confirm")
        else:
            self.ledger.skip(answer, said, "deliver")

    def confirmed(self, case: AuditCase) -> None:
        """A remote SKIP held for an audit stands: it counts as its producer's answer."""
        if (remote := self.book.producers.get(case.ident)) is not None:
            self.book.delivered(remote)

    def caught(self, case: AuditCase, why: str) -> None:
        """A remote peer's sample differs from this host's: a strike (the ledger grants
        its samples still waiting to leave again: audits.py)."""
        self.drop("audit-failed", f"item {case.item} from {case.name}: {why}")
        if case.peer is not None:
            self.book.strike(
                case.ident, f"audit: its sample differs from this host's: {why}", case.peer
            )

    def expire_audits(self, cases: tuple[AuditCase, ...]) -> None:
        """Audits no local producer took in time (the producer book's expiry says which)
        are given up (audits.py): a held sample is delivered unchecked; a held SKIP is
        believed only if the item was doubted before, else tried again."""
        for case in cases:
            if not self.no_auditor:
                log.warning(
                    "no local producer audited a remote sample in time: remote samples "
                    "are not audited until one delivers (audits.py)"
                )
                self.no_auditor = True
            if case.held_skip is None:
                self.ledger.settle(case, "deliver")
            elif self.believe_skip(case.item, case.peer):
                self.confirmed(case)
                self.ledger.settle(case, "skip", case.held_skip)
            else:
                self.ledger.settle(case, "retry")

    def believe_skip(self, item: int, peer: PeerId | None) -> bool:
        """A remote SKIP no local producer checked: believed if another account doubted
        the item before (or none other works), else doubted now and tried again
        elsewhere (an item is charged only for failures that follow it across
        producers: docs/design.md#contract-10)."""
        account = peer.account if peer is not None else ""
        first = self.doubted.get(item)
        if first is not None and (first != account or len(self.book.allowances()[0]) <= 1):
            del self.doubted[item]
            return True
        self.doubted[item] = account
        while len(self.doubted) > MAX_SUSPECTS:
            del self.doubted[next(iter(self.doubted))]
        return False


def one_row(answer: Answer, row: int) -> Answer:
    """The answer of one of its rows, as a SKIP's would be."""
    audits = {0: answer.audits[row]} if row in answer.audits else {}
    return dataclasses.replace(
        answer,
        index=answer.index[row : row + 1],
        keys=answer.keys[row : row + 1],
        owned=answer.owned[row : row + 1],
        sealed=answer.sealed[row : row + 1] if len(answer.sealed) else answer.sealed,
        audits=audits,
    )


def no_rows(n: int, n_fields: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lengths, checksums and marks of n rows that carry none (a SKIP's stale answer)."""
    return np.zeros((n, n_fields), np.int32), np.zeros(n, np.int64), np.zeros(n, np.int64)
