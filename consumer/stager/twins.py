"""Second grants of one plan position: backups of a position that holds the plan back,
and audits of what a remote producer says about an item.

A part of the slot manager (consumer/stager/slot_manager.py), which makes the slot
changes; these are the records and the rules. A position has at most two grants out
(a twin); whichever way it ends, it finishes once and leaves the plan order once
(docs/design.md#contract-3).

Backups. In a deterministic plan the oldest open position holds every later one back:
grants stop ``ring.slots - 1`` positions past it. A peer that holds it without
answering (30 mute identities) or answers just inside its lease (a slow walker) once
cut honest delivery to 0.08 and 0.07 of its pace (issue 35). So when grants stop and
the oldest open position has been out BACKUP_FACTOR times the recent median time from
grant to READY (never sooner than BACKUP_MIN_S, never later than half a lease), it is
granted again to a producer of another account. The first READY or SKIP finishes it;
the other grant is taken back at once (fenced against a local producer, which may
still be writing it, until it answers or dies) and its late answer is dropped as
stale. The beaten peer's account holds half as many grants from then on (its share
shrinks with its pace; each sample it delivers raises it by one again), and until its
limit has grown back its grants are backed up as soon as they hold the plan back. A
beaten grant that is never answered within its lease counts as an expired one for
holding (consumer/stager/peers.py), so a mute peer is struck as before; but a local
producer that answers a later grant is done with its beaten ones (it dropped them
unwritten, as a grant taken back is dropped), so they are never charged (``passed``).

Audits: see consumer/stager/audits.py.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.state import Event
from ringfeed.shared.memory.ring import SlotState

if TYPE_CHECKING:  # the slot manager makes its TwinSlots: no import at run time
    from ringfeed.consumer.stager.slot_manager import SlotManager

BACKUP = "backup"
AUDIT = "audit"
# A position out this many times the median grant-to-READY time is backed up: a
# producer's queue (producers.credits grants) makes its grants' times vary a few fold.
BACKUP_FACTOR = 4.0
# ... but never sooner than this (a cached sample takes ~0.2 ms; a blip is no holder).
BACKUP_MIN_S = 0.02
# Grant-to-READY times the median is taken over, and how often it is taken again.
SERVICE_SAMPLES = 128
SERVICE_EVERY = 16
# Beaten grants remembered until answered or their lease ends (bounded memory).
MAX_BEATEN = 4096


@dataclass
class Skipped:
    """A SKIP held for an audit: what the producer said of the item."""

    reason: str
    stage: str
    path: str
    cause: str


@dataclass
class Twin:
    """The two grants of one position. first: the slot of the grant that came first (a
    backup: the holder's; an audit: the remote READY's, or -1 for a held SKIP); second:
    the other grant's slot, -1 while an audit waits for a local producer."""

    kind: str
    first: int
    second: int = -1
    since: float = 0.0  # an audit: when it began waiting for a local producer
    ident: bytes = b""  # an audit: the remote producer whose answer it checks
    peer: PeerId | None = None
    name: str = ""
    skipped: Skipped | None = None

    def other(self, slot: int) -> int:
        return self.second if slot == self.first else self.first


class ServiceTimes:
    """Recent grant-to-READY times, and when a held position is due for a backup."""

    def __init__(self) -> None:
        self.times: collections.deque[float] = collections.deque(maxlen=SERVICE_SAMPLES)
        self.median_s: float | None = None
        self.n = 0

    def add(self, seconds: float) -> None:
        self.times.append(seconds)
        self.n += 1
        if self.n % SERVICE_EVERY == 0:  # a median of 128 costs ~10 us: not per READY
            self.median_s = statistics.median(self.times)

    def backup_after(self, lease_s: float) -> float:
        """Seconds a position may be out before it is backed up (half a lease until
        SERVICE_EVERY samples were timed)."""
        if self.median_s is None:
            return lease_s / 2
        return min(lease_s / 2, max(BACKUP_MIN_S, BACKUP_FACTOR * self.median_s))


@dataclass(frozen=True)
class Beaten:
    """A grant a backup beat: whose, and when it was granted (its lease runs on)."""

    t_granted: float
    peer: PeerId | None


class BeatenGrants:
    """Grants taken back because a backup beat them, until answered or their lease ends."""

    def __init__(self) -> None:
        self.grants: dict[tuple[bytes, int, int], Beaten] = {}
        self.of: dict[bytes, set[tuple[int, int]]] = {}  # producer -> its (slot, generation)

    def add(self, ident: bytes, slot: int, generation: int, beaten: Beaten) -> None:
        self.grants[(ident, slot, generation)] = beaten
        self.of.setdefault(ident, set()).add((slot, generation))
        while len(self.grants) > MAX_BEATEN:
            self._pop(next(iter(self.grants)))

    def _pop(self, key: tuple[bytes, int, int]) -> Beaten | None:
        beaten = self.grants.pop(key, None)
        if beaten is not None:
            mine = self.of[key[0]]
            mine.discard(key[1:])
            if not mine:
                del self.of[key[0]]
        return beaten

    def answered(self, ident: bytes, slot: int, generation: int) -> bool:
        """Its late answer came: True if it was a beaten grant of this producer."""
        return self._pop((ident, slot, generation)) is not None

    def passed(self, ident: bytes, t_granted: float) -> list[tuple[int, int]]:
        """This producer's beaten grants made before t_granted (each once): (slot,
        generation). Strictly before: one made at the same instant may come after it."""
        mine = self.of.get(ident, ())
        out = [k for k in mine if self.grants[(ident, *k)].t_granted < t_granted]
        for slot, generation in out:
            self._pop((ident, slot, generation))
        return out

    def unanswered(self, now: float, lease_s: float) -> list[tuple[bytes, PeerId | None]]:
        """Beaten grants whose lease ended unanswered (each once): (producer, peer)."""
        out = [(key, b) for key, b in self.grants.items() if now - b.t_granted > lease_s]
        for key, _ in out:
            self._pop(key)
        return [(key[0], b.peer) for key, b in out]

    def clear(self) -> None:
        self.grants.clear()
        self.of.clear()


class TwinSlots:
    """The twins of one slot manager (``m``): when a second grant is due, and how a twin
    ends. Slot changes go through the manager's take_slot, free_slot and answered."""

    def __init__(self, m: SlotManager) -> None:
        self.m = m
        self.by_position: dict[int, Twin] = {}
        self.service = ServiceTimes()
        self.beaten = BeatenGrants()
        # Set by the producer book: may this producer still write its slots (local,
        # alive)? and who is told that a backup beat a grant of this producer.
        self.may_write: Callable[[bytes], bool] = lambda ident: False
        self.on_beaten: Callable[[bytes, PeerId | None], None] = lambda ident, peer: None
        # ... and is this peer's share cut (beaten, or its grants expired while it talked)?
        self.slowed: Callable[[PeerId], bool] = lambda peer: False

    def reset(self) -> None:
        self.by_position.clear()
        self.beaten.clear()

    # ------------------------------------------------------------ second grants
    def backup_due(self, peer: PeerId | None) -> int | None:
        """The oldest open position, if its one grant has been out long enough to be
        backed up, and at another account than `peer`'s; it becomes a twin."""
        m = self.m
        position = m.order.cursor
        k = m.granted_at.get(position)
        if k is None or position in self.by_position:
            return None
        holder = m.slots[k]
        if peer is None or holder.peer is None or holder.peer.account == peer.account:
            return None
        if m.clock() - holder.t_granted < self.wait_s(holder.peer):
            return None
        self.by_position[position] = Twin(BACKUP, k)
        m.count("backups")
        return position

    def wait_s(self, peer: PeerId | None) -> float:
        """How long a grant of this peer may hold the plan back before a backup: as the
        service times say, or BACKUP_MIN_S for a peer already slowed (a slow walker
        beaten once would otherwise hold each new grant that long again)."""
        if peer is not None and self.slowed(peer):
            return BACKUP_MIN_S
        return self.service.backup_after(self.m.lease_s)

    def audit_due(self) -> int | None:
        """A position whose audit waits for a local producer, or None."""
        for position, twin in self.by_position.items():
            if twin.kind == AUDIT and twin.second < 0:
                return position
        return None

    def granted(self, position: int, slot: int) -> None:
        self.by_position[position].second = slot

    # ------------------------------------------------------------ how twins end
    def end(self, position: int, winner: int) -> None:
        """`winner` answered first: a backup's other grant is beaten (taken back)."""
        twin = self.by_position.pop(position, None)
        if twin is None:
            return
        if twin.kind == BACKUP and winner == twin.second:
            self.m.count("backups_won")
        other = twin.other(winner)
        if other >= 0 and self.m.slots[other].state == SlotState.GRANTED:
            self.beat(other)

    def beat(self, k: int) -> None:
        """Take back grant k, which a backup beat, and every other grant of its producer
        out as long as a backup waits (they would hold the plan back in turn), those
        uncharged and granted again elsewhere: fenced against a local producer until it
        answers late or dies; its late answers are stale; its peer is told."""
        m, slot = self.m, self.m.slots[k]
        ident, peer = slot.producer, slot.peer
        assert ident is not None
        self.beaten.add(ident, k, slot.generation, Beaten(slot.t_granted, peer))
        m.order.untwin(slot.item)
        m.take_slot(k, fence=self.may_write(ident))
        due = m.clock() - self.wait_s(peer)
        for j in list(m.held.get(ident, ())):
            s = m.slots[j]
            if s.t_granted <= due and s.position not in self.by_position:
                self.beaten.add(ident, j, s.generation, Beaten(s.t_granted, peer))
                m.reclaim(j, fence=self.may_write(ident), charged=False)
        self.on_beaten(ident, peer)

    def late(self, ident: bytes, slot: int, generation: int) -> bool:
        """A stale READY or SKIP came from this producer: True if a backup beat that
        grant; its producer is done with the slot, free again if still fenced for it."""
        if not self.beaten.answered(ident, slot, generation):
            return False
        self._unfence(ident, slot, generation)
        return True

    def passed(self, ident: bytes, t_granted: float) -> None:
        """A local producer answered its grant made at t_granted. It works its grants in
        the order they came (producer/session.py), and drops a grant taken back without
        a word (producer/slot_writer.py taken_back): so it is done with each beaten grant
        made before this one. Each is unfenced and never charged as held (an honest
        local producer, beaten by a faster remote one, would otherwise be revoked, and
        struck, for grants it gave up as told)."""
        if ident not in self.beaten.of or not self.may_write(ident):
            return
        for slot, generation in self.beaten.passed(ident, t_granted):
            self._unfence(ident, slot, generation)

    def _unfence(self, ident: bytes, slot: int, generation: int) -> None:
        """The producer is done with its beaten grant of slot: free if still fenced for it."""
        m = self.m
        if slot in m.fenced.get(ident, ()) and m.slots[slot].generation == generation + 1:
            m.fenced[ident].discard(slot)
            m.free_slot(slot)

    def split(self, position: int, k: int, item: int) -> bool:
        """Grant k came back unfinished: if it was one of a twin, the position goes on with
        the other grant (a backup), or its audit waits for a local producer again; True
        then (nothing goes back to the plan)."""
        twin = self.by_position.get(position)
        if twin is None or k not in (twin.first, twin.second):
            return False
        self.m.order.untwin(item)
        if twin.kind == AUDIT:
            twin.second, twin.since = -1, self.m.clock()
            return True
        del self.by_position[position]
        other = twin.other(k)
        if self.m.slots[other].state == SlotState.GRANTED:
            self.m.granted_at[position] = other
        return True

    # ------------------------------------------------------------ audits (audits.py)
    def hold(self, ident: bytes, slot: int, generation: int, item: int, name: str,
             skipped: Skipped | None = None) -> bool:  # fmt: skip
        """A remote producer's READY (rows waiting in the slot) or SKIP (`skipped`), held
        for an audit: its position is unfinished until a local producer answers."""
        m = self.m
        if not m.answered(ident, slot, generation, item):
            return False
        position, peer = m.slots[slot].position, m.slots[slot].peer
        if skipped is not None:
            m.free_slot(slot)
        self.end(position, slot)
        first = slot if skipped is None else -1
        self.by_position[position] = Twin(AUDIT, first, -1, m.clock(), ident, peer, name, skipped)
        return True

    def audit_of(self, slot: int) -> Twin | None:
        """The audit whose second grant `slot` is (its answer goes to the intake)."""
        twin = self.by_position.get(self.m.slots[slot].position)
        return twin if twin is not None and twin.kind == AUDIT and twin.second == slot else None

    def settle(self, event: Event) -> None:
        """An audit ends with `event` (a sample in event.slot, or a skip): the twin's other
        slot is freed, the position finishes."""
        m = self.m
        twin = self.by_position.pop(event.position)
        for k in (twin.first, twin.second):
            if k >= 0 and k != event.slot and m.slots[k].state != SlotState.FREE:
                m.free_slot(k)
        if twin.second >= 0:
            m.order.untwin(event.item)
        if event.kind == "skip":
            m.known_bad[event.item] = (event.reason, event.stage)
        m.order.finish(event)

    def overdue(self, now: float, wait_s: float, not_before: float) -> list[tuple[int, Twin]]:
        """Audits that found no local producer for wait_s (counted from not_before at the
        earliest: when the first one joined): (position, twin), left for the intake."""
        return [(position, twin) for position, twin in self.by_position.items()
                if twin.kind == AUDIT and twin.second < 0
                and now - max(twin.since, not_before) > wait_s]  # fmt: skip

    def retry(self, position: int) -> None:
        """A held SKIP nobody checked: the position is granted again, uncharged, to a peer
        of another account if one works."""
        twin = self.by_position.pop(position)
        account = twin.peer.account if twin.peer is not None else ""
        self.m.order.taken_back(position, self.m.plan.item_at(position), False,
                                self.m.max_attempts, account)  # fmt: skip

    def unfinish(self, ban: str) -> list[int]:
        """A peer was caught lying: its samples still waiting to leave are granted again,
        uncharged; returns their slots (freed)."""
        out, m = [], self.m
        for k, s in enumerate(m.slots):
            if s.state != SlotState.READY or s.peer is None or s.peer.ban != ban:
                continue
            if s.position in self.by_position:
                continue
            if m.order.unfinish(s.position, s.item, s.peer.account):
                m.free_slot(k)
                out.append(k)
        return out
