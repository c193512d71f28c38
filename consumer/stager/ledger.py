r"""The stager's slot ledger: the one owner of the state of every plan position being
delivered, every place a sample is written into, and every batch slot.

Pure logic, no sockets, so every contract is testable with a fake clock. Every other
part of the stager goes through the verbs of :class:`SlotLedger` (the Protocol at the
end of this module): the producer book grants runs and takes grants back, the intake
reports answers, the assembly takes finished batches and hands them on, the consumer
side frees batch slots, the twins (consumer/stager/twins.py, a part of this ledger)
grant backups and audits. No other module reads the ledger's tables.

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

Positions. The plan is cut into batches (consumer/stager/plan/plan.py; a plan that cuts
none, into ranges of stager.batch_size positions); the ledger holds the batches of up
to ``lookahead`` FILLING batch slots, and each of their positions::

    OPEN --grant--> GRANTED --READY--> ANSWERED (a sample at its place) ----+
      ^    (retry)    |  |  \--SKIP---> ANSWERED (a skip, its reason) ------+--> its
      |               |  |                                                  |   batch
      +--taken back---+  +--second grant (backup, audit)--> TWINNED --------+   is sent
         (a lease, a lie, a death: charged only when the producer was at it;
          after ring.max_item_attempts charged ones, a skip)

A remote READY held for an audit waits TWINNED until a local producer's answer
(consumer/stager/intake.py decides). Exactly once (docs/design.md#contract-3): each
position finishes once and leaves in one batch, whatever answers come late: a READY is
accepted only for the place's current generation from its holder. An item never has two
grants out but for a twin, so a bad item costs one attempt per run.

Batch slots (shared/memory/batch_ring.py draws their states). A plan batch starts in a
FREE slot; its positions are granted in plan order, retries first; when every one has
finished, :meth:`complete` hands it to the assembly (consumer/stager/assembly.py), which
checks its rows and either announces it (:meth:`sent`) or hands failing positions back
(:meth:`retry`). Batches are handed on in plan order (stager.deterministic; else any
finished one first). A row taken back from a producer that may still write it is
FENCED, and so is its batch slot once the batch moves out: the assembly copies the batch
into another slot before it is sent (:meth:`relocate`), so no row is delivered that a
producer the stager gave up on could still write. A row's fence lifts only when its
producer is known to write no more (it answered, said HELLO again, or its process, seen
by the kernel's pid, died); a spare's also after FENCE_LEASES leases, since a spare is
copied and checked after the copy (seqlock and checksum, docs/design.md#contract-7).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.state import Batch, Finished, Place, Position
from ringfeed.consumer.stager.twins import TwinSlots
from ringfeed.shared.memory.batch_ring import BatchState
from ringfeed.shared.memory.ring import SLOT_DTYPE, SlotState
from ringfeed.shared.run.stats_record import SlotStats
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# A fenced spare is free again after this many leases whatever its producer's pid says
# (a spare is copied and checked after the copy: fencing it saves work, no more).
FENCE_LEASES = 4
# Runs remembered by generation, so a late answer is told from one never granted.
MAX_RUNS = 4096
# The record fields the ledger writes (column views: ~10x cheaper per write than a
# record's fields, and this runs a few times a sample).
RECORD_FIELDS = ("state", "generation", "item", "epoch", "producer", "t_granted")


@dataclass(frozen=True)
class Cut:
    """One batch as the plan cuts it: its bucket (-1: a plan that cuts none), the global
    range [first, end), its shape (rows, frames, text) and this worker's positions."""

    bucket: int
    first: int
    end: int
    shape: tuple[int, int, int]
    positions: list[int]


class PlanBatches:
    """The plan's batches in order from a position: a plan that cuts batches gives its own
    (plan.batch_at: a bucket's range of positions, this worker's share of it); one that
    cuts none, ranges of `batch_rows` positions of the fixed shape. next_start: where the
    next batch begins (the plan's end once there is none)."""

    def __init__(self, plan: Plan, start: int, batch_rows: int, shape: tuple[int, int, int]):
        self.plan, self.batch_rows, self.shape = plan, batch_rows, shape
        self.next_start = plan.next_owned(start)

    def ended(self) -> bool:
        return self.plan.end is not None and self.next_start >= self.plan.end

    def __next__(self) -> Cut:
        if self.ended():
            raise StopIteration
        plan, first = self.plan, self.next_start
        if plan.batched:
            bucket, first, end = plan.batch_at(first)
            shape = plan.buckets[bucket].shape
            mine = [q for q in range(first, end) if plan.owns(q)]
        else:
            end = (
                first + self.batch_rows
                if plan.end is None
                else min(first + self.batch_rows, plan.end)
            )
            bucket, shape, mine = -1, self.shape, list(range(first, end))
        ended = plan.end is not None and end >= plan.end
        self.next_start = end if ended else plan.next_owned(end)
        return Cut(bucket, first, end, shape, mine)

    def __iter__(self) -> PlanBatches:
        return self


@dataclass(frozen=True)
class Grantee:
    """Who asks for a run: its identity, its index (for the records), its peer, whether
    its grants may name rows of a batch (in_place: the producer book says when),
    whether others work (then no retry taken back from its account goes to it), whether
    it is a local producer that takes an audit waiting for one first (auditor), and
    whether it maps the rings at all (local: a grant taken back from it while it lives
    is fenced)."""

    ident: bytes
    index: int
    peer: PeerId | None
    in_place: bool
    avoid: bool = False
    auditor: bool = False
    local: bool = False


@dataclass(frozen=True)
class Run:
    """A GRANT: its producer, its batch slot (-1: spare places) and that batch's shape,
    and its places (the ledger's numbers) with their items."""

    ident: bytes
    slot: int
    shape: tuple[int, int, int]
    places: dict[int, int]  # place -> item


@dataclass(frozen=True)
class Answer:
    """What a READY or SKIP names, checked against its run: refused (why the whole
    message is a lie: never granted, another's run, a place twice or not in the run, not
    the item granted), or each place named (the ledger's numbers, in order), those its
    producer still holds (owned) and those taken back from it since (stale: dropped,
    counted); slot and shape: the run's batch slot (-1: spares) and batch shape."""

    refused: str = ""
    places: tuple[int, ...] = ()
    # Why it was refused, as the drops count it: not-granted, repeated, wrong-item.
    why: str = ""
    owned: frozenset[int] = frozenset()
    stale: tuple[int, ...] = ()
    late: bool = False  # the whole run is forgotten or was taken back: a late answer
    slot: int = -1
    shape: tuple[int, int, int] = p.SPARE_SHAPE


class Ledger:
    """The slot ledger (see the module docstring). rows_per_slot, n_batch_slots: the
    batch ring's; n_spares: the spare ring's places; lookahead: batches filled ahead;
    batch_rows: rows of a batch of a plan that cuts none; lease_s: a grant's lease;
    max_attempts: ring.max_item_attempts; deterministic: batches leave in plan order;
    min_usable: batch slots that must stay out of fences (lift_old_fences)."""

    def __init__(
        self,
        plan: Plan,
        n_batch_slots: int,
        rows_per_slot: int,
        n_spares: int,
        lookahead: int,
        batch_rows: int,
        lease_s: float,
        max_attempts: int,
        deterministic: bool = True,
        clock: Callable[[], float] = time.monotonic,
        default_shape: tuple[int, int, int] = (0, 0, 0),
        capacity: int = 0,
        min_usable: int = 3,
    ) -> None:
        self.plan, self.clock = plan, clock
        self.n_batch_slots, self.rows_per_slot = n_batch_slots, rows_per_slot
        self.n_rows = n_batch_slots * rows_per_slot
        self.n_spares, self.lookahead, self.batch_rows = n_spares, lookahead, batch_rows
        # Grants out at once, at most: the look-ahead's rows (fair shares split these).
        self.capacity = capacity or max(1, lookahead * batch_rows)
        self.lease_s, self.max_attempts, self.deterministic = lease_s, max_attempts, deterministic
        # Batch slots that must stay in use (the consumer's, one filled, one to move to).
        self.min_usable = min_usable
        self.default_shape = default_shape
        self.places = [Place() for _ in range(self.n_rows + n_spares)]
        # Spares only a position of the oldest batch may take (see _place_for).
        self.spare_reserve = min(n_spares // 2, rows_per_slot)
        self.free_spares: collections.deque[int] = collections.deque(
            range(self.n_rows, self.n_rows + n_spares)
        )
        self.slot_state = [BatchState.FREE] * n_batch_slots
        self.slot_generation = [0] * n_batch_slots
        self.slot_fences = [0] * n_batch_slots  # fenced rows per slot
        self.held: dict[bytes, set[int]] = {}  # producer -> places it holds GRANTED
        self.fenced: dict[bytes, set[int]] = {}  # producer -> places fenced against it
        self.runs: dict[int, Run] = {}
        self.generation = 0  # the last run's
        self.known_bad: dict[int, tuple[str, str]] = {}  # item -> (reason, stage)
        self.busy: collections.Counter[int] = collections.Counter()  # item -> grants out
        names = (
            "runs",
            "grants",
            "answered",
            "salvaged",
            "reclaimed",
            "fences_lifted",
            "torn",
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
        self.counters = dict.fromkeys(names, 0)
        self.twins = TwinSlots(self)
        self.attach_records(
            np.zeros(self.n_rows, SLOT_DTYPE),
            np.zeros(n_spares, SLOT_DTYPE),
            np.zeros(n_batch_slots, SLOT_DTYPE),
        )
        self.restart(0, lambda ident: False)

    # ------------------------------------------------------------ records
    def attach_records(self, rows: np.ndarray, spares: np.ndarray, slots: np.ndarray) -> None:
        """Write place records into `rows` (the batch ring's row records), `spares` (the
        spare ring's slot records) and batch slot records into `slots` from now on; the
        stager swaps in private copies before it unmaps the rings."""
        self._rows = {name: rows[name] for name in RECORD_FIELDS}
        self._spares = {name: spares[name] for name in RECORD_FIELDS}
        self.slot_records = slots
        self.records = (rows, spares)
        self.seals = (rows["sealed_generation"], spares["sealed_generation"])
        self.writing = (rows["writing_generation"], spares["writing_generation"])
        for k in range(len(self.places)):
            self._record(k)

    def all_records(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The arrays attach_records was given: row records, spare records, slot records."""
        return (*self.records, self.slot_records)

    def header(self, place: int, name: str) -> int:
        """A field of a place's record in shared memory (a producer's progress fields)."""
        if place < self.n_rows:
            return int(self.records[0][name][place])
        return int(self.records[1][name][place - self.n_rows])

    def _record(self, k: int) -> None:
        """Write place k's record as the ledger sees it (a READY changes the state only)."""
        pl = self.places[k]
        cols, i = (self._rows, k) if k < self.n_rows else (self._spares, k - self.n_rows)
        cols["state"][i] = pl.state
        if pl.state == SlotState.READY:
            return
        cols["generation"][i], cols["item"][i] = pl.generation, pl.item
        cols["epoch"][i] = self.plan.epoch_of(pl.position) if pl.position >= 0 else 0
        cols["producer"][i], cols["t_granted"][i] = pl.owner_index, pl.t_granted_wall

    def _record_run(
        self,
        slot: int,
        index: list[int],
        positions: list[int],
        g: int,
        items: list[int],
        owner: int,
        wall: float,
    ) -> None:
        """The records of a run's places (rows of batch slot `slot`, or spares: their
        indices there), GRANTED, in one write per field: a run is granted at once."""
        cols = self._rows if slot >= 0 else self._spares
        at = np.asarray(index) + (slot * self.rows_per_slot if slot >= 0 else 0)
        cols["state"][at], cols["generation"][at], cols["item"][at] = SlotState.GRANTED, g, items
        cols["epoch"][at] = np.asarray(positions) // self.plan.n_items
        cols["producer"][at], cols["t_granted"][at] = owner, wall

    def _set_slot(self, b: int, state: BatchState) -> None:
        self.slot_state[b] = state
        self.slot_records[b]["state"] = state

    # ------------------------------------------------------------ the plan's batches
    def restart(self, position: int, may_write: Callable[[bytes], bool]) -> set[bytes]:
        """Deliver from plan `position` (a consumer's cursor) on: every batch being filled
        is dropped, its granted places taken back (fenced where may_write(holder)) and
        the rest freed; every batch slot is free but those fenced. Returns the producers
        that held grants: their queued grants are void."""
        holders = {ident for ident, places in self.held.items() if places}
        for k, pl in enumerate(self.places):
            if pl.state == SlotState.GRANTED:
                self._take(k, fence=pl.holder is not None and may_write(pl.holder))
            elif pl.state == SlotState.READY:
                self.free_place(k)
        self.held.clear()
        self.busy.clear()
        self.twins.reset()
        for b in range(self.n_batch_slots):
            if self.slot_state[b] != BatchState.FENCED:
                self.slot_generation[b] += 1
                self.slot_records[b]["generation"] = self.slot_generation[b]
                self._set_slot(b, BatchState.FREE if not self.slot_fences[b] else BatchState.FENCED)
        self.window: collections.deque[Batch] = collections.deque()
        self.cuts = PlanBatches(self.plan, position, self.batch_rows, self.default_shape)
        self.retries: list[Position] = []  # to grant again, in position order
        self.by_position: dict[int, Position] = {}
        # [batch, index in it] of the next position never granted: [None, 0] before the
        # window's first batch.
        self.grant_at: list = [None, 0]
        self._fill_window()
        return holders

    def _fill_window(self) -> None:
        """Start plan batches in free slots, up to the look-ahead."""
        while len(self.window) < self.lookahead and not self.cuts.ended():
            free = [b for b in range(self.n_batch_slots) if self.slot_state[b] == BatchState.FREE]
            if len(free) <= 1 and self.window:  # one slot kept for a batch that must move
                return
            if not free:
                return
            self._start_batch(free[0])

    def _start_batch(self, b: int) -> None:
        cut = next(self.cuts)
        batch = Batch(b, cut.first, cut.end, cut.shape)
        for row, q in enumerate(cut.positions):
            pos = Position(q, self.plan.item_at(q), batch, row)
            batch.positions.append(pos)
            self.by_position[q] = pos
        batch.unfinished = len(cut.positions)
        self.window.append(batch)
        self._set_slot(b, BatchState.FILLING)
        for pos in batch.positions:  # items known bad are skipped without a grant
            if pos.item in self.known_bad:
                self._skip_known(pos)

    @property
    def cursor(self) -> int:
        """The first position of the oldest batch not yet sent."""
        return self.window[0].first if self.window else self.cuts.next_start

    def exhausted(self) -> bool:
        """True once every batch of a finite plan has been sent."""
        return not self.window and self.cuts.ended()

    # ------------------------------------------------------------ grants
    def grant(self, who: Grantee, n: int) -> list[p.GrantEntry]:
        """A run of up to n places for this producer (empty: nothing may be granted now):
        an audit waiting for a local producer first (when it is one), then retries (not
        one taken back from its own account while others work), then positions in plan
        order; rows written in place when it may (who.in_place, the row free), else spare
        places. When nothing else may be granted, the oldest open position if it is due
        for a backup (twins.py)."""
        if n <= 0:
            return []
        if who.auditor and (pos := self.twins.audit_due()) is not None:
            return self._grant_twin(who, pos)
        account = who.peer.account if who.avoid and who.peer is not None else ""
        picked: list[tuple[Position, int]] = []
        target: int | None = None  # the batch slot of the run, or -1 for spares
        while len(picked) < n:
            pos = self._retry_for(account)
            first = pos is None
            if first:
                pos = self._next_first()
            if pos is None:
                break
            place = self._place_for(pos, who.in_place)
            if place is None or (target is not None and self._slot_of(place) != target):
                break
            target = self._slot_of(place)
            if first:
                self.grant_at[1] += 1
            else:
                self.retries.remove(pos)
                pos.retry = False
            self._hold(pos, place)
            picked.append((pos, place))
        if not picked:
            pos = self.twins.backup_due(who.peer)
            return self._grant_twin(who, pos) if pos is not None else []
        return self._run(who, picked)

    def _retry_for(self, account: str) -> Position | None:
        """The first retry (lowest position) that may be granted now: its item has no grant
        out, and it did not come back from `account` (while others work)."""
        for pos in list(self.retries):
            if pos.item in self.known_bad:
                self._skip_known(pos)
            elif not self.busy[pos.item] and not (account and pos.taken_from == account):
                return pos
        return None

    def _next_first(self) -> Position | None:
        """The next position never granted, in plan order, not taken yet (grant_at points
        at it); None: the window's end, or its item has a grant out (a dataset smaller
        than the grants out waits for it)."""
        while True:
            batch, i = self.grant_at
            if batch is None or i >= len(batch.positions):
                following = self._after(batch)
                if following is None:
                    return None
                self.grant_at = [following, 0]
                continue
            pos = batch.positions[i]
            if pos.done is not None or pos.grants or pos.retry:
                self.grant_at[1] += 1
                continue
            if pos.item in self.known_bad:  # found bad since its batch started: no grant
                self._skip_known(pos)
                continue
            return None if self.busy[pos.item] else pos

    def _skip_known(self, pos: Position) -> None:
        reason, stage = self.known_bad[pos.item]
        self.finish(pos, Finished("skip", pos.position, pos.item, reason=reason, stage=stage))

    def _after(self, batch: Batch | None) -> Batch | None:
        """The batch after `batch` in the window (the first one for None), starting one
        if the look-ahead allows; None if there is none."""
        index = 0 if batch is None else self._index(batch) + 1
        if index >= len(self.window):
            self._fill_window()
        return self.window[index] if index < len(self.window) else None

    def _index(self, batch: Batch) -> int:
        for i, other in enumerate(self.window):
            if other is batch:
                return i
        return -1

    def _place_for(self, pos: Position, rows: bool) -> int | None:
        """Its row when the grant may name rows and the row is free (its batch never moved
        its rows), else a free spare place; None when none is free, or only the reserve
        and pos is not of the oldest batch: the oldest batch's retries and backups always
        find one, or samples of later batches could hold every spare while it waits."""
        if rows and not pos.batch.compacted:
            k = pos.batch.slot * self.rows_per_slot + pos.row
            if self.places[k].state == SlotState.FREE:
                return k
        reserve = 0 if self.window and pos.batch is self.window[0] else self.spare_reserve
        return self.free_spares[0] if len(self.free_spares) > reserve else None

    def _slot_of(self, place: int) -> int:
        return place // self.rows_per_slot if place < self.n_rows else -1

    def _hold(self, pos: Position, place: int) -> None:
        """Reserve place for pos while a run is put together (granted by _run)."""
        if place >= self.n_rows:
            self.free_spares.remove(place)  # the head: O(1)
        self.places[place].state = SlotState.GRANTED
        pos.grants.append(place)
        self.busy[pos.item] += 1

    def _run(self, who: Grantee, picked: list[tuple[Position, int]]) -> list[p.GrantEntry]:
        """Grant the reserved places as one run under a new generation."""
        self.generation += 1
        g, now, wall = self.generation, self.clock(), time.time()
        slot = self._slot_of(picked[0][1])
        shape = self.window_shape(picked[0][0].batch) if slot >= 0 else p.SPARE_SHAPE
        out, places = [], {}
        held = self.held.setdefault(who.ident, set())
        base = slot * self.rows_per_slot if slot >= 0 else self.n_rows
        for pos, k in picked:
            pl = self.places[k]
            pl.generation, pl.position, pl.item = g, pos.position, pos.item
            pl.holder, pl.peer, pl.owner_index = who.ident, who.peer, who.index
            pl.t_granted, pl.t_granted_wall, pl.writes_memory = now, wall, who.local
            held.add(k)
            places[k] = pos.item
            out.append(p.GrantEntry(k - base, g, pos.item, pos.position, slot, shape))
        self._record_run(
            slot,
            [k - base for _, k in picked],
            [q.position for q, _ in picked],
            g,
            [q.item for q, _ in picked],
            who.index,
            wall,
        )
        self._remember(g, Run(who.ident, slot, shape, places))
        self.counters["runs"] += 1
        self.counters["grants"] += len(out)
        return out

    def _grant_twin(self, who: Grantee, pos: Position) -> list[p.GrantEntry]:
        """A second grant of pos (a backup or an audit), into a spare place."""
        k = self._place_for(pos, False)
        if k is None:
            self.twins.no_place(pos)
            return []
        self._hold(pos, k)
        self.twins.granted(pos, k)
        return self._run(
            Grantee(who.ident, who.index, who.peer, False, local=who.local), [(pos, k)]
        )

    def window_shape(self, batch: Batch) -> tuple[int, int, int]:
        return batch.shape

    def _remember(self, g: int, run: Run) -> None:
        self.runs[g] = run
        while len(self.runs) > MAX_RUNS:
            del self.runs[next(iter(self.runs))]

    def mark_bad(self, bad: dict[int, tuple[str, str]]) -> None:
        """Items known bad before their first grant (item -> (reason, stage): quarantined
        earlier in this run for a cause that still holds, or outside their speaking-rate
        band under data.outliers: skip): skipped without a grant."""
        self.known_bad.update(bad)
        for batch in self.window:
            for pos in batch.positions:
                if pos.item in bad and pos.done is None and not pos.grants:
                    self._skip_known(pos)

    # ------------------------------------------------------------ answers
    def answer(self, ident: bytes, generation: int, places: list[int], items: list[int]) -> Answer:
        """Check what a READY or SKIP names against the run of `generation` (see Answer);
        the places are the run's numbers on the wire (rows of its batch, or spares)."""
        run = self.runs.get(generation)
        if run is None:
            if not 0 < generation <= self.generation:
                return Answer(f"generation {generation} was never granted", why="not-granted")
            return Answer(late=True)
        if run.ident != ident:
            why = f"generation {generation} was granted to another producer"
            return Answer(why, why="not-granted")
        base = run.slot * self.rows_per_slot if run.slot >= 0 else self.n_rows
        named = [base + w for w in places]
        if len(set(named)) != len(named):
            why = f"a place named twice in the answer of generation {generation}"
            return Answer(why, why="repeated")
        owned, stale = [], []
        for k, w, item in zip(named, places, items, strict=True):
            if k not in run.places:
                why = f"place {w} is not in the run of generation {generation}"
                return Answer(why, why="not-granted")
            if run.places[k] != item:
                why = f"place {w}: item {item}, not the item granted ({run.places[k]})"
                return Answer(why, why="wrong-item")
            (owned if self.holds_answer(k, generation, ident) else stale).append(k)
        return Answer(
            "", tuple(named), "", frozenset(owned), tuple(stale), not owned, run.slot, run.shape
        )

    def holds_answer(self, k: int, generation: int, ident: bytes | None = None) -> bool:
        """Is place k still granted under `generation` (to `ident`, if given)?"""
        pl = self.places[k]
        return (
            pl.state == SlotState.GRANTED
            and pl.generation == generation
            and (ident is None or pl.holder == ident)
        )

    def locate(self, k: int) -> tuple[int, int]:
        """(batch slot, row) of place k, or (-1, spare slot)."""
        if k < self.n_rows:
            return divmod(k, self.rows_per_slot)
        return -1, k - self.n_rows

    def where(self, k: int) -> tuple[int, tuple[int, int, int], int]:
        """(batch slot or -1, its batch's shape, row or spare slot) of place k, for
        shared/memory/places.py."""
        slot, index = self.locate(k)
        if slot < 0:
            return slot, p.SPARE_SHAPE, index
        pos = self.by_position.get(self.places[k].position)
        shape = pos.batch.shape if pos is not None else self.default_shape
        return slot, shape, index

    def seal(self, k: int) -> int:
        """The generation place k's producer sealed it with (its record)."""
        if k < self.n_rows:
            return int(self.seals[0][k])
        return int(self.seals[1][k - self.n_rows])

    def answered(self, place: int) -> Position:
        """The holder of `place` (one Answer.owned) answered it: the place is READY (a SKIP
        frees it next); returns its position, unfinished yet."""
        pl = self.places[place]
        pos = self.by_position[pl.position]
        held = self.held.get(pl.holder)  # type: ignore[arg-type]
        if held is not None:
            held.discard(place)
        self._ungrant(pos, place)
        pl.state = SlotState.READY
        self._record(place)
        self.twins.service.add(self.clock() - pl.t_granted)
        if pl.holder is not None:
            self.twins.passed(pl.holder, pl.t_granted)
        self.counters["answered"] += 1
        return pos

    def ready(self, place: int, entry: p.ReadyEntry, ident: bytes, peer: PeerId | None) -> None:
        """place's sample is accepted (after answered()): its position has finished."""
        pos = self.by_position[self.places[place].position]
        self.twins.end(pos, place)
        self.finish(
            pos, Finished("sample", pos.position, pos.item, place, entry, ident=ident, peer=peer)
        )

    def skip(self, place: int, how: Finished) -> None:
        """place's holder cannot use its input (after answered()): the place is free, the
        item known bad for the rest of the run; its position has finished."""
        pos = self.by_position[self.places[place].position]
        self.free_place(place)
        self.twins.end(pos, place)
        self.known_bad[pos.item] = (how.reason, how.stage)
        self.finish(pos, how)

    def finish(self, pos: Position, how: Finished) -> None:
        """pos finished (a sample, or a skip)."""
        if pos.retry:
            self.retries.remove(pos)
            pos.retry = False
        if pos.done is None:
            pos.batch.unfinished -= 1
        pos.done = how

    # ------------------------------------------------------------ taking grants back
    def take_back(self, place: int, fence: bool, charged: bool) -> None:
        """Take back the grant of `place`: fenced against its holder (it may still write)
        or free; its position is granted again (to another account, if one works), or
        skipped once ring.max_item_attempts charged grants failed."""
        pl = self.places[place]
        pos = self.by_position.get(pl.position)
        peer, granted = pl.peer, pl.state == SlotState.GRANTED
        self._take(place, fence)
        self.counters["reclaimed"] += 1
        if pos is None or not granted:
            return
        self._ungrant(pos, place)
        if pos.done is not None or self.twins.split(pos, place):
            return
        self.again(pos, charged, peer.account if peer is not None else "")

    def _ungrant(self, pos: Position, place: int) -> None:
        """One grant of pos ended (answered or taken back)."""
        if place in pos.grants:
            pos.grants.remove(place)
            self.busy[pos.item] -= 1
            if self.busy[pos.item] <= 0:
                del self.busy[pos.item]

    def again(self, pos: Position, charged: bool, account: str) -> None:
        pos.attempts += charged
        if pos.attempts < self.max_attempts:
            pos.taken_from = account
            self._queue_retry(pos)
            return
        reason = (
            f"lease expired {pos.attempts} times (ring.max_item_attempts): its producers "
            "died or stalled on this input; check it or raise ring.lease_s"
        )
        self.known_bad[pos.item] = (reason, "lease")
        self.finish(pos, Finished("skip", pos.position, pos.item, reason=reason, stage="lease"))

    def _queue_retry(self, pos: Position) -> None:
        if not pos.retry:
            pos.retry = True
            bisect.insort(self.retries, pos, key=lambda q: q.position)

    def take_back_all(self, ident: bytes, fence: bool, charge: bool, local: bool) -> None:
        """Take back every grant of a producer. Only the sample it was working on counts
        as an attempt of that item (the place's record says, for a local one; else its
        oldest grant, the first of its run in plan order: a remote producer answers each
        sample as it is written): a producer killed with 16 grants queued did not fail on
        16 inputs."""
        places = list(self.held.get(ident, ()))
        if not charge or not places:
            charged: set[int] = set()
        elif local:
            # At most one: a producer works on one sample at a time (a liar that marks
            # every place it holds begun charges no more than one item).
            begun = [k for k in places if self.started(k)]
            charged = {min(begun, key=lambda k: self.places[k].t_granted)} if begun else set()
        else:  # a remote producer answers each sample: its oldest grant, first in its run
            charged = {
                min(places, key=lambda k: (self.places[k].t_granted, self.places[k].position))
            }
        for k in places:
            self.take_back(k, fence, charged=k in charged)
        self.held.pop(ident, None)  # identities come and go: keep no empty entry

    def holding(self, ident: bytes) -> int:
        """How many grants this producer holds now."""
        return len(self.held.get(ident, ()))

    def holds(self, ident: bytes, place: int) -> bool:
        return place in self.held.get(ident, ())

    def place_of(self, entry: p.GrantEntry) -> int:
        """The ledger's number of a granted place (a GRANT names rows of its batch slot,
        or spare slots)."""
        if entry.batch < 0:
            return self.n_rows + entry.place
        return entry.batch * self.rows_per_slot + entry.place

    def expired(self, ident: bytes, now: float) -> list[int]:
        """This producer's places granted more than a lease ago."""
        return [
            k for k in self.held.get(ident, ()) if now - self.places[k].t_granted > self.lease_s
        ]

    def done_with(self, ident: bytes) -> None:
        """This producer cannot write any more (it died, or said HELLO with an empty
        queue): the places fenced against it are free."""
        for k in self.fenced.pop(ident, ()):
            if self.places[k].state == SlotState.FENCED:
                self._unfence(k)

    def lift_old_fences(self, now: float) -> None:
        """Free spares fenced for FENCE_LEASES leases (a spare is copied and checked after
        the copy: fencing it saves work, it guarantees nothing). A row's fence holds until
        its producer is known to write no more, for a row is delivered where it lies: its
        batch slot stays FENCED (out of use) meanwhile. Only when so many slots are fenced
        that fewer than min_usable are left, the oldest row fences past FENCE_LEASES
        leases are lifted too, and said so: the run goes on, and the stager's checks at
        assembly still catch a stale write before its batch is sent."""
        old = FENCE_LEASES * self.lease_s
        for k in range(self.n_rows, len(self.places)):
            pl = self.places[k]
            if pl.state == SlotState.FENCED and now - pl.t_fenced > old:
                self._lift(k)
        fenced_slots = [b for b, n in enumerate(self.slot_fences) if n]
        if self.n_batch_slots - len(fenced_slots) < self.min_usable:
            rows = [
                k
                for b in fenced_slots
                for k in self._rows_of(b)
                if self.places[k].state == SlotState.FENCED and now - self.places[k].t_fenced > old
            ]
            if rows:
                oldest = min(rows, key=lambda k: self.places[k].t_fenced)
                b = oldest // self.rows_per_slot
                log.error(
                    "batch slot %d: lifting fences older than %d leases on its rows, as "
                    "%d of %d batch slots are fenced by producers that neither answer "
                    "nor die (stop them: their pids are in the inspector); a write they "
                    "still make is caught only until its batch is sent",
                    b,
                    FENCE_LEASES,
                    len(fenced_slots),
                    self.n_batch_slots,
                )
                for k in self._rows_of(b):
                    if self.places[k].state == SlotState.FENCED:
                        self._lift(k)
        self.fenced = {ident: places for ident, places in self.fenced.items() if places}

    def _lift(self, k: int) -> None:
        for places in self.fenced.values():
            places.discard(k)
        self._unfence(k)
        self.counters["fences_lifted"] += 1

    def _rows_of(self, b: int) -> range:
        return range(b * self.rows_per_slot, (b + 1) * self.rows_per_slot)

    def fences(self, ident: bytes) -> int:
        """How many places are fenced against this producer."""
        return len(self.fenced.get(ident, ()))

    def beaten_answer(self, ident: bytes, place: int, generation: int) -> bool:
        """A late answer of a grant taken back: True if a backup had beaten it (twins.py);
        either way its producer is done with that place (free, if still fenced for it)."""
        beaten = self.twins.late(ident, place, generation)
        pl = self.places[place]
        if (
            pl.state == SlotState.FENCED
            and pl.generation == generation
            and place in self.fenced.get(ident, ())
        ):
            self.fenced[ident].discard(place)
            self._unfence(place)
        return beaten

    # ------------------------------------------------------------ batches out
    def complete(self) -> Batch | None:
        """The next batch whose every position finished (the oldest, when deterministic),
        for the assembly; None if none."""
        self._fill_window()
        if not self.window:
            return None
        if self.deterministic:
            head = self.window[0]
            return head if head.unfinished == 0 and not self._twinned(head) else None
        for batch in self.window:
            if batch.unfinished == 0 and not self._twinned(batch):
                return batch
        return None

    def _twinned(self, batch: Batch) -> bool:
        return any(pos.twin is not None for pos in batch.positions)

    def must_move(self, batch: Batch) -> bool:
        """Does one of the batch's rows have a fence (a producer the stager gave up on may
        still write it)? Then its rows are copied into another slot before it is sent."""
        return self.slot_fences[batch.slot] > 0

    def relocate(self, batch: Batch) -> int | None:
        """Move the batch to a free slot (its old one FENCED until its fences lift); the
        new slot's number, or None if none is free (it waits)."""
        free = [b for b in range(self.n_batch_slots) if self.slot_state[b] == BatchState.FREE]
        if not free:
            return None
        old, new = batch.slot, free[0]
        for k in range(old * self.rows_per_slot, (old + 1) * self.rows_per_slot):
            if self.places[k].state != SlotState.FENCED:
                self.free_place(k)
        self._set_slot(old, BatchState.FENCED)
        self._set_slot(new, BatchState.FILLING)
        batch.slot, batch.compacted = new, True
        self.counters["relocated"] += 1
        return new

    def moved(self, batch: Batch, finals: dict[int, int]) -> None:
        """The assembly moved samples into their final places (position -> place, rows of
        the batch's slot): they are found there from now on."""
        batch.compacted = True
        for pos in batch.positions:
            k, how = finals.get(pos.position), pos.done
            if k is None or how is None or how.kind != "sample" or how.place == k:
                continue
            old = how.place
            if old >= self.n_rows and self.places[old].state == SlotState.READY:
                self.free_place(old)  # a spare copied out
            pos.done = dataclasses.replace(how, place=k)
            self.places[k].state = SlotState.READY

    def retry(self, pos: Position, bad: str = "") -> None:
        """pos's sample failed the assembly's checks (a torn copy, or bad rows): granted
        again, uncharged (a stale writer or a lying producer says nothing about the item),
        to another peer if one works; or, given `bad` (a second peer sent bad rows for
        it), its item is skipped with that reason."""
        how = pos.done
        assert how is not None and how.kind == "sample"
        if how.place >= self.n_rows and self.places[how.place].state == SlotState.READY:
            self.free_place(how.place)
        pos.done = None
        pos.batch.unfinished += 1
        self.counters["torn"] += not bad
        if bad:
            self.known_bad[pos.item] = (bad, "content")
            self.finish(pos, Finished("skip", pos.position, pos.item, reason=bad, stage="content"))
            return
        account = how.peer.account if how.peer is not None else ""
        pos.taken_from = account
        pos.batch.compacted = True  # its row may hold another's sample now
        self._queue_retry(pos)

    def sent(self, batch: Batch, n_valid: int, announced: bool = True) -> int:
        """The batch leaves (announced from its slot, or, with nothing in it and nobody
        waiting for an empty one, dropped): the slot is SENT (FREE when not announced),
        its places free, its positions gone; returns the slot's generation (for
        BATCH_FREE)."""
        b = batch.slot
        rows = self._rows_of(b)
        freed = [k for k in rows if self.places[k].state not in (SlotState.FREE, SlotState.FENCED)]
        for k in freed:
            pl = self.places[k]
            pl.state, pl.position, pl.item, pl.holder, pl.peer = SlotState.FREE, -1, -1, None, None
            pl.owner_index = -1
        if freed:  # their records, in one write per field
            cols, at = self._rows, np.asarray(freed)
            cols["state"][at], cols["item"][at], cols["epoch"][at] = SlotState.FREE, -1, 0
            cols["producer"][at] = -1
        for pos in batch.positions:
            how = pos.done
            if how is not None and how.kind == "sample" and how.place >= self.n_rows:
                if self.places[how.place].state == SlotState.READY:
                    self.free_place(how.place)
            self.by_position.pop(pos.position, None)
            kind = "delivered" if how is not None and how.kind == "sample" else "skipped"
            self.counters[kind] += 1
        if self.grant_at[0] is batch:  # every position of it finished: the next batch
            self.grant_at = [None, 0] if self._index(batch) == 0 else [self._before(batch), 1 << 30]
        self.window.remove(batch)
        self.slot_generation[b] += 1
        rec = self.slot_records[b]
        rec["generation"], rec["lengths"][0] = self.slot_generation[b], n_valid
        self._set_slot(b, BatchState.SENT if announced else BatchState.FREE)
        self._fill_window()
        return self.slot_generation[b]

    def freed(self, slot: int, generation: int) -> bool:
        """The consumer is done with batch slot `slot`; False for a stale or bogus one."""
        if not 0 <= slot < self.n_batch_slots or self.slot_generation[slot] != generation:
            return False
        if self.slot_state[slot] != BatchState.SENT:
            return False
        self._set_slot(slot, BatchState.FREE)
        self._fill_window()
        return True

    def _before(self, batch: Batch) -> Batch:
        return self.window[self._index(batch) - 1]

    def written(self, ident: bytes, n_fields: int) -> list[tuple[int, p.ReadyEntry]]:
        """The places this producer holds that it wrote whole: both progress fields of the
        record at the grant's generation (the seal is the last thing a producer writes), as
        (place, the READY entry it would have sent: its lengths from the record, no
        checksum or marks yet)."""
        out = []
        for k in sorted(self.held.get(ident, ())):
            pl, (slot, index) = self.places[k], self.locate(k)
            g = pl.generation
            if self.header(k, "writing_generation") == g == self.seal(k):
                rows = self.records[0] if slot >= 0 else self.records[1]
                at = k if slot >= 0 else index
                lengths = [int(n) for n in rows["lengths"][at][:n_fields]]
                out.append((k, p.ReadyEntry(index, g, pl.item, lengths, 0, 0)))
        return out

    def started(self, place: int) -> bool:
        """Was the local producer holding `place` in the middle of its grant: begun, not
        sealed (a sealed one whose READY had not left yet did not fail)?"""
        g = self.places[place].generation
        return (
            self.header(place, "writing_generation") == g != self.header(place, "sealed_generation")
        )

    def in_flight(self) -> int:
        """Batches announced and not yet freed by the consumer."""
        return sum(s == BatchState.SENT for s in self.slot_state)

    # ------------------------------------------------------------ place changes
    def _take(self, k: int, fence: bool) -> None:
        """Place k leaves its holder: FENCED against it (it may still write), or free."""
        pl = self.places[k]
        ident = pl.holder
        if ident is not None:
            held = self.held.get(ident)
            if held is not None:
                held.discard(k)
        if fence and ident is not None and pl.writes_memory:
            pl.state, pl.t_fenced = SlotState.FENCED, self.clock()
            self._record(k)
            self.fenced.setdefault(ident, set()).add(k)
            if k < self.n_rows:
                self.slot_fences[k // self.rows_per_slot] += 1
        else:
            self.free_place(k)

    def _unfence(self, k: int) -> None:
        if k < self.n_rows:
            b = k // self.rows_per_slot
            self.slot_fences[b] -= 1
            self.free_place(k)
            if self.slot_state[b] == BatchState.FENCED and not self.slot_fences[b]:
                self._set_slot(b, BatchState.FREE)
            return
        self.free_place(k)

    def free_place(self, k: int) -> None:
        pl = self.places[k]
        was = pl.state
        pl.state, pl.position, pl.item, pl.holder, pl.peer = SlotState.FREE, -1, -1, None, None
        pl.owner_index = -1
        self._record(k)
        if k >= self.n_rows and was != SlotState.FREE:
            self.free_spares.append(k)

    def count(self, name: str) -> None:
        self.counters[name] += 1

    # ------------------------------------------------------------ stats
    def stats(self) -> SlotStats:
        """Its part of the stager's stats: the cursor and its epoch, places per state."""
        cursor = self.cursor
        states = collections.Counter(SlotState(pl.state).name for pl in self.places)
        return SlotStats(
            cursor, self.plan.epoch_of(cursor), dict(states), len(self.places), dict(self.counters)
        )


class SlotLedger(Protocol):
    """The ledger's face: what every other part of the stager may ask of it."""

    def grant(self, who: Grantee, n: int) -> list[p.GrantEntry]: ...
    def answer(
        self, ident: bytes, generation: int, places: list[int], items: list[int]
    ) -> Answer: ...
    def answered(self, place: int) -> Position: ...
    def ready(self, place: int, entry: p.ReadyEntry, ident: bytes, peer: PeerId | None) -> None: ...
    def skip(self, place: int, how: Finished) -> None: ...
    def take_back(self, place: int, fence: bool, charged: bool) -> None: ...
    def take_back_all(self, ident: bytes, fence: bool, charge: bool, local: bool) -> None: ...
    def done_with(self, ident: bytes) -> None: ...
    def complete(self) -> Batch | None: ...
    def retry(self, pos: Position, bad: str = "") -> None: ...
    def sent(self, batch: Batch, n_valid: int, announced: bool = True) -> int: ...
    def freed(self, slot: int, generation: int) -> bool: ...
    def restart(self, position: int, may_write: Callable[[bytes], bool]) -> set[bytes]: ...
