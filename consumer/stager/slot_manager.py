"""The stager's bookkeeping of the sample ring: grants, credits, leases, delivery.

Pure logic, no sockets, so every contract is testable with a fake clock.
Called only by the stager (consumer/stager/stager.py). It is the one writer of
the slots' state: every transition goes through :meth:`SlotManager._to`, which
also writes the slot's record into ``headers`` (the ring's SLOT_DTYPE array,
or any array of that dtype in tests), so the record the inspector reads always
equals the manager's view. Plan positions are consumer/stager/plan.py's.

Exactly once (contract 3). Each position is granted, possibly again after its
lease expired, until it is READY or SKIPPED; a READY is accepted only for the
slot's current generation from its grantee, so a late READY is dropped and
counted. Each position leaves :meth:`SlotManager.pop_events` exactly once.

Deterministic order. Events leave in plan order; READY slots wait in a reorder
window. Grants are limited to ``n_slots - 1 - fenced`` positions past the
oldest unfinished one, so the oldest one always finds a free slot and the
window can never deadlock on a stalled producer.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import numpy as np

from consumer.stager.order import PlanOrder
from consumer.stager.plan import EpochPlan, Event
from consumer.stager.producer_book import ProducerBook
from consumer.stager.state import Producer, Slot
from shared.ring import SLOT_DTYPE, SlotState


class SlotManager(ProducerBook):
    """Owns the free list, grants with leases, reclaim, and ordered delivery."""

    def __init__(
        self,
        plan: EpochPlan,
        n_slots: int,
        lease_s: float,
        max_attempts: int,
        deterministic: bool,
        hostname: str,
        clock: Callable[[], float] = time.monotonic,
        started: Callable[[int], bool] | None = None,
        headers: np.ndarray | None = None,
        max_credits: int = 16,
    ) -> None:
        """started(slot): did its local producer begin that sample (the stager reads the
        slot header)? Only begun samples count against ring.max_item_attempts when a
        producer dies; without it, each producer's oldest grant does. headers: where
        each slot's record is written (SLOT_DTYPE [n_slots]); max_credits: most grants
        one producer may hold (producers.credits)."""
        self.plan = plan
        self.attach_headers(headers if headers is not None else np.zeros(n_slots, SLOT_DTYPE))
        self.max_credits = max_credits
        self.turn = 0  # rotates which producer is granted first
        self.n_joined = 0
        self.started = started
        self.n_slots = n_slots
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.deterministic = deterministic
        self.hostname = hostname
        self.clock = clock
        self.slots = [Slot() for _ in range(n_slots)]
        self.free_slots: collections.deque[int] = collections.deque(range(n_slots))
        self.n_fenced = 0
        self.producers: dict[bytes, Producer] = {}
        self.order = PlanOrder(plan, deterministic)
        self.known_bad = self.order.known_bad
        self._counters = dict.fromkeys(
            ("grants", "ready", "reclaimed", "restarts", "fences_lifted", "torn"), 0
        )
        self.zombies: dict[bytes, Producer] = {}
        self.names_seen: set[str] = set()
        self.reset(0)
        for k in range(n_slots):
            self._to(k, SlotState.FREE)  # the headers start as our view: FREE, no item

    # ------------------------------------------------------------ plan cursor
    def reset(self, position: int) -> None:
        """Start delivering at `position` (a consumer's cursor). Slots in flight are
        fenced until their producer speaks again; READY slots are dropped."""
        for k, slot in enumerate(self.slots):
            if slot.state == SlotState.GRANTED:
                self._fence_or_free(k)
            elif slot.state == SlotState.READY:
                self._free(k)
        for producer in self.producers.values():
            if producer.slots:
                producer.stalled = True  # its queued grants are void: it must HELLO again
            producer.slots.clear()
        self.order.reset(position)

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

    # ------------------------------------------------------------ grants
    def credit(self, ident: bytes, n: int) -> None:
        """The producer asks for n more grants; it never holds more than max_credits."""
        producer = self.producers[ident]
        producer.credits = min(producer.credits + max(0, n), self.max_credits)

    def share(self) -> int:
        """Most grants one producer may hold, so none holds the slots the others need
        (producers that asked for nothing, or must say HELLO again, do not count)."""
        working = sum(not p.stalled and bool(p.credits or p.slots) for p in self.producers.values())
        fair = (self.n_slots - 1) // max(1, working)
        return max(1, min(self.max_credits, fair))

    def grant_round(self) -> dict[bytes, list[tuple[int, int, int, int]]]:
        """What each producer is granted now, up to its credits and its fair share; the
        producer served first rotates so none is always last."""
        order = list(self.producers)
        if not order:
            return {}
        self.turn = (self.turn + 1) % len(order)
        share, out = self.share(), {}
        for ident in order[self.turn :] + order[: self.turn]:
            grants = []
            while len(self.producers[ident].slots) < share and (g := self.grant(ident)):
                grants.append(g)
            if grants:
                out[ident] = grants
        return out

    def grant(self, ident: bytes) -> tuple[int, int, int, int] | None:
        """Next (slot, generation, item, position) for this producer, or None."""
        producer = self.producers.get(ident)
        if producer is None or producer.credits <= 0 or producer.stalled:
            return None
        free = self._free_slot()
        position = self.order.next_position(self._window()) if free is not None else None
        if position is None:
            return None
        slot = self.slots[free]
        slot.generation += 1
        slot.position, slot.item = position, self.plan.item_at(position)
        slot.producer, slot.t_granted, slot.t_granted_wall = ident, self.clock(), time.time()
        slot.owner_index = producer.index
        self._to(free, SlotState.GRANTED)
        producer.credits -= 1
        producer.slots.add(free)
        self.order.in_flight[position] = free
        self._counters["grants"] += 1
        return free, slot.generation, slot.item, position

    def _free_slot(self) -> int | None:
        return self.free_slots[0] if self.free_slots else None

    def _to(self, k: int, state: SlotState) -> None:
        """Every slot change ends here: it keeps the free list and counts, and writes the
        slot's record (callers set generation, item and owner first)."""
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
        col["state"][k], col["generation"][k], col["item"][k] = state, slot.generation, slot.item
        col["epoch"][k] = self.plan.epoch_of(slot.position) if slot.position >= 0 else 0
        col["producer"][k], col["t_granted"][k] = slot.owner_index, slot.t_granted_wall

    def attach_headers(self, headers: np.ndarray) -> None:
        """Write slot records into `headers` (SLOT_DTYPE [n_slots]) from now on; the stager
        swaps in a private copy before it unmaps the ring, so no view outlives the map."""
        self.headers = headers
        fields = ("state", "generation", "item", "epoch", "producer", "t_granted")
        self._columns = {name: headers[name] for name in fields}

    def record(self, k: int) -> dict[str, int]:
        """The manager's view of slot k as it must read in the header (for tests)."""
        slot = self.slots[k]
        return {
            "state": int(slot.state),
            "generation": slot.generation,
            "item": slot.item,
            "epoch": self.plan.epoch_of(slot.position) if slot.position >= 0 else 0,
            "producer": slot.owner_index,
        }

    def _window(self) -> int:
        return max(1, self.n_slots - 1 - self.n_fenced)

    # ------------------------------------------------------------ results
    def owns(self, ident: bytes, slot: int, generation: int, item: int) -> bool:
        """Does this producer hold this grant right now?"""
        return self._owned(ident, slot, generation, item) is not None

    def _owned(self, ident: bytes, slot: int, generation: int, item: int) -> Slot | None:
        if not 0 <= slot < self.n_slots:
            return None
        s = self.slots[slot]
        if (
            s.state != SlotState.GRANTED
            or s.generation != generation
            or s.producer != ident
            or s.item != item
        ):
            return None
        return s

    def ready(self, ident: bytes, slot: int, generation: int, item: int) -> bool:
        """The grantee filled the slot; False (a stale READY) if it no longer owns it."""
        s = self._owned(ident, slot, generation, item)
        if s is None:
            return False
        self._to(slot, SlotState.READY)
        self._release_grant(ident, slot)
        self._counters["ready"] += 1
        self.order.finish(Event("sample", s.position, item, slot=slot))
        return True

    def skip(
        self,
        ident: bytes,
        slot: int,
        generation: int,
        item: int,
        reason: str,
        stage: str,
        path: str,
    ) -> bool:
        """The grantee cannot use this input; the slot is free again. The item is known
        bad for the rest of the run: later epochs skip it without a grant."""
        s = self._owned(ident, slot, generation, item)
        if s is None:
            return False
        self.known_bad[item] = (reason, stage)
        self._release_grant(ident, slot)
        position = s.position
        self._free(slot)
        self.order.finish(Event("skip", position, item, reason=reason, stage=stage, path=path))
        return True

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

    def torn(self, events: list[Event]) -> None:
        """events[0]'s rows changed after its READY was accepted (a stale writer the fence
        could not see): its slot gets a new generation and its position is granted again,
        uncharged; events[0:] go back to the plan order, to leave again in turn."""
        first = events[0]
        self.slots[first.slot].generation += 1
        self._free(first.slot)
        self._counters["torn"] += 1
        self.order.unpop(events)
        self.order.taken_back(first.position, first.item, False, self.max_attempts)

    def release(self, slot: int) -> None:
        """The stager copied a READY slot into a batch: it is free again."""
        self._free(slot)

    # ------------------------------------------------------------ internals
    def _release_grant(self, ident: bytes, slot: int) -> None:
        producer = self.producers.get(ident)
        if producer is not None:
            producer.slots.discard(slot)
            producer.samples += 1

    def _free(self, k: int) -> None:
        slot = self.slots[k]
        slot.position, slot.item, slot.producer, slot.owner_index = -1, -1, None, -1
        self._to(k, SlotState.FREE)

    def _reclaim(self, k: int, fence: bool, charged: bool = True) -> None:
        slot = self.slots[k]
        position, item, ident = slot.position, slot.item, slot.producer
        if ident is not None and ident in self.producers:
            self.producers[ident].slots.discard(k)
        slot.generation += 1
        if fence and ident is not None and ident in self.producers:
            slot.position = -1
            self._to(k, SlotState.FENCED)
            self.producers[ident].fenced.add(k)
        else:
            self._free(k)
        self._counters["reclaimed"] += 1
        self.order.taken_back(position, item, charged, self.max_attempts)
