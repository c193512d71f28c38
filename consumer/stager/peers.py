"""Who stands behind a producer's socket, and what the stager holds against it.

A part of the stager's producer book (consumer/stager/producer_book.py). A
peer is known by what it cannot choose: on the ipc socket the kernel's
credentials of the connecting process (ZeroMQ's ``Peer-Address`` metadata
carries its uid and real pid; its parent is read from /proc), on the tcp socket
its CURVE public key (the ZAP handler names it in ``User-Id``), or its address
where no keys are configured. Three keys come of it: the account its fair
share of the ring is counted on (a key, a tcp host, or one local pool: every
worker of a pool has the same parent), the one a ban refuses (the key, the host, or the local
uid and pid: one buggy worker does not take its pool down), and the owner of
the producer names it uses (the key, the tcp host, or this host for every local
pool): a name is unique per owner, so one key cannot hold another's names (a key
that joined under an honest pool's names once kept that pool out for as long as it
heartbeat, 294 refused HELLOs, issue 35).

Strikes (docs/design.md#contract-10): whatever a peer sends that the stager
rejects costs a strike (undecodable messages: MALFORMED_PER_STRIKE to a strike);
``max_strikes`` of them within STRIKE_WINDOW_S ban its ban key for the rest of the
run. A peer whose grants keep expiring while it
talks has its grant limit halved (once a lease at most), raised by one per
sample it delivers (additive increase, multiplicative decrease), down to one.
An expiry is never a strike: a link that loses messages makes an honest peer
look exactly like one that takes grants and never answers, and banning it for
the run would stop a run over a bad cable. At a limit of one such a peer holds
one slot of its allowance, and the positions it held go to other peers (order.py).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

import zmq

log = logging.getLogger(__name__)

# Strikes count within this window; older ones are forgiven.
STRIKE_WINDOW_S = 600.0
# Peers remembered at once (strikes and limits); the oldest unbanned go first.
MAX_REMEMBERED = 4096
# Grants that expire at a peer (talking or silent: one that takes grants, falls silent
# and comes back holds as much), with fewer than a quarter as many samples delivered,
# that make its first strike for holding, once it has held grants for
# HOLD_MIN_LEASES leases; each further strike takes HOLD_MORE_EXPIRIES more. 30 mute
# identities of one key once held the plan back to 0.08 of its pace, never struck (issue
# 35). An honest link that loses 30 % of messages delivers about one sample per expired
# grant: only its first lease, when a lost GRANT of several slots may come before any
# READY, could look otherwise, and no strike is counted then.
HOLD_EXPIRIES_PER_STRIKE = 10
HOLD_MORE_EXPIRIES = 1
HOLD_MIN_LEASES = 2.0
# Undecodable messages from one peer that make a strike. A peer of another protocol
# version sends a handful (each answered REFUSED, and it exits); a flood sends thousands.
MALFORMED_PER_STRIKE = 10


@dataclass(frozen=True)
class PeerId:
    account: str  # whose fair share of the ring its grants count against
    ban: str  # what a ban refuses
    pid: int = 0  # the kernel's pid of a local peer (0: unknown, or remote)
    unseen: bool = False  # a local peer in a PID namespace we cannot see
    owner: str = "this host"  # whose producer names it uses: its key, its tcp host


def parent_pid(pid: int) -> int:
    """pid's parent from /proc, or 0 if it cannot be read (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def start_time(pid: int) -> str:
    """When pid started (clock ticks since boot, /proc), or '': a pid reused later by
    another process is another peer."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 :].split()[19].decode()
    except (OSError, ValueError, IndexError):
        return ""


def peer_of(frame: zmq.Frame, remote: bool) -> PeerId:
    """The peer behind a received frame (see the module docstring)."""
    if remote:
        host = str(frame.get("Peer-Address"))
        try:
            key = frame.get("User-Id")  # set by our ZAP handler: the CURVE public key
        except zmq.ZMQError:  # no keys configured: its address is all we know
            return PeerId(f"host {host}", f"host {host}", owner=f"host {host}")
        # One key may serve many hosts (a Ray cluster): each host is an account of its own.
        return PeerId(f"key {key} host {host}", f"key {key}", owner=f"key {key}")
    address = str(frame.get("Peer-Address"))  # "localhost:uid:gid:pid" over ipc
    try:
        _, uid, _, pid_text = address.rsplit(":", 3)
        pid = int(pid_text)
    except ValueError:  # no peer credentials on this platform
        return PeerId("local", f"local {address}")
    if pid == 0:  # in a PID namespace we cannot see: the desk adds what it claims
        return PeerId(f"uid {uid}, pid unseen", f"uid {uid}, pid unseen", unseen=True)
    ban = f"uid {uid} pid {pid} started {start_time(pid)}"
    return PeerId(f"pool {parent_pid(pid) or pid}", ban, pid)


def with_claims(peer: PeerId, pid: int, host: str) -> PeerId:
    """A peer whose pid we cannot see is banned by what it claims (it could lie, which
    spares it a ban, never its grants: each lie still takes them back)."""
    if not peer.unseen:
        return peer
    return PeerId(peer.account, f"{peer.ban}, claims pid {pid} on {host}", unseen=True)


@dataclass
class Hold:
    """What a peer held and delivered over the run (its ban key's)."""

    since: float  # when the stager first counted anything of it (its run clock)
    expired: int = 0  # its grants whose lease ran out, whether it talked or not
    samples: int = 0  # samples it delivered
    next_strike: int = HOLD_EXPIRIES_PER_STRIKE  # talking expiries of its next strike


class PeerTrust:
    """Strikes, bans and grant limits per peer."""

    def __init__(self, max_strikes: int, n_slots: int, lease_s: float, clock) -> None:
        """max_strikes: strikes in STRIKE_WINDOW_S that ban a peer (0: never)."""
        self.max_strikes, self.n_slots, self.lease_s = max_strikes, n_slots, lease_s
        self.clock = clock
        self.strikes: dict[str, collections.deque[float]] = {}
        self.banned: dict[str, str] = {}  # ban key -> why
        self.limits: dict[str, int] = {}  # account -> most grants it holds at once
        self.cuts: dict[str, float] = {}  # account -> when its limit was last cut
        self.malformed: dict[str, int] = {}  # ban key -> undecodable messages not struck yet
        self.holds: dict[str, Hold] = {}  # ban key -> what it held and delivered
        self.n_strikes = 0

    def refusal(self, peer: PeerId) -> str:
        why = self.banned.get(peer.ban)
        return f"{peer.ban} is refused for the rest of the run: {why}" if why else ""

    def strike(self, peer: PeerId, why: str) -> bool:
        """Count a strike; True if it bans the peer now."""
        self.n_strikes += 1
        if peer.ban in self.banned:
            return False
        now = self.clock()
        times = self.strikes.pop(peer.ban, collections.deque())
        times.append(now)
        while times and now - times[0] > STRIKE_WINDOW_S:
            times.popleft()
        self.strikes[peer.ban] = times  # re-inserted: the dict's order is by last strike
        self._forget(self.strikes)
        if not self.max_strikes or len(times) < self.max_strikes:
            return False
        self.banned[peer.ban] = f"{len(times)} strikes (ring.max_strikes), the last: {why}"
        log.warning("banned %s: %s", peer.ban, self.banned[peer.ban])
        self._forget(self.banned)
        return True

    def undecodable(self, peer: PeerId) -> bool:
        """Count an undecodable message of this peer; True when it makes a strike (every
        MALFORMED_PER_STRIKE th)."""
        n = self.malformed.pop(peer.ban, 0) + 1
        if n < MALFORMED_PER_STRIKE:
            self.malformed[peer.ban] = n  # re-inserted: the dict's order is by last one
            self._forget(self.malformed)
        return n >= MALFORMED_PER_STRIKE

    def _hold(self, peer: PeerId) -> Hold:
        record = self.holds.pop(peer.ban, None) or Hold(self.clock())
        self.holds[peer.ban] = record  # re-inserted: the dict's order is by last use
        self._forget(self.holds)
        return record

    def held_expired(self, peer: PeerId, n: int) -> str:
        """n grants of this peer expired: '' or why that is a strike now."""
        h = self._hold(peer)
        h.expired += n
        if (
            self.clock() - h.since < HOLD_MIN_LEASES * self.lease_s
            or h.expired < h.next_strike
            or 4 * h.samples >= h.expired
        ):
            return ""
        h.next_strike = h.expired + HOLD_MORE_EXPIRIES
        return (
            f"{h.expired} of its grants expired, {h.samples} samples delivered: it"
            " holds grants it does not fill (raise ring.lease_s if its samples take"
            " that long)"
        )

    def testifies(self, peer: PeerId) -> bool:
        """Does this peer's failure count against an item? Only once it has delivered
        samples, at least half as many as leases it let expire: a peer that holds and
        never delivers says nothing about items (one once had 400 innocent items
        quarantined for 'lease expired 3 times', issue 35)."""
        h = self.holds.get(peer.ban)
        return h is not None and h.samples > 0 and 2 * h.samples >= h.expired

    def limit(self, account: str) -> int:
        """Most grants the peer of this account may hold at once."""
        return self.limits.get(account, self.n_slots)

    def expired_while_talking(self, account: str, holding: int) -> None:
        """Grants of this peer (holding `holding` in all) expired though it kept talking:
        it may hold half as many (never fewer than one), cut at most once a lease."""
        now = self.clock()
        if now - self.cuts.get(account, -self.lease_s) < self.lease_s:
            return
        self.limits[account] = max(1, min(holding, self.limit(account)) // 2)
        self.cuts[account] = now
        self._forget(self.limits)
        self._forget(self.cuts)

    def beaten(self, account: str, holding: int) -> None:
        """A backup beat a grant of this peer (consumer/stager/ledger/twins.py): it may hold half
        as many grants (never fewer than one), at once: its share follows its pace."""
        self.limits[account] = max(1, min(holding, self.limit(account)) // 2)
        self._forget(self.limits)

    def delivered(self, peer: PeerId, n: int = 1) -> None:
        """n samples accepted: a grant more each, up to no limit of its own."""
        self._hold(peer).samples += n
        account = peer.account
        limit = self.limits.get(account)
        if limit is None:
            return
        if limit + n >= self.n_slots:
            del self.limits[account]
        else:
            self.limits[account] = limit + n

    @staticmethod
    def _forget(table: dict) -> None:
        while len(table) > MAX_REMEMBERED:
            del table[next(iter(table))]
