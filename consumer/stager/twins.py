"""Second grants of one plan position: backups of a position that holds the plan back,
and audits of what a remote producer says about an item.

A part of the slot ledger (consumer/stager/ledger.py), which makes the place changes;
these are the records and the rules. A position has at most two grants out (a twin),
the second always into a spare place; whichever way it ends, it finishes once and
leaves in one batch (docs/design.md#contract-3).

Backups. In a deterministic plan the oldest open position holds every later one back:
grants stop at the end of the look-ahead past it. A peer that holds it without
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
from ringfeed.shared.memory.ring import SlotState
from ringfeed.shared.wire import protocol as p

if TYPE_CHECKING:  # the ledger makes its TwinSlots: no import at run time
    from ringfeed.consumer.stager.ledger import Ledger
    from ringfeed.consumer.stager.state import Finished, Position

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
    """The two grants of one position. first: the place of the grant that came first (a
    backup: the holder's; an audit: the remote READY's, or -1 for a held SKIP); second:
    the other grant's place (a spare), -1 while an audit waits for a local producer."""

    kind: str
    first: int
    second: int = -1
    since: float = 0.0  # an audit: when it began waiting for a local producer
    ident: bytes = b""  # an audit: the remote producer whose answer it checks
    peer: PeerId | None = None
    name: str = ""
    skipped: Skipped | None = None
    entry: p.ReadyEntry | None = None  # an audit: the remote READY's, its rows at first

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
    """The twins of one ledger (``m``): when a second grant is due, and how a twin ends.
    Place changes go through the ledger's own methods."""

    def __init__(self, m: Ledger) -> None:
        self.m = m
        self.twinned: dict[int, Position] = {}  # position -> its Position, while a twin
        self.service = ServiceTimes()
        self.beaten = BeatenGrants()
        # Set by the producer book: may this producer still write its places (local,
        # alive)? and who is told that a backup beat a grant of this producer.
        self.may_write: Callable[[bytes], bool] = lambda ident: False
        self.on_beaten: Callable[[bytes, PeerId | None], None] = lambda ident, peer: None
        # ... and is this peer's share cut (beaten, or its grants expired while it talked)?
        self.slowed: Callable[[PeerId], bool] = lambda peer: False

    def reset(self) -> None:
        for pos in self.twinned.values():
            pos.twin = None
        self.twinned.clear()
        self.beaten.clear()

    def _twin(self, pos: Position, twin: Twin) -> None:
        pos.twin = twin
        self.twinned[pos.position] = pos

    def _untwin(self, pos: Position) -> Twin | None:
        twin, pos.twin = pos.twin, None
        self.twinned.pop(pos.position, None)
        return twin

    # ------------------------------------------------------------ second grants
    def oldest_open(self) -> Position | None:
        """The first unfinished position of the oldest batch being filled."""
        if not self.m.window:
            return None
        for pos in self.m.window[0].positions:
            if pos.done is None:
                return pos
        return None

    def backup_due(self, peer: PeerId | None) -> Position | None:
        """The oldest open position, if its one grant has been out long enough to be
        backed up, and at another account than `peer`'s; it becomes a twin."""
        m, pos = self.m, self.oldest_open()
        if pos is None or pos.twin is not None or len(pos.grants) != 1:
            return None
        holder = m.places[pos.grants[0]]
        if peer is None or holder.peer is None or holder.peer.account == peer.account:
            return None
        if m.clock() - holder.t_granted < self.wait_s(holder.peer):
            return None
        self._twin(pos, Twin(BACKUP, pos.grants[0]))
        m.count("backups")
        return pos

    def wait_s(self, peer: PeerId | None) -> float:
        """How long a grant of this peer may hold the plan back before a backup: as the
        service times say, or BACKUP_MIN_S for a peer already slowed (a slow walker
        beaten once would otherwise hold each new grant that long again)."""
        if peer is not None and self.slowed(peer):
            return BACKUP_MIN_S
        return self.service.backup_after(self.m.lease_s)

    def audit_due(self) -> Position | None:
        """A position whose audit waits for a local producer, or None."""
        for pos in self.twinned.values():
            if pos.twin is not None and pos.twin.kind == AUDIT and pos.twin.second < 0:
                return pos
        return None

    def granted(self, pos: Position, place: int) -> None:
        if pos.twin is not None:
            pos.twin.second = place

    def no_place(self, pos: Position) -> None:
        """A second grant was due but no spare place is free: a backup is called off (it
        is due again later); an audit waits on."""
        if pos.twin is not None and pos.twin.kind == BACKUP:
            self._untwin(pos)

    # ------------------------------------------------------------ how twins end
    def end(self, pos: Position, winner: int) -> None:
        """`winner` answered first: a backup's other grant is beaten (taken back)."""
        twin = pos.twin
        if twin is None or twin.kind != BACKUP:
            return
        self._untwin(pos)
        if winner == twin.second:
            self.m.count("backups_won")
        other = twin.other(winner)
        if other >= 0 and self.m.places[other].state == SlotState.GRANTED:
            self.beat(other)

    def beat(self, k: int) -> None:
        """Take back grant k, which a backup beat, and every other grant of its producer
        out as long as a backup waits (they would hold the plan back in turn), those
        uncharged and granted again elsewhere: fenced against a local producer until it
        answers late or dies; its late answers are stale; its peer is told."""
        m, place = self.m, self.m.places[k]
        ident, peer = place.holder, place.peer
        assert ident is not None
        self.beaten.add(ident, k, place.generation, Beaten(place.t_granted, peer))
        m.take_back(k, fence=self.may_write(ident), charged=False)
        due = m.clock() - self.wait_s(peer)
        for j in list(m.held.get(ident, ())):
            other = m.places[j]
            pos = m.by_position.get(other.position)
            if other.t_granted <= due and (pos is None or pos.twin is None):
                self.beaten.add(ident, j, other.generation, Beaten(other.t_granted, peer))
                m.take_back(j, fence=self.may_write(ident), charged=False)
        self.on_beaten(ident, peer)

    def late(self, ident: bytes, place: int, generation: int) -> bool:
        """A stale READY or SKIP came from this producer: True if a backup beat that
        grant."""
        return self.beaten.answered(ident, place, generation)

    def passed(self, ident: bytes, t_granted: float) -> None:
        """A local producer answered its grant made at t_granted. It works its grants in
        the order they came (producer/process/session.py), and drops a grant taken back without
        a word (producer/process/slot_writer.py taken_back): so it is done with each beaten grant
        made before this one. Each is unfenced and never charged as held (an honest
        local producer, beaten by a faster remote one, would otherwise be revoked, and
        struck, for grants it gave up as told)."""
        if ident not in self.beaten.of or not self.may_write(ident):
            return
        for place, generation in self.beaten.passed(ident, t_granted):
            self.m.beaten_answer(ident, place, generation)

    def split(self, pos: Position, k: int) -> bool:
        """Grant k came back unfinished: if it was one of a twin, the position goes on with
        the other grant (a backup), or its audit waits for a local producer again; True
        then (nothing goes back to the plan)."""
        twin = pos.twin
        if twin is None or k not in (twin.first, twin.second):
            return False
        if twin.kind == AUDIT:
            twin.second, twin.since = -1, self.m.clock()
            return True
        self._untwin(pos)
        return bool(pos.grants)

    # ------------------------------------------------------------ audits (audits.py)
    def hold(
        self,
        pos: Position,
        place: int,
        ident: bytes,
        peer: PeerId | None,
        name: str,
        skipped: Skipped | None = None,
        entry: p.ReadyEntry | None = None,
    ) -> None:
        """A remote producer's READY (rows waiting at `place`, answered already) or SKIP
        (`skipped`), held for an audit: its position is unfinished until a local
        producer answers."""
        if skipped is not None:
            self.m.free_place(place)
        self.end(pos, place)
        first = place if skipped is None else -1
        twin = Twin(AUDIT, first, -1, self.m.clock(), ident, peer, name, skipped, entry)
        self._twin(pos, twin)

    def audit_of(self, place: int) -> tuple[Position, Twin] | None:
        """The audit whose second grant `place` is (its answer goes to the intake)."""
        pos = self.m.by_position.get(self.m.places[place].position)
        twin = pos.twin if pos is not None else None
        if twin is None or twin.kind != AUDIT or twin.second != place:
            return None
        return pos, twin

    def settle(self, pos: Position, how: Finished) -> None:
        """An audit ends with `how` (a sample at how.place, or a skip): the twin's other
        place is freed, the position finishes."""
        twin = self._untwin(pos)
        assert twin is not None
        for k in (twin.first, twin.second):
            if k >= 0 and k != how.place and self.m.places[k].state != SlotState.FREE:
                self.m.free_place(k)
        if how.kind == "skip":
            self.m.known_bad[how.item] = (how.reason, how.stage)
        self.m.finish(pos, how)

    def overdue(self, now: float, wait_s: float, not_before: float) -> list[Position]:
        """Audits that found no local producer for wait_s (counted from not_before at the
        earliest: when the first one joined), left for the intake."""
        return [
            pos
            for pos in self.twinned.values()
            if pos.twin is not None
            and pos.twin.kind == AUDIT
            and pos.twin.second < 0
            and now - max(pos.twin.since, not_before) > wait_s
        ]

    def retry(self, pos: Position) -> None:
        """A held SKIP nobody checked: the position is granted again, uncharged, to a peer
        of another account if one works."""
        twin = self._untwin(pos)
        account = twin.peer.account if twin is not None and twin.peer is not None else ""
        self.m.again(pos, False, account)

    def unfinish(self, ban: str) -> int:
        """A peer was caught lying: its samples still waiting to leave are granted again,
        uncharged; returns how many."""
        n = 0
        for batch in self.m.window:
            for pos in batch.positions:
                how = pos.done
                if how is None or how.kind != "sample" or pos.twin is not None:
                    continue
                if how.peer is None or how.peer.ban != ban:
                    continue
                self.m.retry(pos)
                n += 1
        return n
