"""The stager's bookkeeping of the sample ring: plan, grants, leases, delivery.

Pure logic, no sockets and no shared memory, so every contract is testable
with a fake clock. Called only by the stager (consumer/stager.py).

Positions. The plan is the endless concatenation of epochs; plan position p is
epoch ``p // n_items`` and item ``permutation(seed, epoch)[p % n_items]``. A
cursor is one position, so resuming is O(1) (contract 4).

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
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from shared.ring import SlotState, pid_alive


@dataclass
class Producer:
    ident: bytes
    name: str
    pid: int
    host: str
    remote: bool
    last_seen: float
    credits: int = 0
    slots: set[int] = field(default_factory=set)
    # Slots taken back while this producer might still be writing them.
    fenced: set[int] = field(default_factory=set)
    samples: int = 0
    # The producer's own per-sample counters, from its last heartbeat (for the inspector).
    work: dict[str, int] = field(default_factory=dict)
    # Its grants were taken back (lease expired, or the plan restarted) while it may
    # still hold them queued: it gets nothing until it says HELLO again.
    stalled: bool = False


@dataclass
class Slot:
    state: SlotState = SlotState.FREE
    generation: int = 0
    position: int = -1
    item: int = -1
    producer: bytes | None = None
    t_granted: float = 0.0


@dataclass(frozen=True)
class Event:
    """A finished plan position: kind is 'sample' (slot holds it) or 'skip'."""

    kind: str
    position: int
    item: int
    slot: int = -1
    reason: str = ""


class EpochPlan:
    """Plan positions -> (epoch, item): a fresh permutation per epoch from the seed."""

    def __init__(self, n_items: int, seed: int, epochs: int = 0) -> None:
        if n_items <= 0:
            raise ValueError("the dataset has no usable items: check data.path and the quarantine")
        self.n_items = n_items
        self.seed = seed
        self.end = epochs * n_items if epochs > 0 else None
        self._perm: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm:
            if len(self._perm) > 4:
                self._perm.pop(min(self._perm))
            rng = np.random.default_rng([self.seed, epoch])
            self._perm[epoch] = rng.permutation(self.n_items)
        return self._perm[epoch]

    def item_at(self, position: int) -> int:
        epoch, index = divmod(position, self.n_items)
        return int(self.permutation(epoch)[index])

    def epoch_of(self, position: int) -> int:
        return position // self.n_items


class SlotManager:
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
    ) -> None:
        """started(slot): did its local producer begin that sample (the stager reads the
        slot header)? Only begun samples count against ring.max_item_attempts when a
        producer dies; without it, each producer's oldest grant does."""
        self.plan = plan
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
        self.counters = dict.fromkeys(
            ("grants", "ready", "delivered", "skipped", "reclaimed", "restarts"), 0
        )
        self.known_bad: dict[int, str] = {}
        self.zombies: dict[bytes, Producer] = {}
        self.names_seen: set[str] = set()
        self.reset(0)

    # ------------------------------------------------------------ plan cursor
    def reset(self, position: int) -> None:
        """Start delivering at `position` (a consumer's cursor). Slots in flight are
        fenced until their producer speaks again; READY slots are dropped."""
        for k, slot in enumerate(self.slots):
            if slot.state in (SlotState.GRANTED, SlotState.WRITING):
                self._fence_or_free(k)
            elif slot.state == SlotState.READY:
                self._free(k)
        for producer in self.producers.values():
            if producer.slots:
                producer.stalled = True  # its queued grants are void: it must HELLO again
            producer.slots.clear()
        self.next_grant = position
        self.next_event = position
        self.retry: list[int] = []
        self.attempts: dict[int, int] = {}
        self.finished: dict[int, Event] = {}
        self.in_flight: dict[int, int] = {}  # position -> slot

    @property
    def cursor(self) -> int:
        """The oldest position not yet handed out by pop_events."""
        return self.next_event

    def exhausted(self) -> bool:
        """True once every position of a finite plan has left pop_events."""
        return self.plan.end is not None and self.next_event >= self.plan.end

    # ------------------------------------------------------------ producers
    def hello(self, ident: bytes, name: str, pid: int, host: str, remote: bool) -> None:
        """A producer (re)joins. Its earlier registrations are dropped: a new process of the
        same name might still be racing an old one (fenced until that pid dies); the same
        process saying HELLO again has emptied its grant queue, so it writes nothing old."""
        if ident in self.producers:
            self.drop_producer(ident)
        for old_ident, old in list(self.producers.items()):
            if old.name == name:
                self.drop_producer(
                    old_ident, may_write=not old.remote and old.pid != pid and pid_alive(old.pid)
                )
        for old_ident, old in list(self.zombies.items()):
            if old.name == name and old.pid == pid:
                self._unfence(old)
                del self.zombies[old_ident]
        if name in self.names_seen:
            self.counters["restarts"] += 1
        self.names_seen.add(name)
        self.producers[ident] = Producer(ident, name, pid, host, remote, self.clock())

    def touch(self, ident: bytes) -> Producer | None:
        """Any message from a producer: it is alive. A stalled one keeps its slots fenced:
        it may still hold queued grants for them, until it says HELLO again."""
        producer = self.producers.get(ident)
        if producer is not None:
            producer.last_seen = self.clock()
        return producer

    def drop_producer(self, ident: bytes, may_write: bool = False, charge: bool = True) -> None:
        """A producer left (BYE) or died: reclaim its grants now. may_write: it might
        still be alive and writing (a stopped process), so its slots stay fenced.
        charge: count the sample it was working on against its item (not for a BYE)."""
        producer = self.producers.get(ident)
        if producer is None:
            return
        self._reclaim_all(producer, fence=may_write, charge=charge)
        if may_write:
            self.zombies[ident] = producer
        else:
            self._unfence(producer)
        del self.producers[ident]

    def expire(self) -> list[str]:
        """Reclaim the grants of producers silent for over lease_s or dead; returns names."""
        now, reclaimed = self.clock(), []
        for ident, producer in list(self.producers.items()):
            local = not producer.remote and producer.host == self.hostname
            if local and not pid_alive(producer.pid):
                reclaimed.append(producer.name)
                self.drop_producer(ident)
            elif producer.slots and now - producer.last_seen > self.lease_s:
                reclaimed.append(producer.name)
                producer.stalled = True
                self._reclaim_all(producer, fence=local)
        return reclaimed

    def _reclaim_all(self, producer: Producer, fence: bool, charge: bool = True) -> None:
        """Take back every grant of a producer. Only the sample it was working on counts as
        an attempt of that item: a producer killed with 16 grants queued did not fail on 16
        inputs (repeated SIGKILLs once skipped innocent items this way)."""
        slots = list(producer.slots)
        if not charge or not slots:
            charged: set[int] = set()
        elif self.started is not None and not producer.remote:
            charged = {k for k in slots if self.started(k)}
        else:
            charged = {min(slots, key=lambda k: self.slots[k].t_granted)}
        for k in slots:
            self._reclaim(k, fence, charged=k in charged)

    # ------------------------------------------------------------ grants
    def grant(self, ident: bytes) -> tuple[int, int, int, int] | None:
        """Next (slot, generation, item, position) for this producer, or None."""
        producer = self.producers.get(ident)
        if producer is None or producer.credits <= 0 or producer.stalled:
            return None
        free = self._free_slot()
        position = self._next_position() if free is not None else None
        if position is None:
            return None
        slot = self.slots[free]
        self._to(free, SlotState.GRANTED)
        slot.generation += 1
        slot.position, slot.item = position, self.plan.item_at(position)
        slot.producer, slot.t_granted = ident, self.clock()
        producer.credits -= 1
        producer.slots.add(free)
        self.in_flight[position] = free
        self.counters["grants"] += 1
        return free, slot.generation, slot.item, position

    def _free_slot(self) -> int | None:
        return self.free_slots[0] if self.free_slots else None

    def _to(self, k: int, state: SlotState) -> None:
        """Every slot state change goes through here, keeping the free list and counts."""
        old = self.slots[k].state
        if old == state:
            return
        if old == SlotState.FREE:
            self.free_slots.remove(k)  # O(1) in practice: grants take the head
        elif state == SlotState.FREE:
            self.free_slots.append(k)
        self.n_fenced += (state == SlotState.FENCED) - (old == SlotState.FENCED)
        self.slots[k].state = state

    def _next_position(self) -> int | None:
        while True:
            if self.retry:
                position = heapq.heappop(self.retry)
            else:
                position = self.next_grant
                if self.plan.end is not None and position >= self.plan.end:
                    return None
                if self.deterministic and position >= self.next_event + self._window():
                    return None
                self.next_grant += 1
            item = self.plan.item_at(position)
            if item in self.known_bad:
                self._finish(Event("skip", position, item, reason=self.known_bad[item]))
                continue
            return position

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
            s.state not in (SlotState.GRANTED, SlotState.WRITING)
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
        self.counters["ready"] += 1
        self.in_flight.pop(s.position, None)
        self._finish(Event("sample", s.position, item, slot=slot))
        return True

    def skip(self, ident: bytes, slot: int, generation: int, item: int, reason: str) -> bool:
        """The grantee cannot use this input; the slot is free again."""
        s = self._owned(ident, slot, generation, item)
        if s is None:
            return False
        self.known_bad[item] = reason
        self._release_grant(ident, slot)
        position = s.position
        self._free(slot)
        self.in_flight.pop(position, None)
        self._finish(Event("skip", position, item, reason=reason))
        return True

    def pop_events(self, max_samples: int) -> list[Event]:
        """Finished positions, in plan order when deterministic, at most max_samples
        of kind 'sample' (the caller's room in the batch it is building)."""
        out: list[Event] = []
        if self.deterministic:
            while self.next_event in self.finished:
                if self.finished[self.next_event].kind == "sample" and max_samples <= 0:
                    break
                event = self.finished.pop(self.next_event)
                max_samples -= event.kind == "sample"
                out.append(event)
                self.next_event += 1
        else:
            for position in sorted(self.finished):
                if self.finished[position].kind == "sample" and max_samples <= 0:
                    continue
                event = self.finished.pop(position)
                max_samples -= event.kind == "sample"
                out.append(event)
            oldest = min([*self.in_flight, *self.retry, self.next_grant, *self.finished])
            self.next_event = oldest
        for event in out:
            self.counters["delivered" if event.kind == "sample" else "skipped"] += 1
        return out

    def release(self, slot: int) -> None:
        """The stager copied a READY slot into a batch: it is free again."""
        self._free(slot)

    # ------------------------------------------------------------ internals
    def _finish(self, event: Event) -> None:
        self.attempts.pop(event.position, None)
        self.finished[event.position] = event

    def _release_grant(self, ident: bytes, slot: int) -> None:
        producer = self.producers.get(ident)
        if producer is not None:
            producer.slots.discard(slot)
            producer.samples += 1

    def _free(self, k: int) -> None:
        slot = self.slots[k]
        self._to(k, SlotState.FREE)
        slot.position, slot.item, slot.producer = -1, -1, None

    def _fence_or_free(self, k: int) -> None:
        slot = self.slots[k]
        slot.generation += 1
        producer = self.producers.get(slot.producer) if slot.producer is not None else None
        if producer is not None and not producer.remote:
            self._to(k, SlotState.FENCED)
            slot.position = -1
            producer.fenced.add(k)
        else:
            self._free(k)

    def _unfence(self, producer: Producer) -> None:
        for k in producer.fenced:
            if self.slots[k].state == SlotState.FENCED:
                self._free(k)
        producer.fenced.clear()

    def reap_zombies(self) -> None:
        """Free the fenced slots of dropped producers whose process has since died."""
        for ident, producer in list(self.zombies.items()):
            if not pid_alive(producer.pid):
                self._unfence(producer)
                del self.zombies[ident]

    def _reclaim(self, k: int, fence: bool, charged: bool = True) -> None:
        slot = self.slots[k]
        position, item, ident = slot.position, slot.item, slot.producer
        if ident is not None and ident in self.producers:
            self.producers[ident].slots.discard(k)
        slot.generation += 1
        if fence and ident is not None and ident in self.producers:
            self._to(k, SlotState.FENCED)
            slot.position = -1
            self.producers[ident].fenced.add(k)
        else:
            self._free(k)
        self.counters["reclaimed"] += 1
        self.in_flight.pop(position, None)
        attempts = self.attempts.get(position, 0) + charged
        self.attempts[position] = attempts
        if attempts >= self.max_attempts:
            reason = (
                f"lease expired {attempts} times (ring.max_item_attempts): its producers "
                "died or stalled on this input; check it or raise ring.lease_s"
            )
            self.known_bad[item] = reason
            self._finish(Event("skip", position, item, reason=reason))
        else:
            heapq.heappush(self.retry, position)
