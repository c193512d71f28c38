"""The slot ledger's face: the verbs every other part of the stager uses, and what they
take and return.

Every part of the stager but the ledger package itself is typed against
:class:`SlotLedger` (consumer/stager/stager.py builds the one :class:`Ledger
<ringfeed.consumer.stager.ledger.table.Ledger>`), and mypy over consumer/stager, run by
.ci/run, holds it: a part that reads one of the ledger's columns, or calls a verb that
is not here, fails CI. The verbs take and return whole runs and batches (numpy columns,
one row per place or position), never one row at a time: a run of 64 rows is one call.
Policies (backups, audits, the producers' trust) get results back, not hooks: a verb
says what happened (these grants were beaten, this item was charged) and the caller
decides.

Numbers. A *place* is where one sample is written: row r of batch slot b, or a spare
slot s; the wire names a place by that row or spare slot (``Run.places``,
``Answer.index``). A *position* is a plan position (consumer/stager/plan/plan.py). A
*key* (``AuditCase.key``, ``BatchOut.key``) is the ledger's own handle of a position or
batch, valid until the call that ends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ringfeed.consumer.stager.peers import PeerId
from ringfeed.shared.run.stats_record import SlotStats
from ringfeed.shared.sample.schema import SPARE_SHAPE

Shape = tuple[int, int, int]  # a batch's (rows, frames, text)

# How a position finished (BatchOut.kind).
SAMPLE, SKIPPED = 1, 2
# How a row that failed the assembly's checks goes back (SlotLedger.returned): granted
# again, counted torn (its seqlock or hash), or granted again (bad values, a first time);
# any other text skips its item for that reason.
TORN, AGAIN = "torn", "again"
NO_ROWS = np.zeros(0, np.int64)


@dataclass(frozen=True)
class Skip:
    """Why an item is skipped: the reason, the stage that gave up on it, and from a
    producer the input's path and that stage's cause (producer/causes.py)."""

    reason: str
    stage: str
    path: str = ""
    cause: str = ""


@dataclass(frozen=True)
class Grantee:
    """Who asks for a run. index: its number in the place records (the inspector's);
    in_place: its grants may name rows of a batch (the producer book says when); avoid:
    other accounts work, so no retry that came back from its own goes to it; auditor:
    a local producer, which takes an audit waiting for one first; local: it maps the
    rings, so a grant taken back while it lives is fenced (it may still write); slowed:
    the accounts whose grants are backed up as soon as they hold the plan back (their
    share was cut: consumer/stager/peers.py)."""

    ident: bytes
    index: int
    peer: PeerId | None
    in_place: bool
    avoid: bool = False
    auditor: bool = False
    local: bool = False
    slowed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Run:
    """A GRANT: a run of places under one generation, rows of batch slot `slot` or, slot
    -1, spare slots, for positions of batches of `shape` (what the producer checks its
    samples fit); places (the wire's numbers), items and
    plan positions in parallel, int64 [n]; keys: the ledger's numbers of its places, to
    hand back (:meth:`SlotLedger.take_back`)."""

    generation: int
    slot: int
    shape: Shape
    places: np.ndarray
    items: np.ndarray
    positions: np.ndarray
    keys: np.ndarray

    def __len__(self) -> int:
        return len(self.places)


@dataclass(frozen=True)
class AuditCase:
    """A position whose remote answer waits for a local producer's (audits.py): the
    held READY's rows (held_at: its batch slot or -1, its batch's shape, its row or
    spare slot; held_lengths [n_fields]) or, held_skip set, the remote SKIP; who sent
    it; and, once a local producer answered, where that answer lies (audit_at)."""

    key: int
    item: int
    held_at: tuple[int, Shape, int] | None
    held_lengths: np.ndarray | None
    held_skip: Skip | None
    ident: bytes
    peer: PeerId | None
    name: str
    audit_at: tuple[int, Shape, int] | None = None


@dataclass(frozen=True)
class Answer:
    """A READY or SKIP checked against its run (:meth:`SlotLedger.check`): refused (why
    the whole message is a lie; `why` as the drops count it: not-granted, repeated,
    wrong-item), or its rows: index (the wire's places), owned (bool [n]: its producer
    still holds the place), audits (row -> the audit that row answers), sealed; late: the whole
    run is forgotten or was taken back (a late answer). slot, shape: the run's batch
    slot (-1: spares) and batch shape."""

    refused: str = ""
    why: str = ""
    ident: bytes = b""
    generation: int = 0
    slot: int = -1
    shape: Shape = SPARE_SHAPE
    index: np.ndarray = field(default_factory=lambda: NO_ROWS)
    keys: np.ndarray = field(default_factory=lambda: NO_ROWS)
    owned: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    late: bool = False
    audits: Mapping[int, AuditCase] = field(default_factory=dict)
    # bool [n]: each place's record sealed with the generation (a local producer's
    # progress field, written last; the intake refuses an owned row that is not).
    sealed: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # Salvaged rows (:meth:`SlotLedger.take_back` of a dead producer): their lengths
    # from the place records, int32 [n, n_fields].
    lengths: np.ndarray | None = None


@dataclass(frozen=True)
class Accepted:
    """What :meth:`SlotLedger.accept` did: samples taken (finished or held for an audit),
    rows dropped as stale (taken back since) and how many of those a backup had beaten,
    and the producers whose grants a backup beat now (their account holds fewer)."""

    samples: int = 0
    stale: int = 0
    beaten: int = 0
    beaten_holders: tuple[tuple[bytes, PeerId | None], ...] = ()


@dataclass(frozen=True)
class TakenBack:
    """What :meth:`SlotLedger.take_back` did: grants taken back, the items charged an
    attempt, those skipped for good (ring.max_item_attempts), and, for a dead producer
    (salvage), the places it wrote whole, as the Answers its READYs would have been (one
    per run, still granted to it: accept them, or take them back)."""

    grants: int = 0
    charged: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()
    written: tuple[Answer, ...] = ()


@dataclass(frozen=True)
class Expired:
    """What :meth:`SlotLedger.expire` found: each producer's grants out longer than a
    lease (ident -> its places), grants a backup beat whose lease ended unanswered
    (ident, peer), and audits no local producer took in time."""

    grants: Mapping[bytes, tuple[int, ...]] = field(default_factory=dict)
    beaten_unanswered: tuple[tuple[bytes, PeerId | None], ...] = ()
    audits: tuple[AuditCase, ...] = ()


@dataclass(frozen=True)
class BatchOut:
    """A batch whose every position finished, for the assembly: its batch slot and
    shape, the global range [first, end) it is cut from, and per position in plan order
    (int64 [n] unless said): positions, items, kind (SAMPLE, SKIPPED: int8), and for a
    sample where it lies (src_slot: a batch slot or -1 for a spare; src_index: its row
    or spare slot), the generation it was accepted under, its lengths (int32 [n,
    n_fields]), its READY's checksum and marks, and who answered it (by: ident). skips:
    position -> why, for the skipped ones. moved_from: the slot it left because a row
    there may still be written (every sample is copied), else -1."""

    key: int
    slot: int
    shape: Shape
    first: int
    end: int
    positions: np.ndarray
    items: np.ndarray
    kind: np.ndarray
    src_slot: np.ndarray
    src_index: np.ndarray
    generations: np.ndarray
    lengths: np.ndarray
    checksums: np.ndarray
    marks: np.ndarray
    by: tuple[bytes | None, ...]
    peers: tuple[PeerId | None, ...]
    skips: Mapping[int, Skip]
    moved_from: int = -1


@dataclass(frozen=True)
class Progress:
    """Where delivery stands: the cursor (the first position of the oldest batch not
    sent), whether a finite plan is done, and batches announced and not yet freed."""

    cursor: int
    exhausted: bool
    in_flight: int


class SlotLedger(Protocol):
    """The slot ledger's face (module docstring); the state machines it keeps are drawn
    in consumer/stager/ledger/table.py."""

    def grant(self, who: Grantee, n: int) -> Run | None:
        """A run of up to n places for this producer, or None (nothing may be granted
        now): an audit waiting for a local producer first (who.auditor), then retries,
        then positions in plan order; rows of a batch where it may (who.in_place), else
        spares; when nothing else may be granted, a backup of the oldest open position."""
        ...

    def check(self, ident: bytes, generation: int, places: list[int], items: list[int]) -> Answer:
        """A READY's or SKIP's places and items against the run of `generation`: refused
        whole, or which rows its producer still holds. Changes nothing."""
        ...

    def accept(
        self,
        answer: Answer,
        keep: np.ndarray,
        lengths: np.ndarray,
        checksums: np.ndarray,
        marks: np.ndarray,
        hold: np.ndarray | None = None,
        verdicts: Mapping[int, str] | None = None,
    ) -> Accepted:
        """The rows of `answer` in `keep` (bool [n], owned ones) are their positions'
        samples, lengths int32 [n, n_fields], checksums and marks [n] as the READY said;
        rows in `hold` wait for an audit (a remote producer's); a row that answers an
        audit is settled by verdicts[row] ('agree': the held sample goes, 'differ': this
        one goes and the held one's peer has its samples not yet sent granted again,
        'overruled': the held SKIP was wrong). Rows the producer no longer holds are
        dropped as stale; a row it holds but `keep` leaves out stays granted (its grant
        is taken back by the caller's strike)."""
        ...

    def skip(self, answer: Answer, why: Skip, how: str) -> None:
        """The one place of a SKIP's `answer` cannot be used: how 'skip' (the item is
        skipped, known bad for the run), 'hold' (a remote SKIP waits for an audit),
        'retry' (doubted: granted again elsewhere, uncharged), or, for the SKIP of an
        audit's local grant, 'confirm' (the held remote SKIP stands) or 'deliver' (the
        held remote sample goes: inconclusive)."""
        ...

    def settle(self, case: AuditCase, how: str, why: Skip | None = None) -> None:
        """An audit no local producer took in time: 'deliver' the held sample, 'skip' the
        item (why), or 'retry' it elsewhere, uncharged."""
        ...

    def take_back(
        self,
        ident: bytes,
        places: tuple[int, ...] | None = None,
        fence: bool = False,
        charge: bool = False,
        done: bool = False,
        salvage: bool = False,
    ) -> TakenBack:
        """Take back this producer's grants (places: the ledger's numbers, as Expired
        gives them; None: all), fenced against it where it may still write (fence), the
        one it was working on charged an attempt of its item (charge); done: it writes
        nothing more, so the places fenced against it are free; salvage: it died, and
        the places it wrote whole are returned as `written` (for the intake to check and
        accept) instead of taken back."""
        ...

    def expire(self, now: float, audit_wait_s: float, audit_since: float) -> Expired:
        """Grants out longer than a lease, beaten grants unanswered for one, and audits
        waiting longer than audit_wait_s (counted from audit_since at the earliest); old
        fences of spares are lifted on the way."""
        ...

    def next_batch(self) -> BatchOut | None:
        """The next batch whose every position finished (the oldest one, when
        deterministic), moved to a free slot first if a row of its own may still be
        written; None if none (or it must move and no slot is free)."""
        ...

    def returned(self, batch: BatchOut, finals: np.ndarray, failed: Mapping[int, str]) -> None:
        """The assembly put batch's samples into rows `finals` (the batch slot's row of
        each position, -1 for a skip) and some failed its checks: failed[row] TORN or
        AGAIN (granted again, uncharged, at another account if one works), or why its
        item is skipped."""
        ...

    def sent(self, batch: BatchOut, n_valid: int, announced: bool = True) -> int:
        """The batch leaves (announced, or dropped empty): its places are free; returns
        its slot's generation (for BATCH_FREE)."""
        ...

    def freed(self, slot: int, generation: int) -> bool:
        """The consumer is done with batch slot `slot`; False for a stale or bogus one."""
        ...

    def restart(self, position: int) -> set[bytes]:
        """Deliver from plan `position` on; returns the producers that held grants."""
        ...

    def mark_bad(self, bad: Mapping[int, tuple[str, str]]) -> None:
        """Items known bad before their grant (item -> (reason, stage)): skipped."""
        ...

    def holding(self, ident: bytes) -> tuple[int, int]:
        """(grants this producer holds, places fenced against it)."""
        ...

    def progress(self) -> Progress: ...

    def stats(self) -> SlotStats: ...
