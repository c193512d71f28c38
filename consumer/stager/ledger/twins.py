"""The records of second grants of one plan position: backups of a position that holds
the plan back, and audits of what a remote producer says about an item.

Records only; the slot ledger (consumer/stager/ledger/table.py) decides when a second
grant is due and how a twin ends, and makes every place change. A position has at
most two grants out (a twin), the second always into a spare place; whichever way it
ends, it finishes once and leaves in one batch (docs/design.md#contract-3).

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
unwritten, as a grant taken back is dropped), so they are never charged.

Audits: see consumer/stager/audits.py.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.ledger.face import Skip
from ringfeed.consumer.stager.peers import PeerId

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
class Twin:
    """The two grants of one position. first: the place of the grant that came first (a
    backup: the holder's; an audit: the remote READY's, or -1 for a held SKIP); second:
    the other grant's place (a spare), -1 while an audit waits for a local producer. An
    audit keeps what the remote producer said: its SKIP, or its READY's generation,
    lengths, checksum and marks (the rows wait at `first`), and who it was (holder:
    its number in the ledger's holder table)."""

    kind: str
    first: int
    second: int = -1
    since: float = 0.0  # an audit: when it began waiting for a local producer
    holder: int = -1
    peer: PeerId | None = None
    name: str = ""
    skipped: Skip | None = None
    generation: int = 0
    lengths: np.ndarray | None = None
    checksum: int = 0
    marks: int = 0

    def other(self, place: int) -> int:
        return self.second if place == self.first else self.first


class ServiceTimes:
    """Recent grant-to-READY times, and when a held position is due for a backup."""

    def __init__(self) -> None:
        self.times: collections.deque[float] = collections.deque(maxlen=SERVICE_SAMPLES)
        self.median_s: float | None = None
        self.n = 0

    def add(self, seconds: np.ndarray) -> None:
        """A run's answered grants' times (a median of 128 costs ~10 us: taken again
        every SERVICE_EVERY times, not per READY)."""
        before = self.n // SERVICE_EVERY
        self.times.extend(seconds.tolist())
        self.n += len(seconds)
        if self.n // SERVICE_EVERY != before:
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
    """Grants taken back because a backup beat them, until answered or their lease ends,
    by (producer, place, generation)."""

    def __init__(self) -> None:
        self.grants: dict[tuple[bytes, int, int], Beaten] = {}
        self.of: dict[bytes, set[tuple[int, int]]] = {}  # producer -> its (place, generation)

    def add(self, ident: bytes, place: int, generation: int, beaten: Beaten) -> None:
        self.grants[(ident, place, generation)] = beaten
        self.of.setdefault(ident, set()).add((place, generation))
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

    def answered(self, ident: bytes, place: int, generation: int) -> bool:
        """Its late answer came: True if it was a beaten grant of this producer."""
        return self._pop((ident, place, generation)) is not None

    def passed(self, ident: bytes, t_granted: float) -> list[tuple[int, int]]:
        """This producer's beaten grants made before t_granted (each once): (place,
        generation). Strictly before: one made at the same instant may come after it."""
        mine = self.of.get(ident, ())
        out = [k for k in mine if self.grants[(ident, *k)].t_granted < t_granted]
        for place, generation in out:
            self._pop((ident, place, generation))
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
