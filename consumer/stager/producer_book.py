"""Who the producers are, what each may be granted, and who pays when a grant comes back.

A part of the stager (consumer/stager/stager.py) that holds the producer records and
decides; every grant and every place change it asks of the slot ledger through its face
(consumer/stager/ledger/face.py), the one owner of place state, and it acts on what the
ledger's verbs return.

A HELLO joins under a name that belongs to one process at a time (told apart by
the token it draws once), among the producers of its owner (a key, a tcp host, this
host's local pools: consumer/stager/peers.py): another key's producer of the same
name is another producer, and never takes this one's name nor keeps it out. A
grant's lease is its own, whatever its producer's heartbeats say
(docs/design.md#contract-2). A producer that may still be writing (alive, local) has
the slots taken back from it FENCED until it says HELLO again with an empty queue,
dies (a spare's also when FENCE_LEASES pass). Fair share: each account that works holds
at most the look-ahead's rows / working accounts grants, fewer once a backup beats it
(consumer/stager/ledger/twins.py); a producer gets them as runs of up to half its
producers.credits, so it works one run while the stager answers the other.

Whose grants name rows of a batch (when producers compute the mels): a remote producer's
(the stager copies its frames in), and a local producer's whose process the kernel shows
us (its pid on the ipc socket, consumer/stager/peers.py): its death is then certain when
its pid is gone, which is what lifts a fence on a row. Others write spare places.

A local producer that dies leaves what it wrote whole: the ledger returns those places
(TakenBack.written) with each verb that drops it, and the caller hands them to the
intake (consumer/stager/intake.py salvage) before anything else happens.

Restarts and pauses. A HELLO under a known name from another process (another
token) is a restart. One from the same process after the stager had given it up
(silent a lease, or forgotten after FORGET_LEASES: it was SIGSTOPped, its VM
suspended, its link cut) is a pause, counted as such: nothing was lost but time.
What such a producer sent on its old socket before its HELLO is counted "late" (the
stager remembers the last MAX_PRODUCERS identities it forgot), not unknown-peer.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from ringfeed.consumer.stager.audits import AUDIT_GRACE_S
from ringfeed.consumer.stager.ledger.face import Answer, AuditCase, Grantee, Run, SlotLedger
from ringfeed.consumer.stager.peers import PeerId, PeerTrust
from ringfeed.shared.config import Config
from ringfeed.shared.memory.segments import pid_alive
from ringfeed.shared.run.stats_record import (
    MAX_LISTED_PRODUCERS,
    BookStats,
    ProducerStats,
    UnlistedProducers,
)
from ringfeed.shared.wire import protocol as p

# A fast producer's run is the rows it fills in about this long, at its pace: a cached
# sample of ~0.08 ms makes runs of a whole batch (capped by its share of the look-ahead),
# where one READY and one GRANT cost 30-90 us each way on a 2-core host (a zmq send wakes
# the other side's I/O thread); a cold one of ~2.5 ms keeps runs of credits / 2.
RUN_TARGET_S = 0.02
# A producer's pace is taken again over this many answered rows (its SKIPs come one by
# one between its READYs: an answer's own rows say nothing of the time before it), and
# each new figure moves it by PACE_WEIGHT (an exponential average).
PACE_ROWS = 8
PACE_WEIGHT = 0.3
# A producer silent this many leases, holding nothing, is forgotten (a lost remote host):
# it no longer shows in the stats or dilutes the others' fair share of the ring.
FORGET_LEASES = 3
# Producers known at once, at most: a flood of HELLOs cannot grow the stager's memory.
MAX_PRODUCERS = 1024


@dataclass
class Producer:
    """A producer the book knows: its identity (socket), name, pid and host as its HELLO
    said, whether it is remote, when it last spoke (the run clock), its number in the
    place records, its token (drawn by the process once: a HELLO with the same name and
    token is that process again), where a cluster engine runs it, its peer (who stands
    behind its socket, peers.py), its credits, samples accepted from it, its own
    counters (last heartbeat), whether it must say HELLO again before any grant
    (stalled: its grants were taken back while it may hold them queued), and the causes
    of its stages' verdicts (its HELLO's: each quarantine line its SKIPs make)."""

    ident: bytes
    name: str
    pid: int
    host: str
    remote: bool
    last_seen: float
    index: int = -1
    token: str = ""
    place: str = ""
    peer: PeerId = PeerId("local", "local")
    credits: int = 0
    samples: int = 0
    # Seconds a row takes it (None until PACE_ROWS were timed): its runs' size. Timed
    # from answer to answer while it held grants: busy_s over busy_rows so far.
    pace_s: float | None = None
    answered_at: float | None = None
    busy_s: float = 0.0
    busy_rows: int = 0
    work: dict[str, int] = field(default_factory=dict)
    stalled: bool = False
    causes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BookTerms:
    """The producer book's own configuration: producers.credits, ring.max_strikes,
    ring.max_producers_per_peer, whether local producers write samples where they are
    delivered (features.device producer), ring.lease_s, and the grants out at once
    (the look-ahead's rows, which fair shares split)."""

    max_credits: int
    max_strikes: int
    max_per_peer: int
    in_place: bool
    lease_s: float
    capacity: int

    @classmethod
    def of(cls, cfg: Config) -> BookTerms:
        return cls(
            max_credits=cfg.producers.credits,
            max_strikes=cfg.ring.max_strikes,
            max_per_peer=cfg.ring.max_producers_per_peer,
            in_place=cfg.features.device == "producer",
            lease_s=cfg.ring.lease_s,
            capacity=cfg.grants_in_flight,
        )


# What a local producer wrote whole before it died, for the intake: the producer and its
# READYs as they would have been (ledger/face.py TakenBack.written).
Salvage = list[tuple[Producer, tuple[Answer, ...]]]


@dataclass(frozen=True)
class Expiry:
    """What :meth:`ProducerBook.expire` did: the producers whose grants it took back,
    what dead producers left written, and the audits no local producer took in time."""

    names: list[str]
    salvage: Salvage
    audits: tuple[AuditCase, ...]


def keep_last(table: dict[bytes, str], ident: bytes, name: str) -> None:
    """Remember ident's name in table, the last MAX_PRODUCERS only (oldest go first)."""
    table[ident] = name
    if len(table) > MAX_PRODUCERS:
        del table[next(iter(table))]


def same_name(producer: Producer, name: str, peer: PeerId) -> bool:
    """Is `name` of peer's owner the name this producer holds? (Names are per owner.)"""
    return producer.name == name and producer.peer.owner == peer.owner


class ProducerBook:
    """The producers of one stager: joins, credits, fair share, leases, zombies."""

    def __init__(
        self,
        *,
        ledger: SlotLedger,
        terms: BookTerms,
        hostname: str,
        clock: Callable[[], float],
    ) -> None:
        """ledger: the stager's slot ledger; clock: the run clock (shared/run/run_clock.py)."""
        self.slots, self.terms, self.hostname, self.clock = ledger, terms, hostname, clock
        self.max_credits, self.lease_s = terms.max_credits, terms.lease_s
        self.run_size = max(1, -(-terms.max_credits // 2))
        self.trust = PeerTrust(terms.max_strikes, terms.capacity, terms.lease_s, clock)
        self.n_banned = 0
        self.producers: dict[bytes, Producer] = {}
        # Dropped producers that may still write: their fenced slots wait for their death.
        self.zombies: dict[bytes, Producer] = {}
        # (owner, name) -> the token of its last process
        self.tokens: dict[tuple[str, str], str] = {}
        self.n_joined = 0
        self.first_local_at: float | None = None  # when a local producer first joined
        self.turn = 0  # rotates which producer is granted first
        self.restarts = self.pauses = self.n_forgotten = 0
        # Forgotten for silence, oldest first: their late messages are no unknown peer's.
        self.forgotten: dict[bytes, str] = {}
        # Left with a BYE, oldest first: a BYE said again (its BYE_ACK lost) is answered.
        self.said_bye: dict[bytes, str] = {}

    def held(self, ident: bytes) -> int:
        return self.slots.holding(ident)[0]

    # ------------------------------------------------------------ joining
    def lasting_refusal(self, ident: bytes, name: str, peer: PeerId) -> str:
        """'' or why this peer may not join now nor later (it is told, and exits): it is
        banned, or has ring.max_producers_per_peer producers joined."""
        why = self.trust.refusal(peer)
        if why:
            return why
        same = [pr for i, pr in self.producers.items() if pr.peer.account == peer.account]
        if len(same) >= self.terms.max_per_peer and all(pr.name != name for pr in same):
            return (
                f"{peer.account} already has {len(same)} producers joined: raise "
                "ring.max_producers_per_peer if it really runs that many"
            )
        return ""

    def refusal(self, ident: bytes, name: str, token: str, peer: PeerId) -> str:
        """'' if this HELLO may join now, else why not. A name belongs to one process at
        a time among its owner's: the same process (same token) may say HELLO again on
        a new socket, another one gets the name only once its holder is dead or silent
        for a lease."""
        if ident not in self.producers and len(self.producers) >= MAX_PRODUCERS:
            return f"{len(self.producers)} producers already joined (the most one run takes)"
        for old_ident, old in self.producers.items():
            if not same_name(old, name, peer) or old_ident == ident or old.token == token:
                continue
            dead = self.local(old) and not self.alive(old)
            if not dead and self.clock() - old.last_seen <= self.lease_s:
                return (
                    f"name {name!r} of {peer.owner} is taken by its live producer"
                    f" (pid {old.pid} on {old.host}, {old.peer.account})"
                )
        return ""

    def hello(self, ident: bytes, msg: p.Hello, remote: bool, peer: PeerId) -> Salvage:
        """A producer (re)joins (after :meth:`refusal` said yes); returns what a dead
        predecessor of its name wrote whole. Its earlier registrations are dropped: a new
        process of the same name might still be racing an old one (fenced until that pid
        dies, FENCE_LEASES at most); the same process saying HELLO again has emptied its
        grant queue, so it writes nothing old."""
        self.count_return(msg, peer)
        salvage: Salvage = []
        # The same process gave its grants up (a lost link, a pause): back uncharged, or a
        # run whose link drops now and then would quarantine good items.
        if ident in self.producers:
            self.drop(ident, charge=False)
        for old_ident, old in list(self.producers.items()):
            if same_name(old, msg.name, peer):
                other = old.token != msg.token
                alive = other and self.alive(old)
                dead = other and self.local(old) and not alive
                charge = other and (self.local(old) or self.trust.testifies(old.peer))
                salvage += self.drop(
                    old_ident, may_write=self.local(old) and alive, charge=charge, dead=dead
                )
        for old_ident, old in list(self.zombies.items()):
            if same_name(old, msg.name, peer) and old.token == msg.token:
                self.slots.take_back(old_ident, done=True)
                del self.zombies[old_ident]
        self.n_joined += 1
        if self.first_local_at is None and not remote and msg.host == self.hostname:
            self.first_local_at = self.clock()
        self.producers[ident] = Producer(
            ident,
            msg.name,
            msg.pid,
            msg.host,
            remote,
            self.clock(),
            self.n_joined - 1,
            msg.token,
            msg.place,
            peer=peer,
            causes=dict(msg.causes),
        )
        return salvage

    def count_return(self, msg: p.Hello, peer: PeerId) -> None:
        """A known name says HELLO: a restart (another process), or a pause (the same
        process, which the stager had given up for silence); see the module docstring."""
        key = (peer.owner, msg.name)
        last = self.tokens.get(key)
        if last is None:
            if len(self.tokens) < MAX_PRODUCERS * 4:  # bounded, whoever says HELLO
                self.tokens[key] = msg.token
        elif last != msg.token:
            self.restarts += 1
            self.tokens[key] = msg.token
        else:
            now = self.clock()
            same = [pr for pr in self.producers.values() if pr.token == msg.token]
            if not same or all(now - pr.last_seen > self.lease_s for pr in same):
                self.pauses += 1

    def was_forgotten(self, ident: bytes) -> str:
        """The name of a producer forgotten for its silence under this identity, or ''."""
        return self.forgotten.get(ident, "")

    def left_with_bye(self, ident: bytes) -> bool:
        """Did a producer leave under this identity with a BYE (answered)?"""
        return ident in self.said_bye

    def touch(self, ident: bytes) -> Producer | None:
        """Any message from a producer: it is alive (which keeps no grant alive)."""
        producer = self.producers.get(ident)
        if producer is not None:
            producer.last_seen = self.clock()
        return producer

    def local(self, producer: Producer) -> bool:
        return not producer.remote and producer.host == self.hostname

    def rows_for(self, producer: Producer) -> bool:
        """May this producer's grants name rows of a batch (else spare places)? A remote
        one's rows are written by the stager (it copies the frames in); a local one
        writes its own, when the kernel shows us its pid: only then is its death
        certain, which lifts a fence on a row (module docstring)."""
        return self.terms.in_place and (producer.remote or producer.peer.pid > 0)

    @staticmethod
    def alive(producer: Producer) -> bool:
        """Does its process live? The kernel's pid where we have it, else its claim."""
        return pid_alive(producer.peer.pid or producer.pid)

    # ------------------------------------------------------------ grants
    def credit(self, ident: bytes, n: int) -> None:
        """The producer asks for n more grants; it never holds more than its cap."""
        producer = self.producers[ident]
        producer.credits = min(producer.credits + max(0, n), self.cap(producer))

    def run_rows(self, producer: Producer) -> int:
        """Rows of its next run: half producers.credits, or, when its pace makes that
        shorter than RUN_TARGET_S, what it fills in that long (a fast producer's runs
        grow; a slow one's never shrink below credits / 2: smaller runs of cold samples
        only cost messages, ~2x the stager's CPU a sample at runs of 2)."""
        if producer.pace_s is None:
            return self.run_size
        rows = round(RUN_TARGET_S / max(producer.pace_s, 1e-6))
        return max(self.run_size, min(self.terms.capacity, rows))

    def cap(self, producer: Producer) -> int:
        """The grants it may hold: producers.credits, or two of its runs when its pace
        makes them longer (it works one while the stager answers the other); its
        account's share of the look-ahead caps it in grant_round."""
        return max(self.max_credits, 2 * self.run_rows(producer))

    def allowances(self) -> tuple[dict[str, int], collections.Counter[str]]:
        """Most grants each working account may hold together (the look-ahead's rows split
        evenly between accounts, and at most the account's own limit), and how many of
        its producers work. Producers that asked for nothing, or must say HELLO again, do
        not count: a peer of 30 identities gets one account's allowance."""
        working = collections.Counter(
            pr.peer.account
            for ident, pr in self.producers.items()
            if not pr.stalled and bool(pr.credits or self.held(ident))
        )
        fair = self.terms.capacity // max(1, len(working))
        return {a: max(1, min(fair, self.trust.limit(a))) for a in working}, working

    def grant_round(self) -> dict[bytes, list[Run]]:
        """The runs each producer is granted now, up to its credits, its part of its
        account's allowance, and the account's; the producer served first rotates so
        none is always last."""
        order = list(self.producers)
        if not order:
            return {}
        self.turn = (self.turn + 1) % len(order)
        allowance, working = self.allowances()
        held: collections.Counter[str] = collections.Counter()
        for ident, pr in self.producers.items():
            held[pr.peer.account] += self.held(ident)
        slowed = frozenset(self.trust.limits)
        out = {}
        for ident in order[self.turn :] + order[: self.turn]:
            producer = self.producers[ident]
            account, runs = producer.peer.account, []
            if account not in allowance or producer.stalled:
                continue
            own = min(self.cap(producer), -(-allowance[account] // working[account]))
            while True:
                n = min(
                    self.run_rows(producer),
                    producer.credits,
                    own - self.held(ident),
                    allowance[account] - held[account],
                )
                run = self.grant(producer, n, others=len(allowance) > 1, slowed=slowed)
                if run is None:
                    break
                runs.append(run)
                held[account] += len(run)
            if runs:
                out[ident] = runs
        return out

    def grant(
        self, producer: Producer, n: int, others: bool = False, slowed: frozenset[str] = frozenset()
    ) -> Run | None:
        """A run of up to n places for this producer, as far as its credits allow, or
        None (none, or it must say HELLO again first). others: other peers work too;
        slowed: the accounts whose share is cut (ledger/face.py Grantee)."""
        n = min(n, producer.credits)
        if n <= 0 or producer.stalled:
            return None
        local = self.local(producer)
        who = Grantee(
            producer.ident,
            producer.index,
            producer.peer,
            self.rows_for(producer),
            others,
            local,
            local,
            slowed,
        )
        run = self.slots.grant(who, n)
        if run is not None:
            producer.credits -= len(run)
        return run

    def unsend(self, ident: bytes, run: Run) -> None:
        """A GRANT that could not be sent: its places and positions come back at once,
        uncharged, and the producer keeps the credits (it never saw them)."""
        taken = self.slots.take_back(ident, tuple(run.keys.tolist()))
        producer = self.producers.get(ident)
        if producer is not None:
            producer.credits += taken.grants

    def reset(self, position: int) -> None:
        """A consumer starts the plan at `position`: grants in flight are void, and their
        producers get nothing until they say HELLO again with an empty queue."""
        for ident in self.slots.restart(position):
            if ident in self.producers:
                self.producers[ident].stalled = True

    # ------------------------------------------------------------ leases
    def drop(
        self, ident: bytes, may_write: bool = False, charge: bool = True, dead: bool = False
    ) -> Salvage:
        """A producer left (BYE) or died: its grants come back now. may_write: it might
        still be alive and writing (a stopped process), so its slots stay fenced.
        charge: count the sample it was working on against its item (not for a BYE).
        dead: its process is gone; what it wrote whole is returned for the intake."""
        producer = self.producers.pop(ident, None)
        if producer is None:
            return []
        taken = self.slots.take_back(
            ident, fence=may_write, charge=charge, done=not may_write, salvage=dead
        )
        if may_write:
            self.zombies[ident] = producer
        return [(producer, taken.written)] if taken.written else []

    def revoke(self, ident: bytes, charge: bool = True) -> None:
        """Take back every grant of a live producer that may still hold them queued (an
        expired lease, a READY that had to be dropped): it gets REHELLO and no grant until
        it says HELLO again, which it does with an empty queue; its local slots stay
        FENCED until then, so it cannot write into a slot granted again."""
        producer = self.producers.get(ident)
        if producer is not None:
            producer.stalled = True
            self.slots.take_back(ident, fence=self.local(producer), charge=charge)

    def expire(self) -> Expiry:
        """Leases are per grant: take back every grant older than lease_s, whatever its
        producer's heartbeats say, and drop local producers whose process is dead.

        Who pays: a producer silent for the whole lease is stuck on its current input,
        which is charged (revoke); a remote one's only if its peer testifies (peers.py).
        One that kept talking lost that GRANT or its READY on the way: nothing is
        charged. Either way its peer is struck once 10 of its grants expired (a grant a
        backup beat and it never answered counts: ledger/twins.py) with fewer than a
        quarter as many samples delivered. A remote one then loses just the expired
        grants (a late READY is stale); a local one is revoked, fenced, until it says
        HELLO again. Audits wait a lease once a local producer has joined the run
        (counted from then), else AUDIT_GRACE_S (one may be starting beside the
        stager: consumer/stager/audits.py)."""
        now, names, salvage = self.clock(), [], []
        since = self.first_local_at
        wait_s = self.lease_s if since is not None else max(self.lease_s, AUDIT_GRACE_S)
        expired = self.slots.expire(now, wait_s, since or 0.0)
        revoked = set()
        for ident, peer in expired.beaten_unanswered:
            revoked.add(ident)
            if peer is not None and (why := self.trust.held_expired(peer, 1)):
                self.strike(ident, why, peer)
            elif (pr := self.producers.get(ident)) is not None and self.local(pr):
                self.revoke(ident, charge=False)  # as an expired grant: HELLO, then unfenced
            else:
                revoked.discard(ident)
        self.zombies = {i: z for i, z in self.zombies.items() if self.slots.holding(i)[1]}
        for ident, producer in list(self.producers.items()):
            silent_s = now - producer.last_seen
            if self.local(producer) and not self.alive(producer):
                names.append(producer.name)
                salvage += self.drop(ident, dead=True)
            elif silent_s > FORGET_LEASES * self.lease_s and not self.held(ident):
                # A lost host: forget it. A local one that may live keeps its fences.
                alive = self.local(producer) and self.alive(producer)
                self.drop(ident, may_write=alive, charge=False)
                self.remember(ident, producer.name)
            elif ident not in revoked and (late := expired.grants.get(ident)):
                names.append(producer.name)
                self._expire(ident, producer, late, silent_s)
        return Expiry(names, salvage, expired.audits)

    def remember(self, ident: bytes, name: str) -> None:
        """A producer forgotten for silence: its late messages are counted as such."""
        keep_last(self.forgotten, ident, name)
        self.n_forgotten += 1

    def left(self, ident: bytes, name: str) -> None:
        """A producer left with a BYE: a BYE it says again is answered again."""
        keep_last(self.said_bye, ident, name)

    def _expire(
        self, ident: bytes, producer: Producer, late: tuple[int, ...], silent_s: float
    ) -> None:
        """Who pays for leases that expired: see expire()."""
        peer = producer.peer
        if why := self.trust.held_expired(peer, len(late)):
            self.strike(ident, why)  # its grants back uncharged; banned at max_strikes
            return
        if silent_s > self.lease_s:  # its item is charged: by a remote peer, if it testifies
            self.revoke(ident, charge=self.local(producer) or self.trust.testifies(peer))
            return
        self.trust.expired_while_talking(peer.account, self.account_holding(peer.account))
        if producer.remote:
            self.slots.take_back(ident, late)
        else:
            self.revoke(ident, charge=False)

    # ------------------------------------------------------------ strikes
    def strike(self, ident: bytes, why: str, peer: PeerId | None = None) -> None:
        """The stager rejected what this producer sent: its grants come back uncharged
        (its lie says nothing about the items), and its peer gets a strike; at
        ring.max_strikes every producer of that peer goes, refused from now on.
        peer: who sent it, for a producer that has left since (a BYE dodges nothing)."""
        producer = self.producers.get(ident)
        if producer is not None:
            peer = producer.peer
            self.revoke(ident, charge=False)
        if peer is None or not self.trust.strike(peer, why):
            return
        self.n_banned += 1
        for other_ident, other in list(self.producers.items()):
            if other.peer.ban == peer.ban:
                self.drop(other_ident, may_write=self.local(other), charge=False)

    def beaten(self, ident: bytes, peer: PeerId | None) -> None:
        """A backup beat a grant of this producer (ledger/twins.py): its account holds fewer."""
        if peer is not None:
            self.trust.beaten(peer.account, self.account_holding(peer.account))

    def account_holding(self, account: str) -> int:
        """Grants the producers of this account hold now."""
        return sum(self.held(i) for i, pr in self.producers.items() if pr.peer.account == account)

    def delivered(self, producer: Producer, n: int = 1) -> None:
        """n samples of this producer were accepted: its pace, from the time it worked
        (answer to answer while it held grants: an idle producer's gap says nothing) over
        the rows it answered in it."""
        producer.samples += n
        self.trust.delivered(producer.peer, n)
        now = self.clock()
        if producer.answered_at is not None:
            producer.busy_s += now - producer.answered_at
            producer.busy_rows += n
            if producer.busy_rows >= PACE_ROWS:
                pace, last = producer.busy_s / producer.busy_rows, producer.pace_s
                producer.pace_s = pace if last is None else last + PACE_WEIGHT * (pace - last)
                producer.busy_s, producer.busy_rows = 0.0, 0
        producer.answered_at = now if self.held(producer.ident) else None

    def reap_zombies(self) -> None:
        """Free the fenced places of dropped producers whose process has since died."""
        for ident, producer in list(self.zombies.items()):
            if not self.alive(producer):
                self.slots.take_back(ident, done=True)
                del self.zombies[ident]

    # ------------------------------------------------------------ stats
    def stats(self) -> BookStats:
        """Its part of the stager's stats: the producers listed (working ones first, then
        by samples, at most MAX_LISTED_PRODUCERS), the rest summed, and its counters."""
        holding = {ident: self.slots.holding(ident) for ident in self.producers}
        producers = sorted(
            self.producers.values(),
            key=lambda pr: (pr.stalled, not holding[pr.ident][0], -pr.samples),
        )
        shown, rest = producers[:MAX_LISTED_PRODUCERS], producers[MAX_LISTED_PRODUCERS:]
        unlisted = UnlistedProducers(
            count=len(rest),
            samples=sum(pr.samples for pr in rest),
            grants=sum(holding[pr.ident][0] for pr in rest),
        )
        now = self.clock()
        counters = {
            "joined": self.n_joined,
            "restarts": self.restarts,
            "pauses": self.pauses,
            "forgotten": self.n_forgotten,
            "strikes": self.trust.n_strikes,
            "peers_banned": self.n_banned,
        }
        rows = tuple(
            ProducerStats(
                pr.name,
                pr.pid,
                pr.host,
                pr.place,
                pr.remote,
                pr.samples,
                holding[pr.ident][0],
                holding[pr.ident][1],
                round(now - pr.last_seen, 3),
                pr.stalled,
                dict(pr.work),
            )
            for pr in shown
        )
        return BookStats(rows, unlisted, counters)
