r"""The stager's slot ledger: the one owner of the state of every place a sample is
written into, every plan position being delivered and every batch slot, kept as a
table of numpy columns and changed a run at a time.

Pure logic, no sockets, so every contract is testable with a fake clock. Every other
part of the stager goes through the verbs of :class:`SlotLedger` (face.py); none reads
these columns.

The columns. Places ``p_*`` [n_rows + n_spares]: state, generation, the position
(``p_q``, a row of the position columns) and holder (a row of the holder table) of its
grant, when it was granted and fenced, whether its holder maps the rings. Positions
``q_*`` [n_batch_slots x rows_per_slot]: row r of batch record b is position row
``b * rows_per_slot + r`` (a batch record lives as long as its batch is in the
window, whatever slot it moves to): plan position, item, how it finished (``q_done``)
and, for a sample, where it lies, its lengths, checksum, marks, generation and who
answered it; its grants out, attempts, whether it waits to be granted again. Batch
records ``b_*``: slot, range, shape, rows, unfinished rows. Batch slots ``s_*``: state,
generation, fenced rows. A run is granted, answered and sent with fancy indexing on
these columns: the Python work per message does not grow with its rows.

Places. A place is where one sample is written: row r of batch slot b (place
``b * rows_per_slot + r``), written in place by the local producer that holds it
(docs/design.md#rows-written-once), or a slot of the spare ring (place ``n_rows + s``)
for what cannot be written where it is delivered: a second grant (a backup, an audit),
the retry of a position whose row its last producer may still write, a producer that
cannot map the batch ring (remote: the stager copies its frames in; or a local one in a
PID namespace we cannot see, whose death we could not tell), and waveforms when the
stager computes the mels. A place's record in shared memory (shared/memory/ring.py
SLOT_DTYPE) is written here, so the inspector reads what the ledger knows::

              grant (a run's generation)
    FREE ----------------------------------> GRANTED ---- READY accepted ---> READY
     ^  ^                                      |                                |
     |  +-- taken back: its holder cannot -----+  taken back: its holder        |
     |      write it (remote, or dead)         |  may still write it            |
     |                                         v                                |
     +------ holder done (HELLO, answer, --- FENCED                             |
     |       death; a spare also after                                         |
     |       FENCE_LEASES leases)                                              |
     +------------------------ its batch was sent, or it was copied out --------+

Positions. The plan is cut into batches (window.py); the ledger holds the batches of up
to ``lookahead`` FILLING batch slots, and each of their positions::

    OPEN --grant--> GRANTED --READY--> SAMPLE (at its place) ---------------+
      ^    (retry)    |  |  \--SKIP---> SKIPPED (its reason) ---------------+--> its
      |               |  |                                                  |   batch
      +--taken back---+  +--second grant (backup, audit)--> TWINNED --------+   is sent
         (a lease, a lie, a death: charged only when the producer was at it;
          after ring.max_item_attempts charged ones, a skip)

A remote READY held for an audit waits TWINNED until a local producer's answer (the
intake compares the two). Exactly once (docs/design.md#contract-3): each position
finishes once and leaves in one batch, whatever answers come late: a READY is accepted
only for the place's current generation from its holder. An item never has two grants
out but for a twin, so a bad item costs one attempt per run.

Batch slots (shared/memory/batch_ring.py draws their states). A plan batch starts in a
FREE slot; its positions are granted in plan order, retries first; when every one has
finished, :meth:`Ledger.next_batch` hands it to the assembly, which checks its rows and
either announces it (:meth:`Ledger.sent`) or hands failing positions back
(:meth:`Ledger.returned`). Batches are handed on in plan order (stager.deterministic;
else any finished one first). A row taken back from a producer that may still write it
is FENCED, and so is its batch slot once the batch moves out: next_batch moves the
batch into another slot first (the assembly copies every row), so no row is delivered
that a producer the stager gave up on could still write. A row's fence lifts only when
its producer is known to write no more (it answered, said HELLO again, or its process,
seen by the kernel's pid, died); a spare's also after FENCE_LEASES leases, since a spare
is copied and checked after the copy (seqlock and checksum, docs/design.md#contract-7).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.ledger.face import (
    AGAIN,
    NO_ROWS,
    SAMPLE,
    SKIPPED,
    TORN,
    Accepted,
    Answer,
    AuditCase,
    BatchOut,
    Expired,
    Grantee,
    Progress,
    Run,
    Shape,
    Skip,
    TakenBack,
)
from ringfeed.consumer.stager.ledger.twins import (
    AUDIT,
    BACKUP,
    BACKUP_MIN_S,
    Beaten,
    BeatenGrants,
    ServiceTimes,
    Twin,
)
from ringfeed.consumer.stager.ledger.window import PlanBatches
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.shared.config import Config
from ringfeed.shared.memory.batch_ring import BatchState
from ringfeed.shared.memory.ring import SLOT_DTYPE, SlotState
from ringfeed.shared.run.stats_record import SlotStats
from ringfeed.shared.sample.schema import SPARE_SHAPE

log = logging.getLogger(__name__)

# A fenced spare is free again after this many leases whatever its producer's pid says
# (a spare is copied and checked after the copy: fencing it saves work, no more).
FENCE_LEASES = 4
# Runs remembered by generation, so a late answer is told from one never granted.
MAX_RUNS = 4096
FREE, GRANTED, READY, FENCED = (int(state) for state in SlotState if state != SlotState.WRITING)
# Batch slot states, as plain ints: an IntEnum member costs a Python call to look up.
S_FREE, S_FILLING, S_SENT, S_FENCED = (int(state) for state in BatchState)
# Reductions that stay in C (ndarray.any, .all and .sum go through numpy's Python layer).
ANY, ALL, SUM = np.logical_or.reduce, np.logical_and.reduce, np.add.reduce
OPEN = 0
COUNTERS = (
    "runs",
    "grants",
    "answered",
    "salvaged",
    "reclaimed",
    "fences_lifted",
    "torn",
    "unfinished",
    "relocated",
    "backups",
    "backups_won",
    "audits",
    "audits_passed",
    "audits_failed",
    "audits_inconclusive",
    "audits_unanswered",
    "skips_overruled",
    "skips_doubted",
    "delivered",
    "skipped",
)


@dataclass(frozen=True)
class LedgerTerms:
    """The ledger's own configuration: the batch ring's slots and rows per slot, the
    spare ring's places, batches filled ahead, rows of a batch of a plan that cuts
    none and its shape, a grant's lease, ring.max_item_attempts, sample fields, whether
    batches leave in plan order, and how many batch slots must stay out of fences."""

    n_batch_slots: int
    rows_per_slot: int
    n_spares: int
    lookahead: int
    batch_rows: int
    lease_s: float
    max_attempts: int
    n_fields: int = 2
    deterministic: bool = True
    default_shape: Shape = (0, 0, 0)
    min_usable: int = 3

    @classmethod
    def of(cls, cfg: Config) -> LedgerTerms:
        s = cfg.stager
        return cls(
            n_batch_slots=cfg.batch_ring_slots,
            rows_per_slot=cfg.max_batch_rows,
            n_spares=cfg.spare_slots,
            lookahead=cfg.lookahead_batches,
            batch_rows=s.batch_size,
            lease_s=cfg.ring.lease_s,
            max_attempts=cfg.ring.max_item_attempts,
            n_fields=len(cfg.schema.fields),
            deterministic=s.deterministic,
            default_shape=(s.batch_size, cfg.features.max_frames, cfg.text.max_text_len),
            min_usable=s.batch_slots + 2,
        )


@dataclass(frozen=True)
class PlaceRecords:
    """Where the ledger writes what the inspector reads (SLOT_DTYPE): the batch ring's
    row records, the spare ring's slot records, the batch ring's slot records. The
    stager gives the rings' own and swaps in copies before it unmaps them."""

    rows: np.ndarray
    spares: np.ndarray
    slots: np.ndarray

    @classmethod
    def private(cls, terms: LedgerTerms) -> PlaceRecords:
        n_rows = terms.n_batch_slots * terms.rows_per_slot
        return cls(
            np.zeros(n_rows, SLOT_DTYPE),
            np.zeros(terms.n_spares, SLOT_DTYPE),
            np.zeros(terms.n_batch_slots, SLOT_DTYPE),
        )

    def copy(self) -> PlaceRecords:
        return PlaceRecords(self.rows.copy(), self.spares.copy(), self.slots.copy())


@dataclass(frozen=True)
class _RunRecord:
    """A run as granted: its holder, batch slot (-1: spares) and shape, and its places
    (the ledger's numbers) sorted, with their items."""

    holder: int
    slot: int
    shape: Shape
    places: np.ndarray
    items: np.ndarray


class Ledger:
    """The slot ledger (see the module docstring); built by keyword from its terms."""

    def __init__(
        self,
        *,
        plan: Plan,
        terms: LedgerTerms,
        clock: Callable[[], float] = time.monotonic,
        records: PlaceRecords | None = None,
    ) -> None:
        t = self.terms = terms
        self.plan, self.clock = plan, clock
        R = self.R = t.rows_per_slot
        self.n_rows = t.n_batch_slots * R
        n_places = self.n_rows + t.n_spares
        self.lease_s = t.lease_s
        self.capacity = max(1, t.lookahead * t.batch_rows)
        # Places.
        self.p_state = np.zeros(n_places, np.int8)
        self.p_gen = np.zeros(n_places, np.int64)
        self.p_q = np.full(n_places, -1, np.int64)
        self.p_holder = np.full(n_places, -1, np.int64)
        self.p_t = np.zeros(n_places)
        self.p_wall = np.zeros(n_places)  # for the inspector, which has not our clock
        self.p_fenced_t = np.zeros(n_places)
        self.p_writes = np.zeros(n_places, bool)
        self.p_index = np.full(n_places, -1, np.int64)  # its holder's number in the records
        self.p_item = np.full(n_places, -1, np.int64)  # its grant's item and plan position
        self.p_pos = np.full(n_places, -1, np.int64)
        # Positions: the rows of the batch records.
        n_q = t.n_batch_slots * R
        self.q_pos = np.full(n_q, -1, np.int64)
        self.q_item = np.full(n_q, -1, np.int64)
        self.q_done = np.zeros(n_q, np.int8)
        self.q_place = np.full(n_q, -1, np.int64)
        # The row of its batch slot a grant of it writes in place: its index among the
        # batch's positions not known bad at its start, so a known skip moves no row.
        self.q_row = np.zeros(n_q, np.int64)
        self.q_grant = np.full(n_q, -1, np.int64)  # its (first) grant's place while out
        self.q_ngrants = np.zeros(n_q, np.int8)
        self.q_attempts = np.zeros(n_q, np.int16)
        self.q_avoid = np.full(n_q, -1, np.int64)  # the account its last grant came from
        self.q_retry = np.zeros(n_q, bool)
        self.q_by = np.full(n_q, -1, np.int64)
        self.q_gen = np.zeros(n_q, np.int64)
        self.q_len = np.zeros((n_q, t.n_fields), np.int32)
        self.q_sum = np.zeros(n_q, np.int64)
        self.q_marks = np.zeros(n_q, np.int64)
        self.skips: dict[int, Skip] = {}
        self.twins: dict[int, Twin] = {}
        # Batch records and batch slots.
        n_b = t.n_batch_slots
        self.b_slot = np.full(n_b, -1, np.int64)
        self.b_first = np.zeros(n_b, np.int64)
        self.b_end = np.zeros(n_b, np.int64)
        self.b_n = np.zeros(n_b, np.int64)
        self.b_unfinished = np.zeros(n_b, np.int64)
        self.b_compacted = np.zeros(n_b, bool)
        self.b_twins = np.zeros(n_b, np.int64)
        self.b_shape: list[Shape] = [t.default_shape] * n_b
        self.s_state = np.zeros(n_b, np.int8)
        self.s_gen = np.zeros(n_b, np.int64)
        # Batch-slot generations come from one counter, not one per slot: a BATCH_FREE
        # that names another slot (a consumer's off-by-one) never matches a batch there.
        self.last_s_gen = 0
        self.s_fences = np.zeros(n_b, np.int64)
        # Holders: everyone ever granted, by identity.
        self.hid: dict[bytes, int] = {}
        self.h_ident: list[bytes] = []
        self.h_peer: list[PeerId | None] = []
        self.h_held: list[int] = []
        self.h_fenced: list[int] = []
        self.accounts: dict[str, int] = {}
        self.free_spares: collections.deque[int] = collections.deque(range(self.n_rows, n_places))
        # Spares only a position of the oldest batch may take (see _spares_for).
        self.spare_reserve = min(t.n_spares // 2, R)
        self.runs: dict[int, _RunRecord] = {}
        self.generation = 0  # the last run's
        self.known_bad: dict[int, tuple[str, str]] = {}  # item -> (reason, stage)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.service = ServiceTimes()
        self.beaten = BeatenGrants()
        self.records = records or PlaceRecords.private(t)
        self._all_records()
        self.restart(0)

    # ------------------------------------------------------------ records
    def attach(self, records: PlaceRecords) -> None:
        """Write the records into `records` from now on (the stager swaps in copies
        before it unmaps the rings)."""
        self.records = records
        self._all_records()

    def _all_records(self) -> None:
        self._record(np.arange(len(self.p_state)))
        self.records.slots["state"] = self.s_state
        self.records.slots["generation"] = self.s_gen

    def _record(self, ks: np.ndarray) -> None:
        """Write places ks's records as the ledger sees them (one write per field)."""
        if not len(ks) or np.maximum.reduce(ks) < self.n_rows:
            rows, spares = ks, NO_ROWS
        else:
            rows, spares = ks[ks < self.n_rows], ks[ks >= self.n_rows]
        for table, at, base in (
            (self.records.rows, rows, 0),
            (self.records.spares, spares, self.n_rows),
        ):
            if not len(at):
                continue
            i = at - base
            positions = self.p_pos[at]
            table["state"][i] = self.p_state[at]
            table["generation"][i] = self.p_gen[at]
            table["item"][i] = self.p_item[at]
            table["epoch"][i] = np.where(positions >= 0, positions // self.plan.n_items, 0)
            table["producer"][i] = self.p_index[at]
            table["t_granted"][i] = self.p_wall[at]

    def _record_state(self, ks: np.ndarray) -> None:
        """Only the state of places ks changed (a READY)."""
        if not len(ks):
            return
        if np.maximum.reduce(ks) < self.n_rows:
            self.records.rows["state"][ks] = self.p_state[ks]
            return
        self._record(ks)

    def _set_slot(self, slot: int, state: int) -> None:
        self.s_state[slot] = state
        self.records.slots["state"][slot] = state

    def _field(self, k: int, name: str) -> int:
        """A field of place k's record in shared memory (a producer's progress fields)."""
        if k < self.n_rows:
            return int(self.records.rows[name][k])
        return int(self.records.spares[name][k - self.n_rows])

    # ------------------------------------------------------------ holders
    def _holder(self, who: Grantee) -> int:
        h = self.hid.get(who.ident)
        if h is None:
            h = self.hid[who.ident] = len(self.h_ident)
            self.h_ident.append(who.ident)
            self.h_peer.append(who.peer)
            self.h_held.append(0)
            self.h_fenced.append(0)
        else:
            self.h_peer[h] = who.peer
        return h

    def _account(self, peer: PeerId | None) -> int:
        if peer is None:
            return -1
        return self.accounts.setdefault(peer.account, len(self.accounts))

    def holding(self, ident: bytes) -> tuple[int, int]:
        h = self.hid.get(ident)
        return (0, 0) if h is None else (self.h_held[h], self.h_fenced[h])

    # ------------------------------------------------------------ the plan's batches
    def restart(self, position: int) -> set[bytes]:
        """Deliver from plan `position` (a consumer's cursor) on: every batch being filled
        is dropped, its granted places taken back (fenced where their holder maps the
        rings) and the rest freed; every batch slot is free but those fenced. Returns
        the producers that held grants: their queued grants are void."""
        granted = (self.p_state == GRANTED).nonzero()[0]
        holders = {self.h_ident[h] for h in set(self.p_holder[granted].tolist())}
        for k in granted.tolist():
            self._take(k, fence=bool(self.p_writes[k]))
        self._free((self.p_state == READY).nonzero()[0])
        self.twins.clear()
        self.beaten.clear()
        self.skips.clear()
        for slot in range(self.terms.n_batch_slots):
            if self.s_state[slot] != S_FENCED:
                self.s_gen[slot] = self._next_s_gen()
                self.records.slots["generation"][slot] = self.s_gen[slot]
                state = S_FENCED if self.s_fences[slot] else S_FREE
                self._set_slot(slot, state)
        self.q_done[:], self.q_ngrants[:], self.q_retry[:], self.q_grant[:] = OPEN, 0, False, -1
        self.b_slot[:], self.b_twins[:] = -1, 0
        self.free_b = list(range(self.terms.n_batch_slots - 1, -1, -1))
        self.window: list[int] = []
        self.window_items: dict[int, int] = {}  # item -> its positions in the window
        self.repeated: set[int] = set()  # items at more than one position of the window
        self.busy: collections.Counter[int] = collections.Counter()  # ... with grants out
        t = self.terms
        self.cuts = PlanBatches(self.plan, position, t.batch_rows, t.default_shape)
        self.retries: list[tuple[int, int]] = []  # (position, q) to grant again, in order
        # The next position never granted: row at_i of batch record at_b (-1: before the
        # window's first batch).
        self.at_b, self.at_i = -1, 0
        self._fill_window()
        return holders

    def _fill_window(self) -> None:
        """Start plan batches in free slots, up to the look-ahead."""
        while len(self.window) < self.terms.lookahead and not self.cuts.ended():
            free = (self.s_state == S_FREE).nonzero()[0]
            if len(free) <= 1 and self.window:  # one slot kept for a batch that must move
                return
            if not len(free):
                return
            self._start_batch(int(free[0]))

    def _start_batch(self, slot: int) -> None:
        cut = next(self.cuts)
        b = self.free_b.pop()
        n = len(cut.positions)
        qs = slice(b * self.R, b * self.R + n)
        self.q_pos[qs] = cut.positions
        items = self.q_item[qs] = self.plan.items_at(cut.positions)
        self.q_done[qs], self.q_ngrants[qs], self.q_attempts[qs] = OPEN, 0, 0
        self.q_row[qs] = np.arange(n)  # row k for position k, unless _assign_rows packs them
        self.q_retry[qs], self.q_grant[qs], self.q_place[qs], self.q_avoid[qs] = False, -1, -1, -1
        self.b_slot[b], self.b_first[b], self.b_end[b] = slot, cut.first, cut.end
        self.b_n[b] = self.b_unfinished[b] = n
        self.b_compacted[b], self.b_twins[b], self.b_shape[b] = False, 0, cut.shape
        self.window.append(b)
        self._set_slot(slot, S_FILLING)
        listed = items.tolist()
        counts, again = self.window_items, []
        for item in listed:
            n = counts[item] = counts.get(item, 0) + 1
            if n > 1:
                again.append(item)
        if again:
            self._repeat(again)
        if self.known_bad:  # items known bad are skipped without a grant
            for q, item in zip(range(qs.start, qs.stop), listed, strict=True):
                if item in self.known_bad:
                    self._skip_known(q)
        self._assign_rows(b)

    def _assign_rows(self, b: int) -> None:
        """Batch b's positions not skipped take its slot's first rows, in plan order, where
        the assembly wants them: a known skip (an outlier, an item quarantined in an
        earlier epoch) leaves no hole for the rows after it to be copied up into. Only
        while nothing of the batch is granted or written and its slot's rows are free."""
        span = slice(b * self.R, b * self.R + int(self.b_n[b]))
        slot = int(self.b_slot[b])
        rows = slice(slot * self.R, (slot + 1) * self.R)
        if (
            self.b_compacted[b]
            or ANY(self.q_ngrants[span])
            or ANY(self.q_done[span] == SAMPLE)
            or not ALL(self.p_state[rows] == FREE)
        ):
            return
        self.q_row[span] = np.add.accumulate(self.q_done[span] != SKIPPED, dtype=np.int64) - 1

    def _repeat(self, items: list[int]) -> None:
        """Items now at more than one position of the window (an epoch's end and the next
        one's start, or a dataset smaller than the window): from now on each grant of
        them is counted, so no two are out at once; the grants out already, too."""
        for item in set(items) - self.repeated:
            self.repeated.add(item)
            out = self.q_ngrants[self.q_item == item]
            self.busy[item] = int(out.sum())

    def progress(self) -> Progress:
        cursor = int(self.b_first[self.window[0]]) if self.window else self.cuts.next_start
        exhausted = not self.window and self.cuts.ended()
        in_flight = int(SUM(self.s_state == S_SENT))
        return Progress(cursor, exhausted, in_flight)

    # ------------------------------------------------------------ grants
    def grant(self, who: Grantee, n: int) -> Run | None:
        if n <= 0:
            return None
        if who.auditor and (q := self._audit_due()) is not None:
            return self._grant_twin(who, q)
        avoid = self._account(who.peer) if who.avoid else -1
        qs: list[np.ndarray] = []
        ks: list[np.ndarray] = []
        target = self._retries(who, n, avoid, qs, ks) if self.retries else None
        taken = sum(len(q) for q in qs)
        if taken < n:
            self._firsts(who, n - taken, target, qs, ks)
        if not qs:
            q = self._backup_due(who)
            return self._grant_twin(who, q) if q is not None else None
        q_all = qs[0] if len(qs) == 1 else np.concatenate(qs)
        k_all = ks[0] if len(ks) == 1 else np.concatenate(ks)
        return self._run(who, q_all, k_all)

    def _retries(
        self, who: Grantee, n: int, avoid: int, qs: list[np.ndarray], ks: list[np.ndarray]
    ) -> int | None:
        """Retries first, lowest position first, one at a time (rare): its item has no
        grant out, and it did not come back from `avoid` (while others work); returns
        the run's target (a batch slot, -1: spares) or None if none was taken."""
        target = None
        for _, q in list(self.retries):
            if len(qs) >= n:
                break
            item = int(self.q_item[q])
            if item in self.known_bad:
                self._skip_known(q)
                continue
            if self.busy[item] or (avoid >= 0 and self.q_avoid[q] == avoid):
                continue
            k = self._place_for(q, who.in_place)
            if k is None or (target is not None and self._slot_of(k) != target):
                break
            if qs and self.b_shape[q // self.R] != self.b_shape[int(qs[0][0]) // self.R]:
                break  # a run is of one batch shape: its GRANT names it (a spare's too)
            target = self._slot_of(k)
            self._unqueue(q)
            self._reserve(q, k)
            qs.append(np.array([q]))
            ks.append(np.array([k]))
        return target

    def _firsts(
        self, who: Grantee, n: int, target: int | None, qs: list[np.ndarray], ks: list[np.ndarray]
    ) -> None:
        """Positions never granted, in plan order from the cursor, up to n: a run of rows
        of one batch (in place), or of spares across batches of one shape; stops at an
        item with a
        grant out (a dataset smaller than the grants out waits for it)."""
        while n > 0:
            b = self._cursor_batch()
            if b < 0:
                return
            base, i = b * self.R, self.at_i
            end = base + int(self.b_n[b])
            span = slice(base + i, end)
            candidate = (self.q_done[span] == OPEN) & (self.q_ngrants[span] == 0)
            candidate &= ~self.q_retry[span]
            cand = candidate.nonzero()[0] + (base + i)
            if self.known_bad and len(cand):
                bad = [it in self.known_bad for it in self.q_item[cand].tolist()]
                if any(bad):  # found bad since its batch started: skipped, no grant
                    for q in cand[bad].tolist():
                        self._skip_known(q)
                    cand = cand[~np.asarray(bad)]
            if not len(cand):
                self.at_i = int(self.b_n[b])
                continue
            take, stop = cand[:n], False
            if self.repeated:  # an item with a grant out stops the run (and grants) there
                ahead = self._not_busy(self.q_item[take].tolist())
                if ahead < len(take):
                    take, stop = take[:ahead], True
                    if not len(take):
                        return
            slot = int(self.b_slot[b])
            if who.in_place and not self.b_compacted[b]:
                if target is not None and target != slot:
                    return
                places = slot * self.R + self.q_row[take]
                free = self.p_state[places] == FREE
                if not ALL(free):  # a row still held (never, but for a fence): stop there
                    cut = int(free.argmin())
                    take, places, stop = take[:cut], places[:cut], True
                target = slot
            else:
                if target is not None and target != -1:
                    return
                if qs and self.b_shape[b] != self.b_shape[int(qs[0][0]) // self.R]:
                    return  # a run is of one batch shape: its GRANT names it
                reserve = 0 if self.window and b == self.window[0] else self.spare_reserve
                room = len(self.free_spares) - reserve
                if room < len(take):
                    take, stop = take[: max(room, 0)], True
                spares = [self.free_spares.popleft() for _ in range(len(take))]
                places = np.array(spares, np.int64)
                target = -1
            if not len(take):
                return
            self.at_i = int(take[-1] - base) + 1
            self._reserve_many(take, places)
            qs.append(take)
            ks.append(places)
            n -= len(take)
            if stop or target >= 0:  # a run names rows of one batch slot
                return

    def _not_busy(self, items: list[int]) -> int:
        """How many of these items, in order, may be granted together: up to the first
        one with a grant out, or twice among them."""
        seen: set[int] = set()
        for i, item in enumerate(items):
            if item in self.repeated and (self.busy[item] > 0 or item in seen):
                return i
            seen.add(item)
        return len(items)

    def _cursor_batch(self) -> int:
        """The batch record of the next position never granted (moving on to the next
        batch, starting one if the look-ahead allows), or -1 at the window's end."""
        while True:
            b = self.at_b
            if b >= 0 and self.at_i < self.b_n[b]:
                return b
            following = self._after(b)
            if following < 0:
                return -1
            self.at_b, self.at_i = following, 0

    def _after(self, b: int) -> int:
        index = 0 if b < 0 else self.window.index(b) + 1
        if index >= len(self.window):
            self._fill_window()
        return self.window[index] if index < len(self.window) else -1

    def _skip_known(self, q: int) -> None:
        reason, stage = self.known_bad[int(self.q_item[q])]
        self._finish_skip(q, Skip(reason, stage))

    def _place_for(self, q: int, rows: bool) -> int | None:
        """Its row when the grant may name rows and the row is free (its batch never moved
        its rows), else a free spare place; None when none is free, or only the reserve
        and q is not of the oldest batch: the oldest batch's retries and backups always
        find one, or samples of later batches could hold every spare while it waits."""
        b = q // self.R
        if rows and not self.b_compacted[b]:
            k = int(self.b_slot[b]) * self.R + int(self.q_row[q])
            if self.p_state[k] == FREE:
                return k
        reserve = 0 if self.window and b == self.window[0] else self.spare_reserve
        return self.free_spares[0] if len(self.free_spares) > reserve else None

    def _slot_of(self, k: int) -> int:
        return k // self.R if k < self.n_rows else -1

    def _reserve(self, q: int, k: int) -> None:
        """Reserve place k for position q while a run is put together (granted by _run)."""
        if k >= self.n_rows:
            self.free_spares.remove(k)  # the head: O(1)
        self._reserve_many(np.array([q]), np.array([k]))

    def _reserve_many(self, qs: np.ndarray, ks: np.ndarray) -> None:
        self.p_state[ks] = GRANTED
        first = self.q_ngrants[qs] == 0
        self.q_grant[qs[first]] = ks[first]
        self.q_ngrants[qs] += 1
        if self.repeated:
            for item in self.q_item[qs].tolist():
                if item in self.repeated:
                    self.busy[item] += 1

    def _run(self, who: Grantee, qs: np.ndarray, ks: np.ndarray) -> Run:
        """Grant the reserved places as one run under a new generation."""
        self.generation += 1
        g, now, wall = self.generation, self.clock(), time.time()
        h = self._holder(who)
        slot = self._slot_of(int(ks[0]))
        # Its batch's shape, a spare run's too (of one batch shape: _retries, _firsts):
        # a producer checks its sample fits the batch it is delivered in.
        shape = self.b_shape[int(qs[0]) // self.R]
        self.p_gen[ks], self.p_q[ks], self.p_holder[ks] = g, qs, h
        self.p_t[ks], self.p_wall[ks], self.p_writes[ks] = now, wall, who.local
        self.p_index[ks], self.p_item[ks], self.p_pos[ks] = (
            who.index,
            self.q_item[qs],
            self.q_pos[qs],
        )
        self.h_held[h] += len(ks)
        items = self.q_item[qs]
        order = ks.argsort()
        self._remember(g, _RunRecord(h, slot, shape, ks[order], items[order]))
        self._record(ks)
        self.counters["runs"] += 1
        self.counters["grants"] += len(ks)
        base = slot * self.R if slot >= 0 else self.n_rows
        return Run(g, slot, shape, ks - base, items, self.q_pos[qs], ks)

    def _remember(self, g: int, run: _RunRecord) -> None:
        self.runs[g] = run
        while len(self.runs) > MAX_RUNS:
            del self.runs[next(iter(self.runs))]

    def mark_bad(self, bad: Mapping[int, tuple[str, str]]) -> None:
        """Items known bad before their first grant (item -> (reason, stage): quarantined
        earlier in this run for a cause that still holds, or outside their speaking-rate
        band under data.outliers: skip): skipped without a grant."""
        self.known_bad.update(bad)
        for b in list(self.window):
            span = slice(b * self.R, b * self.R + int(self.b_n[b]))
            candidate = (self.q_done[span] == OPEN) & (self.q_ngrants[span] == 0)
            for q in (candidate.nonzero()[0] + span.start).tolist():
                if int(self.q_item[q]) in bad:
                    self._skip_known(q)
            self._assign_rows(b)

    # ------------------------------------------------------------ answers
    def check(self, ident: bytes, generation: int, places: list[int], items: list[int]) -> Answer:
        run = self.runs.get(generation)
        if run is None:
            if not 0 < generation <= self.generation:
                why = f"generation {generation} was never granted"
                return Answer(why, "not-granted", ident, generation)
            return Answer(ident=ident, generation=generation, late=True)
        h = self.hid.get(ident, -2)
        if run.holder != h:
            why = f"generation {generation} was granted to another producer"
            return Answer(why, "not-granted", ident, generation)
        index = np.asarray(places, np.int64)
        base = run.slot * self.R if run.slot >= 0 else self.n_rows
        named = index + base
        if len(named) > 1:
            ordered = named.copy()
            ordered.sort()
            if ANY(ordered[1:] == ordered[:-1]):
                why = f"a place named twice in the answer of generation {generation}"
                return Answer(why, "repeated", ident, generation)
        at = np.minimum(run.places.searchsorted(named), len(run.places) - 1)
        inside = run.places[at] == named
        if not ALL(inside):
            w = int(index[inside.argmin()])
            why = f"place {w} is not in the run of generation {generation}"
            return Answer(why, "not-granted", ident, generation)
        said = np.asarray(items, np.int64)
        right = run.items[at] == said
        if not ALL(right):
            j = int(right.argmin())
            why = f"place {int(index[j])}: item {int(said[j])}, not the item granted "
            why += f"({int(run.items[at[j]])})"
            return Answer(why, "wrong-item", ident, generation)
        owned = (self.p_state[named] == GRANTED) & (self.p_gen[named] == generation)
        owned &= self.p_holder[named] == h
        # The position it was granted for is still the one at its q. A grant that outlived
        # its position's batch (a backup that twinned with a grant already gone, before
        # _split kept q_grant right: test_twins) answered into the position that batch
        # record held next, one item's row under another's id; any such grant is stale.
        owned &= self.q_pos[self.p_q[named]] == self.p_pos[named]
        audits = self._audits_answered(named, owned) if self.twins else {}
        seals = self.records.rows if run.slot >= 0 else self.records.spares
        at_seal = named if run.slot >= 0 else index
        sealed = seals["sealed_generation"][at_seal] == generation % (1 << 32)
        return Answer(
            "",
            "",
            ident,
            generation,
            run.slot,
            run.shape,
            index,
            named,
            owned,
            not ANY(owned),
            audits,
            sealed,
        )

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
        h, g = self.hid[answer.ident], answer.generation
        ks = answer.keys
        stale = (~answer.owned).nonzero()[0]
        beaten = self._stale(answer.ident, ks[stale], g) if len(stale) else 0
        take = answer.owned & keep
        if answer.audits:
            for row in answer.audits:
                take[row] = False
        rows = take.nonzero()[0]
        beaten_holders: list[tuple[bytes, PeerId | None]] = []
        n = len(rows)
        if n:
            kr, qs = ks[rows], self.p_q[ks[rows]]
            self._answered(h, kr, qs)
            held = hold[rows] if hold is not None else None
            if held is not None and ANY(held):
                for r in rows[held].tolist():
                    k = int(ks[r])
                    kept = Twin(AUDIT, k, generation=g, lengths=lengths[r].copy())
                    kept.checksum, kept.marks = int(checksums[r]), int(marks[r])
                    beaten_holders += self._hold(int(self.p_q[k]), k, h, kept)
                rows, kr, qs = rows[~held], kr[~held], qs[~held]
            if len(rows):
                self._finish_samples(qs, kr, g, lengths[rows], checksums[rows], marks[rows], h)
                if self.twins:
                    for q, k in zip(qs.tolist(), kr.tolist(), strict=True):
                        beaten_holders += self._end_twin(q, k)
        if answer.audits:
            for row, case in answer.audits.items():
                if answer.owned[row] and keep[row]:
                    verdict = (verdicts or {}).get(row, "agree")
                    k = int(ks[row])
                    self._answered(h, np.array([k]), np.array([case.key]))
                    sample = (k, g, lengths[row], int(checksums[row]), int(marks[row]), h)
                    self._settle_audit(case.key, verdict, sample)
                    n += 1
        if answer.lengths is not None:  # a dead producer's rows (take_back's written)
            self.counters["salvaged"] += n
        return Accepted(n, len(stale), beaten, tuple(beaten_holders))

    def _answered(self, h: int, ks: np.ndarray, qs: np.ndarray) -> None:
        """The holder of places ks answered them: READY (a SKIP frees them next)."""
        self.p_state[ks] = READY
        self._record_state(ks)
        self.h_held[h] -= len(ks)
        self._ungrant(qs)
        now = self.clock()
        granted = self.p_t[ks]
        self.service.add(now - granted)
        ident = self.h_ident[h]
        if ident in self.beaten.of:
            self._passed(ident, float(np.maximum.reduce(granted)))
        self.counters["answered"] += len(ks)

    def _ungrant(self, qs: np.ndarray) -> None:
        """One grant of each of qs ended (answered or taken back)."""
        self.q_ngrants[qs] -= 1
        self.q_grant[qs[self.q_ngrants[qs] == 0]] = -1
        if self.repeated:
            for item in self.q_item[qs].tolist():
                if self.busy[item] > 0:
                    self.busy[item] -= 1

    def _finish_samples(
        self,
        qs: np.ndarray,
        ks: np.ndarray,
        g: int,
        lengths: np.ndarray,
        checksums: np.ndarray,
        marks: np.ndarray,
        h: int,
    ) -> None:
        """Positions qs finished: samples at places ks, as their READY said."""
        self._unqueue_many(qs)
        batches = (qs // self.R)[self.q_done[qs] == OPEN]  # a finished one stays counted
        self.q_done[qs], self.q_place[qs], self.q_gen[qs], self.q_by[qs] = SAMPLE, ks, g, h
        self.q_len[qs] = lengths
        self.q_sum[qs], self.q_marks[qs] = checksums, marks
        if len(batches) and ALL(batches == batches[0]):
            self.b_unfinished[batches[0]] -= len(batches)
        elif len(batches):
            np.subtract.at(self.b_unfinished, batches, 1)

    def _finish_skip(self, q: int, why: Skip) -> None:
        self._unqueue(q)
        if self.q_done[q] == OPEN:
            self.b_unfinished[q // self.R] -= 1
        self.q_done[q], self.q_place[q] = SKIPPED, -1
        self.skips[q] = why

    def _unqueue(self, q: int) -> None:
        if self.q_retry[q]:
            self.q_retry[q] = False
            self.retries.remove((int(self.q_pos[q]), q))

    def _unqueue_many(self, qs: np.ndarray) -> None:
        if self.retries and ANY(self.q_retry[qs]):
            for q in qs[self.q_retry[qs]].tolist():
                self._unqueue(q)

    def _stale(self, ident: bytes, ks: np.ndarray, g: int) -> int:
        """Places of an answer taken back from its producer since: its producer is done
        with them (free, if still fenced for it or granted for a position since gone); how
        many a backup had beaten."""
        beaten = 0
        h = self.hid[ident]
        for k in ks.tolist():
            beaten += self.beaten.answered(ident, k, g)
            if self.p_gen[k] != g or self.p_holder[k] != h:
                continue
            if self.p_state[k] == FENCED:
                self._unfence(k)
            elif self.p_state[k] == GRANTED:  # outlived its position (check): answered
                self._take(k, fence=False)
        return beaten

    def skip(self, answer: Answer, why: Skip, how: str) -> None:
        h = self.hid[answer.ident]
        k = int(answer.keys[0])
        case = answer.audits.get(0)
        q = case.key if case is not None else int(self.p_q[k])
        self._answered(h, np.array([k]), np.array([q]))
        if case is not None:
            if how == "confirm":
                self._settle(q, why=why, place=k)
            else:  # the held remote sample goes: this host may lack what the other has
                self.counters["audits_inconclusive"] += 1
                self._settle(q, place=k, held=True)
            return
        if how == "hold":
            self._free(np.array([k]))
            self._hold(q, k, h, Twin(AUDIT, -1, skipped=why))
        elif how == "retry":
            self._free(np.array([k]))
            self.counters["skips_doubted"] += 1
            self._again(q, False, self.h_peer[h])
        else:
            self._free(np.array([k]))
            self._end_twin(q, k)
            self.known_bad[int(self.q_item[q])] = (why.reason, why.stage)
            self._finish_skip(q, why)

    # ------------------------------------------------------------ second grants
    def _oldest_open(self) -> int:
        """The first unfinished position row of the oldest batch being filled, or -1."""
        if not self.window:
            return -1
        b = self.window[0]
        span = self.q_done[b * self.R : b * self.R + int(self.b_n[b])]
        open_ = (span == OPEN).nonzero()[0]
        return int(open_[0]) + b * self.R if len(open_) else -1

    def _backup_due(self, who: Grantee) -> int | None:
        """The oldest open position, if its one grant has been out long enough to be
        backed up, and at another account than who's; it becomes a twin."""
        q = self._oldest_open()
        if q < 0 or q in self.twins or self.q_ngrants[q] != 1:
            return None
        k = int(self.q_grant[q])
        holder_peer = self.h_peer[int(self.p_holder[k])]
        if who.peer is None or holder_peer is None or holder_peer.account == who.peer.account:
            return None
        wait_s = (
            BACKUP_MIN_S
            if holder_peer.account in who.slowed
            else self.service.backup_after(self.lease_s)
        )
        if self.clock() - self.p_t[k] < wait_s:
            return None
        self._twin(q, Twin(BACKUP, k))
        self.counters["backups"] += 1
        return q

    def _audit_due(self) -> int | None:
        """A position whose audit waits for a local producer, or None."""
        for q, twin in self.twins.items():
            if twin.kind == AUDIT and twin.second < 0:
                return q
        return None

    def _grant_twin(self, who: Grantee, q: int) -> Run | None:
        """A second grant of position q (a backup or an audit), into a spare place."""
        k = self._place_for(q, False)
        twin = self.twins[q]
        if k is None:  # a backup is called off (due again later); an audit waits on
            if twin.kind == BACKUP:
                self._untwin(q)
            return None
        self._reserve(q, k)
        twin.second = k
        spare = dataclasses.replace(who, in_place=False)
        return self._run(spare, np.array([q]), np.array([k]))

    def _twin(self, q: int, twin: Twin) -> None:
        self.twins[q] = twin
        self.b_twins[q // self.R] += 1

    def _untwin(self, q: int) -> Twin | None:
        twin = self.twins.pop(q, None)
        if twin is not None:
            self.b_twins[q // self.R] -= 1
        return twin

    def _end_twin(self, q: int, winner: int) -> list[tuple[bytes, PeerId | None]]:
        """`winner` answered position q first: a backup's other grant is beaten."""
        twin = self.twins.get(q)
        if twin is None or twin.kind != BACKUP:
            return []
        self._untwin(q)
        if winner == twin.second:
            self.counters["backups_won"] += 1
        other = twin.other(winner)
        if other >= 0 and self.p_state[other] == GRANTED:
            return [self._beat(other)]
        return []

    def _beat(self, k: int) -> tuple[bytes, PeerId | None]:
        """Take back grant k, which a backup beat, and every other grant of its producer
        out as long as a backup waits (they would hold the plan back in turn), those
        uncharged and granted again elsewhere: fenced against a local producer until it
        answers late or dies; its late answers are stale. Returns (its producer, peer)."""
        h = int(self.p_holder[k])
        ident, peer = self.h_ident[h], self.h_peer[h]
        self.beaten.add(ident, k, int(self.p_gen[k]), Beaten(float(self.p_t[k]), peer))
        self._take_back_one(k, fence=bool(self.p_writes[k]), charged=False)
        due = self.clock() - self.service.backup_after(self.lease_s)
        mine = ((self.p_holder == h) & (self.p_state == GRANTED)).nonzero()[0]
        for j in mine.tolist():
            if self.p_t[j] <= due and int(self.p_q[j]) not in self.twins:
                self.beaten.add(ident, j, int(self.p_gen[j]), Beaten(float(self.p_t[j]), peer))
                self._take_back_one(j, fence=bool(self.p_writes[j]), charged=False)
        return ident, peer

    def _passed(self, ident: bytes, t_granted: float) -> None:
        """A local producer answered its grant made at t_granted. It works its grants in
        the order they came and drops a grant taken back without a word
        (producer/process/slot_writer.py): so it is done with each beaten grant made
        before this one, unfenced and never charged as held."""
        h = self.hid[ident]
        for k, g in self.beaten.passed(ident, t_granted):
            if self.p_state[k] == FENCED and self.p_gen[k] == g and self.p_holder[k] == h:
                if self.p_writes[k]:
                    self._unfence(k)

    def _hold(self, q: int, k: int, h: int, twin: Twin) -> list[tuple[bytes, PeerId | None]]:
        """A remote producer's answer to position q at place k, held for an audit: its
        READY (twin.first k: the rows wait there, answered already) or SKIP (twin.first
        -1, twin.skipped): q is unfinished until a local producer answers. A backup it
        beat is taken back (returned: whose)."""
        backup = self.twins.get(q)
        if backup is not None:  # the audit takes the backup's place; its other grant is beaten
            self._untwin(q)
        twin.since, twin.holder, twin.peer = self.clock(), h, self.h_peer[h]
        twin.name = self.h_ident[h].decode(errors="replace")
        self._twin(q, twin)
        self.counters["audits"] += 1
        if backup is None or backup.kind != BACKUP:
            return []
        self.counters["backups_won"] += k == backup.second
        other = backup.other(k)
        return [self._beat(other)] if other >= 0 and self.p_state[other] == GRANTED else []

    def _audits_answered(self, ks: np.ndarray, owned: np.ndarray) -> dict[int, AuditCase]:
        """Rows of an answer that answer an audit's second grant."""
        out = {}
        for row, k in enumerate(ks.tolist()):
            q = int(self.p_q[k])
            twin = self.twins.get(q)
            if twin is not None and twin.kind == AUDIT and twin.second == k and owned[row]:
                out[row] = self._case(q, twin, k)
        return out

    def _case(self, q: int, twin: Twin, answered_at: int = -1) -> AuditCase:
        held = self._where(twin.first) if twin.first >= 0 else None
        audit = self._where(answered_at) if answered_at >= 0 else None
        ident = self.h_ident[twin.holder]
        item = int(self.q_item[q])
        return AuditCase(
            q, item, held, twin.lengths, twin.skipped, ident, twin.peer, twin.name, audit
        )

    def _where(self, k: int) -> tuple[int, Shape, int]:
        """(batch slot or -1, its batch's shape, row or spare slot) of place k."""
        if k >= self.n_rows:
            return -1, SPARE_SHAPE, k - self.n_rows
        slot, row = divmod(k, self.R)
        q = int(self.p_q[k])
        shape = self.b_shape[q // self.R] if q >= 0 else self.terms.default_shape
        return slot, shape, row

    def _settle_audit(self, q: int, verdict: str, sample: tuple) -> None:
        """A local producer's READY (sample: its place, generation, lengths, checksum,
        marks, holder) for an audit of position q: the held remote sample goes if the two
        agree; else this one, and the remote peer's samples not yet sent are granted
        again; a remote SKIP it overrules, this one."""
        twin = self.twins[q]
        if twin.skipped is not None:
            self.counters["skips_overruled"] += 1
        else:
            self.counters["audits_failed" if verdict == "differ" else "audits_passed"] += 1
        if verdict == "agree" and twin.skipped is None:
            self._settle(q, place=sample[0], held=True)
            return
        self._settle(q, place=sample[0], sample=sample)
        if verdict == "differ" and twin.peer is not None:
            self._unfinish(twin.peer.ban)

    def _settle(
        self,
        q: int,
        place: int = -1,
        held: bool = False,
        sample: tuple | None = None,
        why: Skip | None = None,
    ) -> None:
        """An audit of position q ends: with the held remote sample (held), the local one
        (sample: its place, generation, lengths, checksum, marks, holder), or a skip
        (why); the twin's other place is freed."""
        twin = self._untwin(q)
        assert twin is not None
        keep = twin.first if held else (sample[0] if sample is not None else -1)
        others = [x for x in (twin.first, twin.second, place) if x >= 0 and x != keep]
        free = [x for x in set(others) if self.p_state[x] != FREE]
        if free:
            self._free(np.array(free, np.int64))
        if held:
            assert twin.lengths is not None
            sample = (
                twin.first,
                twin.generation,
                twin.lengths,
                twin.checksum,
                twin.marks,
                twin.holder,
            )
        if sample is not None:
            k, g, lengths, checksum, marks, h = sample
            self._finish_samples(
                np.array([q]),
                np.array([k]),
                g,
                lengths[None],
                np.array([checksum]),
                np.array([marks]),
                h,
            )
        else:
            assert why is not None
            self.known_bad[int(self.q_item[q])] = (why.reason, why.stage)
            self._finish_skip(q, why)

    def settle(self, case: AuditCase, how: str, why: Skip | None = None) -> None:
        q = case.key
        if q not in self.twins:
            return
        if how == "deliver":
            self._settle(q, held=True)
        elif how == "skip":
            self._settle(q, why=why)
        else:  # a held SKIP nobody checked: granted again, uncharged, elsewhere
            twin = self._untwin(q)
            self.counters["skips_doubted"] += 1
            self._again(q, False, twin.peer if twin is not None else None)

    def _unfinish(self, ban: str) -> None:
        """A peer was caught lying: its samples still waiting to leave are granted
        again, uncharged."""
        for b in self.window:
            span = np.arange(b * self.R, b * self.R + int(self.b_n[b]))
            done = span[self.q_done[span] == SAMPLE]
            for q in done.tolist():
                peer = self.h_peer[int(self.q_by[q])]
                if q not in self.twins and peer is not None and peer.ban == ban:
                    self._retry(q, "")
                    self.counters["unfinished"] += 1

    # ------------------------------------------------------------ taking grants back
    def take_back(
        self,
        ident: bytes,
        places: tuple[int, ...] | None = None,
        fence: bool = False,
        charge: bool = False,
        done: bool = False,
        salvage: bool = False,
    ) -> TakenBack:
        h = self.hid.get(ident)
        if h is None:
            return TakenBack()
        mine = ((self.p_holder == h) & (self.p_state == GRANTED)).nonzero()[0]
        if places is not None:
            mine = mine[np.isin(mine, np.asarray(places, np.int64))]
        written: tuple[Answer, ...] = ()
        if salvage:
            whole = np.array([self._started(k, sealed=True) for k in mine.tolist()], bool)
            written = self._written(h, mine[whole]) if ANY(whole) else ()
            mine = mine[~whole] if ANY(whole) else mine
        charged = self._charged(mine) if charge and len(mine) else -1
        items, skipped = [], []
        for k in mine.tolist():
            q = int(self.p_q[k])
            if self._take_back_one(k, fence, charged=k == charged) and k == charged:
                items.append(int(self.q_item[q]))
                if self.q_done[q] == SKIPPED:
                    skipped.append(int(self.q_item[q]))
        if done:
            self._done_with(h)
        return TakenBack(len(mine), tuple(items), tuple(skipped), written)

    def _charged(self, mine: np.ndarray) -> int:
        """Which of a producer's places taken back counts as an attempt of its item: only
        the sample it was working on (a producer killed with 16 grants queued did not fail
        on 16 inputs). A local one's record says (begun, not sealed; at most one: a liar
        that marks every place it holds begun charges no more than one item); a remote
        one answers each sample as it is written, so its oldest grant, the first of its
        run in plan order. -1: none."""
        if ANY(self.p_writes[mine]):
            begun = [k for k in mine.tolist() if self._started(k)]
            return min(begun, key=lambda k: self.p_t[k]) if begun else -1
        oldest = np.lexsort((self.q_pos[self.p_q[mine]], self.p_t[mine]))[0]
        return int(mine[oldest])

    def _written(self, h: int, whole: np.ndarray) -> tuple[Answer, ...]:
        """The places a dead local producer wrote whole (both progress fields of the
        record at the grant's generation: the seal is the last thing it writes), as the
        Answers its READYs would have been (one per run), their lengths from the records."""
        out = []
        gens = self.p_gen[whole]
        for g in sorted(set(gens.tolist())):
            ks = whole[gens == g]
            slot = self._slot_of(int(ks[0]))
            base = slot * self.R if slot >= 0 else self.n_rows
            table = self.records.rows if slot >= 0 else self.records.spares
            lengths = table["lengths"][ks - (0 if slot >= 0 else self.n_rows)]
            run = self.runs.get(g)
            shape = run.shape if run is not None else SPARE_SHAPE
            owned = np.ones(len(ks), bool)
            fields = lengths[:, : self.terms.n_fields].astype(np.int32)
            out.append(
                Answer(
                    "", "", self.h_ident[h], g, slot, shape, ks - base, ks, owned, lengths=fields
                )
            )
        return tuple(out)

    def _started(self, k: int, sealed: bool = False) -> bool:
        """Was the local producer holding place k in the middle of its grant: begun, not
        sealed (a sealed one whose READY had not left yet did not fail)? sealed: was it
        written whole?"""
        g = int(self.p_gen[k]) % (1 << 32)
        writing = self._field(k, "writing_generation") == g
        is_sealed = self._field(k, "sealed_generation") == g
        return writing and (is_sealed if sealed else not is_sealed)

    def _take_back_one(self, k: int, fence: bool, charged: bool) -> bool:
        """Take back the grant of place k: fenced against its holder (it may still write)
        or free; its position is granted again (to another account, if one works), or
        skipped once ring.max_item_attempts charged grants failed. True if its position
        went back to the plan. A grant that outlived its position (a spare's, whose
        batch left: check) only frees its place; the position now at its q is not its."""
        q, h = int(self.p_q[k]), int(self.p_holder[k])
        granted = self.p_state[k] == GRANTED
        current = q >= 0 and self.q_pos[q] == self.p_pos[k]
        self._take(k, fence)
        self.counters["reclaimed"] += 1
        if not (current and granted):
            return False
        self._ungrant(np.array([q]))
        if self.q_done[q] != OPEN or self._split(q, k):
            return False
        self._again(q, charged, self.h_peer[h] if h >= 0 else None)
        return True

    def _split(self, q: int, k: int) -> bool:
        """Grant k of position q came back unfinished: if it was one of a twin, the
        position goes on with the other grant (a backup), or its audit waits for a local
        producer again; True then (nothing goes back to the plan)."""
        twin = self.twins.get(q)
        if twin is None:
            return False
        if k not in (twin.first, twin.second):  # a grant its twin replaced: it carries on
            return True
        if twin.kind == AUDIT:
            twin.second, twin.since = -1, self.clock()
            return True
        self._untwin(q)
        if not self.q_ngrants[q]:
            return False
        # The other grant carries on, and is the one a later backup twins with: q_grant
        # still named k, so that backup's answer (or the other's) beat nobody.
        self.q_grant[q] = twin.other(k)
        return True

    def _again(self, q: int, charged: bool, peer: PeerId | None) -> None:
        """Position q goes back to be granted again (to another account than peer's, if
        one works), or is skipped after ring.max_item_attempts charged grants."""
        self.q_attempts[q] += charged
        if self.q_attempts[q] < self.terms.max_attempts:
            self.q_avoid[q] = self._account(peer)
            self._queue_retry(q)
            return
        reason = (
            f"lease expired {int(self.q_attempts[q])} times (ring.max_item_attempts): its "
            "producers died or stalled on this input; check it or raise ring.lease_s"
        )
        self.known_bad[int(self.q_item[q])] = (reason, "lease")
        self._finish_skip(q, Skip(reason, "lease"))

    def _queue_retry(self, q: int) -> None:
        if not self.q_retry[q]:
            self.q_retry[q] = True
            bisect.insort(self.retries, (int(self.q_pos[q]), q))

    def _take(self, k: int, fence: bool) -> None:
        """Place k leaves its holder: FENCED against it (it may still write), or free."""
        h = int(self.p_holder[k])
        if h >= 0 and self.p_state[k] == GRANTED:
            self.h_held[h] -= 1
        if fence and h >= 0 and self.p_writes[k]:
            self.p_state[k], self.p_fenced_t[k] = FENCED, self.clock()
            self._record(np.array([k]))
            self.h_fenced[h] += 1
            if k < self.n_rows:
                self.s_fences[k // self.R] += 1
        else:
            self._free(np.array([k]))

    def _done_with(self, h: int) -> None:
        """This producer cannot write any more (it died, or said HELLO with an empty
        queue): the places fenced against it are free."""
        if not self.h_fenced[h]:
            return
        fenced = ((self.p_holder == h) & (self.p_state == FENCED)).nonzero()[0]
        for k in fenced.tolist():
            self._unfence(k)

    def _unfence(self, k: int) -> None:
        h = int(self.p_holder[k])
        if h >= 0:
            self.h_fenced[h] -= 1
        self._free(np.array([k]))
        if k < self.n_rows:
            slot = k // self.R
            self.s_fences[slot] -= 1
            if self.s_state[slot] == S_FENCED and not self.s_fences[slot]:
                self._set_slot(slot, S_FREE)

    def _free(self, ks: np.ndarray) -> None:
        """Places ks are FREE (spares back on the free list)."""
        if not len(ks):
            return
        spares = ks[(ks >= self.n_rows) & (self.p_state[ks] != FREE)]
        self.p_state[ks], self.p_q[ks], self.p_holder[ks], self.p_index[ks] = FREE, -1, -1, -1
        self.p_item[ks], self.p_pos[ks] = -1, -1
        self._record(ks)
        self.free_spares.extend(spares.tolist())

    def expire(self, now: float, audit_wait_s: float, audit_since: float) -> Expired:
        self._lift_old_fences(now)
        unanswered = tuple(self.beaten.unanswered(now, self.lease_s))
        late = ((self.p_state == GRANTED) & (now - self.p_t > self.lease_s)).nonzero()[0]
        grants: dict[bytes, tuple[int, ...]] = {}
        for h in set(self.p_holder[late].tolist()):
            grants[self.h_ident[h]] = tuple(late[self.p_holder[late] == h].tolist())
        audits = tuple(
            self._case(q, twin)
            for q, twin in self.twins.items()
            if twin.kind == AUDIT
            and twin.second < 0
            and now - max(twin.since, audit_since) > audit_wait_s
        )
        self.counters["audits_unanswered"] += len(audits)
        return Expired(grants, unanswered, audits)

    def _lift_old_fences(self, now: float) -> None:
        """Free spares fenced for FENCE_LEASES leases (a spare is copied and checked after
        the copy: fencing it saves work, it guarantees nothing). A row's fence holds until
        its producer is known to write no more, for a row is delivered where it lies: its
        batch slot stays FENCED (out of use) meanwhile. Only when so many slots are fenced
        that fewer than min_usable are left, the oldest row fences past FENCE_LEASES
        leases are lifted too, and said so: the run goes on, and the stager's checks at
        assembly still catch a stale write before its batch is sent."""
        old = FENCE_LEASES * self.lease_s
        fenced = self.p_state == FENCED
        if not ANY(fenced):
            return
        stale = (fenced & (now - self.p_fenced_t > old)).nonzero()[0]
        for k in stale[stale >= self.n_rows].tolist():
            self._lift(k)
        fenced_slots = self.s_fences.nonzero()[0]
        if self.terms.n_batch_slots - len(fenced_slots) >= self.terms.min_usable:
            return
        rows = [k for k in stale[stale < self.n_rows].tolist() if self.s_fences[k // self.R]]
        if not rows:
            return
        oldest = min(rows, key=lambda k: self.p_fenced_t[k])
        slot = oldest // self.R
        log.error(
            "batch slot %d: lifting fences older than %d leases on its rows, as %d of %d "
            "batch slots are fenced by producers that neither answer nor die (stop them: "
            "their pids are in the inspector); a write they still make is caught only "
            "until its batch is sent",
            slot,
            FENCE_LEASES,
            len(fenced_slots),
            self.terms.n_batch_slots,
        )
        span = np.arange(slot * self.R, (slot + 1) * self.R)
        for k in span[self.p_state[span] == FENCED].tolist():
            self._lift(k)

    def _lift(self, k: int) -> None:
        self._unfence(k)
        self.counters["fences_lifted"] += 1

    # ------------------------------------------------------------ batches out
    def next_batch(self) -> BatchOut | None:
        self._fill_window()
        if not self.window:
            return None
        if self.terms.deterministic:
            head = self.window[0]
            b = head if self._finished(head) else -1
        else:
            b = next((x for x in self.window if self._finished(x)), -1)
        if b < 0:
            return None
        moved_from = -1
        slot = int(self.b_slot[b])
        if self.s_fences[slot]:  # a row of it may still be written: it moves first
            free = (self.s_state == S_FREE).nonzero()[0]
            if not len(free):
                return None
            moved_from, slot = slot, int(free[0])
            self._relocate(b, moved_from, slot)
        return self._out(b, moved_from)

    def _finished(self, b: int) -> bool:
        return self.b_unfinished[b] == 0 and self.b_twins[b] == 0

    def _relocate(self, b: int, old: int, new: int) -> None:
        """Batch b moves from slot `old` (FENCED until its fences lift) to `new`."""
        span = np.arange(old * self.R, (old + 1) * self.R)
        self._free(span[self.p_state[span] != FENCED])
        self._set_slot(old, S_FENCED)
        self._set_slot(new, S_FILLING)
        self.b_slot[b], self.b_compacted[b] = new, True
        self.counters["relocated"] += 1

    def _out(self, b: int, moved_from: int) -> BatchOut:
        n = int(self.b_n[b])
        qs = np.arange(b * self.R, b * self.R + n)
        places = self.q_place[qs]
        sample = self.q_done[qs] == SAMPLE
        spare = places >= self.n_rows
        src_slot, src_index = places // self.R, places % self.R
        src_index[spare] = places[spare] - self.n_rows
        src_slot[spare | ~sample], src_index[~sample] = -1, -1
        by = self.q_by[qs]
        by[~sample] = -1
        by = by.tolist()
        skips = {int(self.q_pos[q]): self.skips[q] for q in qs[~sample].tolist()}
        return BatchOut(
            b,
            int(self.b_slot[b]),
            self.b_shape[b],
            int(self.b_first[b]),
            int(self.b_end[b]),
            self.q_pos[qs],
            self.q_item[qs],
            self.q_done[qs],
            src_slot,
            src_index,
            self.q_gen[qs],
            self.q_len[qs],
            self.q_sum[qs],
            self.q_marks[qs],
            tuple([self.h_ident[h] if h >= 0 else None for h in by]),
            tuple([self.h_peer[h] if h >= 0 else None for h in by]),
            skips,
            moved_from,
        )

    def returned(self, batch: BatchOut, finals: np.ndarray, failed: Mapping[int, str]) -> None:
        b = batch.key
        qs = np.arange(b * self.R, b * self.R + int(self.b_n[b]))
        self.b_compacted[b] = True  # its rows moved, or may hold another's sample now
        finals = np.where(finals >= 0, batch.slot * self.R + finals, -1)  # places
        moved = (self.q_done[qs] == SAMPLE) & (finals >= 0) & (self.q_place[qs] != finals)
        if ANY(moved):  # the samples copied into their rows are found there from now on
            old, new = self.q_place[qs[moved]], finals[moved]
            copied = old[(old >= self.n_rows) & (self.p_state[old] == READY)]
            self._free(copied)
            self.q_place[qs[moved]] = new
            self.p_state[new] = READY
            self._record_state(new)
        for row, verdict in failed.items():
            self.counters["torn"] += verdict == TORN
            self._retry(int(qs[row]), "" if verdict in (TORN, AGAIN) else verdict)

    def _retry(self, q: int, bad: str) -> None:
        """q's sample failed the assembly's checks (a torn copy, bad rows) or its peer was
        caught lying: granted again, uncharged, to another peer if one works; or, given
        `bad` (a second peer sent bad rows for it), its item is skipped for that."""
        k = int(self.q_place[q])
        if k >= self.n_rows and self.p_state[k] == READY:
            self._free(np.array([k]))
        self.q_done[q], self.q_place[q] = OPEN, -1
        self.b_unfinished[q // self.R] += 1
        self.b_compacted[q // self.R] = True  # its row may hold another's sample now
        if bad:
            self.known_bad[int(self.q_item[q])] = (bad, "content")
            self._finish_skip(q, Skip(bad, "content"))
            return
        h = int(self.q_by[q])
        self.q_avoid[q] = self._account(self.h_peer[h] if h >= 0 else None)
        self._queue_retry(q)

    def sent(self, batch: BatchOut, n_valid: int, announced: bool = True) -> int:
        b, slot = batch.key, batch.slot
        span = np.arange(slot * self.R, (slot + 1) * self.R)
        state = self.p_state[span]
        self._free(span[(state != FREE) & (state != FENCED)])
        n = int(self.b_n[b])
        qs = np.arange(b * self.R, b * self.R + n)
        done = self.q_done[qs]
        places = self.q_place[qs]
        spares = places[(done == SAMPLE) & (places >= self.n_rows)]
        self._free(spares[self.p_state[spares] == READY])
        n_samples = int(SUM(done == SAMPLE))
        self.counters["delivered"] += n_samples
        self.counters["skipped"] += n - n_samples
        for q in qs[done == SKIPPED].tolist():
            self.skips.pop(q, None)
        counts = self.window_items
        for item in self.q_item[qs].tolist():
            n = counts[item] - 1
            if n:
                counts[item] = n
            else:
                del counts[item]
            if n <= 1 and item in self.repeated:
                self.repeated.discard(item)
                self.busy.pop(item, None)
        if self.at_b == b:  # every position of it finished: the next batch
            i = self.window.index(b)
            self.at_b, self.at_i = (-1, 0) if i == 0 else (self.window[i - 1], 1 << 30)
        self.window.remove(b)
        self.b_slot[b] = -1
        self.free_b.append(b)
        self.s_gen[slot] = self._next_s_gen()
        rec = self.records.slots[slot : slot + 1]
        rec["generation"], rec["lengths"][0, 0] = self.s_gen[slot], n_valid
        self._set_slot(slot, S_SENT if announced else S_FREE)
        self._fill_window()
        return int(self.s_gen[slot])

    def _next_s_gen(self) -> int:
        self.last_s_gen += 1
        return self.last_s_gen

    def freed(self, slot: int, generation: int) -> bool:
        if not 0 <= slot < self.terms.n_batch_slots or self.s_gen[slot] != generation:
            return False
        if self.s_state[slot] != S_SENT:
            return False
        self._set_slot(slot, S_FREE)
        self._fill_window()
        return True

    # ------------------------------------------------------------ stats
    def stats(self) -> SlotStats:
        """Its part of the stager's stats: the cursor and its epoch, places per state."""
        cursor = self.progress().cursor
        counts = np.bincount(self.p_state, minlength=len(SlotState))
        states = {SlotState(s).name: int(c) for s, c in enumerate(counts.tolist()) if c}
        return SlotStats(
            cursor,
            self.plan.epoch_of(cursor),
            states,
            len(self.p_state),
            dict(self.counters),
        )
