"""The stager's sample ring: which slot holds what, for whom, and what leaves in order.

Pure logic, no sockets, so every contract is testable with a fake clock.
Called by the stager's parts (consumer/stager/): the producer book decides
who is granted and who pays for a grant taken back; the intake reports READY
and SKIP; delivery pops finished positions. SlotManager is the one writer of
slot state: every transition goes through :meth:`SlotManager._to`, which also
writes the slot's record into ``headers`` (the ring's SLOT_DTYPE array, or
any array of that dtype in tests), so the record the inspector reads always
equals the manager's view. It also keeps which slots each producer holds and
which are fenced against it, keyed by the producer's identity. Plan positions
are the plan's (consumer/stager/plan/plan.py).

Exactly once (docs/design.md#contract-3). Each position is granted,
possibly again after its grant was taken back, until it is READY or SKIPPED;
a READY is accepted only for the slot's current generation from its grantee,
so a late READY is dropped and counted. Each position leaves
:meth:`SlotManager.pop_events` exactly once.

Deterministic order. Events leave in plan order; READY slots wait in a reorder
window. Grants are limited to ``n_slots - 1 - fenced`` positions past the
oldest unfinished one, so the oldest one always finds a free slot and the
window can never deadlock on a stalled producer.

Fences. A slot taken back from a producer that may still be writing it (alive,
local: stopped, not dead) is FENCED, not free: its item is granted again into
another slot, and the fenced slot is free again once that producer is known
dead or says HELLO again, or FENCE_LEASES leases passed. Speaking is not
enough: a woken producer may still hold grants queued for its old slots, so
the stager answers it with REHELLO, and a producer empties its queue before it
says HELLO. A pid proves nothing across PID namespaces, and the stager's check
after copying (seqlock, consumer/stager/intake.py) catches a late write anyway:
fencing saves work, it guarantees nothing.

Twins. A position may have a second grant out: a backup of the oldest open position
when it holds the plan back, or an audit of a remote producer's answer by a local
one (consumer/stager/twins.py, consumer/stager/audits.py). Either way it finishes
once; the grant not kept is taken back without going back to the plan.
"""

from __future__ import annotations

import collections
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from ringfeed.consumer.stager.order import PlanOrder
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.state import Event, Slot
from ringfeed.consumer.stager.twins import TwinSlots
from ringfeed.shared.memory.ring import SLOT_DTYPE, SlotState
from ringfeed.shared.run.stats_record import SlotStats
from ringfeed.shared.wire import protocol as p

# A fenced slot is free again after this many leases whatever its producer's pid says.
FENCE_LEASES = 4


class SlotManager:
    """Owns the free list, grants, reclaim and fences, and ordered delivery."""

    def __init__(
        self,
        plan: Plan,
        n_slots: int,
        lease_s: float,
        max_attempts: int,
        deterministic: bool,
        clock: Callable[[], float] = time.monotonic,
        started: Callable[[int], bool] | None = None,
        headers: np.ndarray | None = None,
    ) -> None:
        """started(slot): did its local producer begin that sample (the stager reads the
        slot header)? Only begun samples count against ring.max_item_attempts when a
        producer dies; without it, each producer's oldest grant does. headers: where
        each slot's record is written (SLOT_DTYPE [n_slots])."""
        self.plan = plan
        self.attach_headers(headers if headers is not None else np.zeros(n_slots, SLOT_DTYPE))
        self.n_slots, self.lease_s, self.max_attempts = n_slots, lease_s, max_attempts
        self.clock, self.started = clock, started
        self.slots = [Slot() for _ in range(n_slots)]
        self.free_slots: collections.deque[int] = collections.deque(range(n_slots))
        self.n_fenced = 0
        self.held: dict[bytes, set[int]] = {}  # producer -> its GRANTED slots
        self.fenced: dict[bytes, set[int]] = {}  # producer -> slots fenced against it
        self.order = PlanOrder(plan, deterministic)
        self.known_bad = self.order.known_bad
        names = ("grants", "ready", "reclaimed", "fences_lifted", "torn", "backups", "backups_won",
                 "audits", "audits_passed", "audits_failed", "audits_inconclusive",
                 "audits_unanswered", "skips_overruled", "skips_doubted")  # fmt: skip
        self._counters = dict.fromkeys(names, 0)
        self.granted_at: dict[int, int] = {}  # position -> the slot of its (first) grant
        self.twins = TwinSlots(self)  # positions with a second grant out (twins.py)
        for k in range(n_slots):
            self._to(k, SlotState.FREE)  # the headers start as our view: FREE, no item

    # ------------------------------------------------------------ plan cursor
    def reset(self, position: int, may_write: Callable[[bytes], bool]) -> set[bytes]:
        """Start delivering at `position` (a consumer's cursor). Granted slots are fenced
        where may_write(their producer), else freed; READY slots are dropped. Returns the
        producers that held grants: their queued grants are void."""
        holders = {ident for ident, slots in self.held.items() if slots}
        for k, slot in enumerate(self.slots):
            if slot.state == SlotState.GRANTED:
                self._take(k, fence=slot.producer is not None and may_write(slot.producer))
            elif slot.state == SlotState.READY:
                self._free(k)
        self.held.clear()
        self.twins.reset()
        self.granted_at.clear()
        self.order.reset(position)
        return holders

    @property
    def cursor(self) -> int:
        """The oldest position not yet handed out by pop_events."""
        return self.order.cursor

    def exhausted(self) -> bool:
        return self.order.exhausted()

    def pop_events(self, max_samples: int, until: int | None = None) -> list[Event]:
        return self.order.pop_events(max_samples, until)

    @property
    def counters(self) -> dict[str, int]:
        return self._counters | self.order.counters

    def stats(self) -> SlotStats:
        """Its part of the stager's stats: the cursor and its epoch, slots per state."""
        cursor = self.cursor
        states = Counter(SlotState(s.state).name for s in self.slots)
        return SlotStats(cursor, self.plan.epoch_of(cursor), dict(states), self.n_slots,
                         self.counters)  # fmt: skip

    # ------------------------------------------------------------ grants
    def grant(
        self, ident: bytes, owner_index: int, peer: PeerId | None = None, avoid: bool = False,
        auditor: bool = False,
    ) -> p.GrantEntry | None:  # fmt: skip
        """The next free slot and plan position for this producer of `peer`, or None (no
        free slot, the plan's end, or the reorder window is full). avoid: other peers
        work, so no retry taken back from this peer is given to it. auditor: a local
        producer, which takes an audit waiting for one first. When nothing else may be
        granted, the oldest open position if it is due for a backup (twins.py)."""
        free = self.free_slots[0] if self.free_slots else None
        if free is None:
            return None
        position = self.twins.audit_due() if auditor else None
        twin = position is not None
        if position is None:
            avoided = peer.account if avoid and peer else ""
            position = self.order.next_position(self._window(), avoided)
        if position is None:
            position = self.twins.backup_due(peer)
            twin = position is not None
        if position is None:
            return None
        slot = self.slots[free]
        slot.peer = peer
        slot.generation += 1
        slot.position, slot.item = position, self.plan.item_at(position)
        slot.producer, slot.t_granted, slot.t_granted_wall = ident, self.clock(), time.time()
        slot.owner_index = owner_index
        self._to(free, SlotState.GRANTED)
        self.held.setdefault(ident, set()).add(free)
        if twin:
            self.twins.granted(position, free)
            self.order.twin(slot.item)
        else:
            self.granted_at[position] = free
            self.order.granted(position, slot.item)
        self._counters["grants"] += 1
        return p.GrantEntry(free, slot.generation, slot.item, position)

    def mark_bad(self, bad: dict[int, tuple[str, str]]) -> None:
        """Items known bad before their first grant (item -> (reason, stage): quarantined
        earlier in this run, for a cause that still holds): skipped without a grant."""
        self.known_bad.update(bad)

    def holding(self, ident: bytes) -> int:
        """How many grants this producer holds now."""
        return len(self.held.get(ident, ()))

    def expired(self, ident: bytes, now: float) -> list[int]:
        """This producer's slots granted more than a lease ago."""
        return [k for k in self.held.get(ident, ()) if now - self.slots[k].t_granted > self.lease_s]

    def _window(self) -> int:
        return max(1, self.n_slots - 1 - self.n_fenced)

    # ------------------------------------------------------------ results
    def owns(self, ident: bytes, slot: int, generation: int, item: int) -> bool:
        """Does this producer hold this grant right now?"""
        return self.holds(ident, slot, generation) and self.slots[slot].item == item

    def holds(self, ident: bytes, slot: int, generation: int | None = None) -> bool:
        """Does this producer hold a grant of `slot` now (of `generation`, if given)?"""
        if not 0 <= slot < self.n_slots:
            return False
        s = self.slots[slot]
        return (
            s.producer == ident
            and s.state == SlotState.GRANTED
            and generation in (None, s.generation)
        )

    def ready(self, ident: bytes, slot: int, generation: int, item: int) -> bool:
        """The grantee filled the slot; False (a stale READY) if it no longer owns it."""
        if not self.answered(ident, slot, generation, item):
            return False
        position = self.slots[slot].position
        self.twins.end(position, slot)
        self.order.finish(Event("sample", position, item, slot=slot))
        return True

    def skip(
        self, ident: bytes, slot: int, generation: int, item: int, reason: str, stage: str,
        path: str, cause: str = "",
    ) -> bool:  # fmt: skip
        """The grantee cannot use this input; the slot is free again, and the item known
        bad for the rest of the run: later epochs skip it without a grant. cause: what
        decided the verdict (its quarantine line keeps it)."""
        if not self.answered(ident, slot, generation, item):
            return False
        position = self.slots[slot].position
        self._free(slot)
        self.twins.end(position, slot)
        self.known_bad[item] = (reason, stage)
        event = Event("skip", position, item, reason=reason, stage=stage, path=path, cause=cause)
        self.order.finish(event)
        return True

    def answered(self, ident: bytes, slot: int, generation: int, item: int) -> bool:
        """The grantee answered its grant of `slot` (False: it holds no such grant): the
        slot is READY now (an answer that is a SKIP frees it next)."""
        if not self.owns(ident, slot, generation, item):
            return False
        self._ungrant(slot)
        self._to(slot, SlotState.READY)
        self.held[ident].discard(slot)
        self.twins.service.add(self.clock() - self.slots[slot].t_granted)
        self.twins.passed(ident, self.slots[slot].t_granted)
        self._counters["ready"] += 1
        return True

    def torn(self, events: list[Event], bad: str = "") -> None:
        """events[0]'s rows failed the stager's check after copy: its slot gets a new
        generation, and events[0:] go back to the plan order, to leave again in turn.
        Its position is granted again, uncharged (a stale writer, or a lying producer,
        says nothing about the item); or, given `bad` (the same bad rows came from a
        second producer), its item is skipped with that reason."""
        first = events[0]
        peer = self.slots[first.slot].peer
        self.slots[first.slot].generation += 1
        self._free(first.slot)
        self._counters["torn"] += 1
        self.order.unpop(events)
        if not bad:
            account = peer.account if peer else ""  # granted again, to another peer if one works
            self.order.taken_back(first.position, first.item, False, self.max_attempts, account)
            return
        self.known_bad[first.item] = (bad, "content")
        self.order.finish(Event("skip", first.position, first.item, reason=bad, stage="content"))

    def granted_ever(self, slot: int, generation: int) -> bool:
        """Could a producer have been granted this slot at this generation?"""
        return 0 <= slot < self.n_slots and 0 < generation <= self.slots[slot].generation

    def release(self, slot: int) -> None:
        """The stager copied a READY slot into a batch: it is free again."""
        self._free(slot)

    # ------------------------------------------------------------ taking grants back
    def reclaim(self, k: int, fence: bool, charged: bool) -> None:
        """Take back the grant of slot k: a new generation, fenced against its producer
        (fence) or free; its position goes back to the plan, charged to its item or not."""
        slot = self.slots[k]
        position, item, peer = slot.position, slot.item, slot.peer
        self._take(k, fence)
        self._counters["reclaimed"] += 1
        if self.twins.split(position, k, item):
            return
        from_peer = peer.account if peer else ""
        self.order.taken_back(position, item, charged, self.max_attempts, from_peer)

    def reclaim_all(self, ident: bytes, fence: bool, charge: bool, local: bool) -> None:
        """Take back every grant of a producer. Only the sample it was working on counts as
        an attempt of that item (the slot header says, for a local one; else its oldest
        grant): a producer killed with 16 grants queued did not fail on 16 inputs."""
        slots = list(self.held.get(ident, ()))
        if not charge or not slots:
            charged: set[int] = set()
        elif self.started is not None and local:
            # At most one: a producer works on one sample at a time (a liar that marks
            # every slot it holds begun charges no more than one item).
            begun = [k for k in slots if self.started(k)]
            charged = {min(begun, key=lambda k: self.slots[k].t_granted)} if begun else set()
        else:
            charged = {min(slots, key=lambda k: self.slots[k].t_granted)}
        for k in slots:
            self.reclaim(k, fence, charged=k in charged)
        self.held.pop(ident, None)  # identities come and go: keep no empty entry

    def unfence(self, ident: bytes) -> None:
        """This producer cannot write any more (it died, or said HELLO with an empty
        queue): the slots fenced against it are free."""
        for k in self.fenced.pop(ident, ()):
            if self.slots[k].state == SlotState.FENCED:
                self._free(k)

    def lift_old_fences(self, now: float) -> None:
        """Free slots fenced for FENCE_LEASES leases: fencing saves work, it guarantees
        nothing (the stager's check after copying does)."""
        for k, slot in enumerate(self.slots):
            if slot.state == SlotState.FENCED and now - slot.t_fenced > FENCE_LEASES * self.lease_s:
                for slots in self.fenced.values():
                    slots.discard(k)
                self._free(k)
                self._counters["fences_lifted"] += 1
        self.fenced = {ident: slots for ident, slots in self.fenced.items() if slots}

    def fences(self, ident: bytes) -> int:
        """How many slots are fenced against this producer."""
        return len(self.fenced.get(ident, ()))

    # ------------------------------------------------------------ internals
    def count(self, name: str) -> None:
        self._counters[name] += 1

    def take_slot(self, k: int, fence: bool) -> None:
        """For the twins (twins.py): slot k leaves its producer (see _take)."""
        self._take(k, fence)

    def free_slot(self, k: int) -> None:
        """For the twins (twins.py): slot k is free (see _free)."""
        self._free(k)

    def _ungrant(self, k: int) -> None:
        """Slot k's grant ends: its position is no longer found by its slot."""
        position = self.slots[k].position
        if self.granted_at.get(position) == k:
            del self.granted_at[position]

    def _take(self, k: int, fence: bool) -> None:
        """Slot k leaves its producer with a new generation: FENCED against it, or free."""
        slot = self.slots[k]
        ident = slot.producer
        self._ungrant(k)
        slot.generation += 1
        if ident is not None:
            self.held.get(ident, set()).discard(k)
        if fence and ident is not None:
            slot.position = -1
            self._to(k, SlotState.FENCED)
            self.fenced.setdefault(ident, set()).add(k)
        else:
            self._free(k)

    def _free(self, k: int) -> None:
        slot = self.slots[k]
        slot.position, slot.item, slot.producer, slot.owner_index = -1, -1, None, -1
        slot.peer = None
        self._to(k, SlotState.FREE)

    def _to(self, k: int, state: SlotState) -> None:
        """Every slot change ends here: it keeps the free list and counts, and writes the
        slot's record (callers set generation, item and owner first; a READY changes
        the state only)."""
        slot = self.slots[k]
        old = slot.state
        if old != state:
            if old == SlotState.FREE:
                self.free_slots.remove(k)  # O(1) in practice: grants take the head
            elif state == SlotState.FREE:
                self.free_slots.append(k)
            self.n_fenced += (state == SlotState.FENCED) - (old == SlotState.FENCED)
            slot.state = state
            if state == SlotState.FENCED:
                slot.t_fenced = self.clock()
        # One column view per field (set in attach_headers): ~10x cheaper per write than
        # a record's fields, and this runs three times per sample in the stager.
        col = self._columns
        if state == SlotState.READY:
            col["state"][k] = state
            return
        col["state"][k], col["generation"][k], col["item"][k] = state, slot.generation, slot.item
        col["epoch"][k] = self.plan.epoch_of(slot.position) if slot.position >= 0 else 0
        col["producer"][k], col["t_granted"][k] = slot.owner_index, slot.t_granted_wall

    def attach_headers(self, headers: np.ndarray) -> None:
        """Write slot records into `headers` (SLOT_DTYPE [n_slots]) from now on; the stager
        swaps in a private copy before it unmaps the ring, so no view outlives the map."""
        self.headers = headers
        fields = ("state", "generation", "item", "epoch", "producer", "t_granted")
        self._columns = {name: headers[name] for name in fields}
