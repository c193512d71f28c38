"""Who the producers are, what each may be granted, and who pays when a grant comes back.

A part of the stager (consumer/stager/stager.py) that holds the producer
records and decides; every grant and every place change it asks of the slot
ledger (consumer/stager/ledger.py), the one owner of place state.

A HELLO joins under a name that belongs to one process at a time (told apart by
the token it draws once), among the producers of its owner (a key, a tcp host, this
host's local pools: consumer/stager/peers.py): another key's producer of the same
name is another producer, and never takes this one's name nor keeps it out. A
grant's lease is its own, whatever its producer's heartbeats say
(docs/design.md#contract-2). A producer that may still be writing (alive, local) has
the slots taken back from it FENCED until it says HELLO again with an empty queue,
dies (a spare's also when FENCE_LEASES pass). Fair share: each account that works holds
at most the look-ahead's rows / working accounts grants, fewer once a backup beats it
(twins.py); a producer gets them as runs of up to half its producers.credits, so it
works one run while the stager answers the other.

Whose grants name rows of a batch (when producers compute the mels): a remote producer's
(the stager copies its frames in), and a local producer's whose process the kernel shows
us (its pid on the ipc socket, consumer/stager/peers.py): its death is then certain when
its pid is gone, which is what lifts a fence on a row. Others write spare places.

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

from ringfeed.consumer.stager.ledger import Grantee, Ledger
from ringfeed.consumer.stager.peers import PeerId, PeerTrust
from ringfeed.consumer.stager.state import Producer
from ringfeed.shared.memory.segments import pid_alive
from ringfeed.shared.run.stats_record import (
    MAX_LISTED_PRODUCERS,
    BookStats,
    ProducerStats,
    UnlistedProducers,
)
from ringfeed.shared.wire import protocol as p

# A producer silent this many leases, holding nothing, is forgotten (a lost remote host):
# it no longer shows in the stats or dilutes the others' fair share of the ring.
FORGET_LEASES = 3
# Producers known at once, at most: a flood of HELLOs cannot grow the stager's memory.
MAX_PRODUCERS = 1024


def same_name(producer: Producer, name: str, peer: PeerId) -> bool:
    """Is `name` of peer's owner the name this producer holds? (Names are per owner.)"""
    return producer.name == name and producer.peer.owner == peer.owner


class ProducerBook:
    """The producers of one stager: joins, credits, fair share, leases, zombies."""

    def __init__(
        self,
        slots: Ledger,
        hostname: str,
        max_credits: int,
        max_strikes: int,
        max_per_peer: int,
        in_place: bool = True,
    ) -> None:
        """max_credits: most grants one producer may hold (producers.credits);
        max_strikes, max_per_peer: ring.max_strikes, ring.max_producers_per_peer;
        in_place: local producers write samples where they are delivered (producers
        compute the mels: features.device producer)."""
        self.slots, self.hostname, self.max_credits = slots, hostname, max_credits
        self.in_place = in_place
        self.run_size = max(1, -(-max_credits // 2))
        self.lease_s, self.clock = slots.lease_s, slots.clock
        self.trust = PeerTrust(max_strikes, slots.capacity, slots.lease_s, slots.clock)
        self.max_per_peer = max_per_peer
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
        # Called with a local producer whose process is known dead, before its grants are
        # taken back: the intake takes what it wrote whole (consumer/stager/intake.py).
        self.on_death: Callable[[Producer], None] = lambda producer: None
        twins = slots.twins
        twins.may_write, twins.on_beaten = self.may_write, self.beaten
        twins.slowed = lambda peer: peer.account in self.trust.limits  # a cut grant limit

    # ------------------------------------------------------------ joining
    def lasting_refusal(self, ident: bytes, name: str, peer: PeerId) -> str:
        """'' or why this peer may not join now nor later (it is told, and exits): it is
        banned, or has ring.max_producers_per_peer producers joined."""
        why = self.trust.refusal(peer)
        if why:
            return why
        same = [pr for i, pr in self.producers.items() if pr.peer.account == peer.account]
        if len(same) >= self.max_per_peer and all(pr.name != name for pr in same):
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

    def hello(self, ident: bytes, msg: p.Hello, remote: bool, peer: PeerId) -> Producer:
        """A producer (re)joins (after :meth:`refusal` said yes). Its earlier registrations
        are dropped: a new process of the same name might still be racing an old one
        (fenced until that pid dies, FENCE_LEASES at most); the same process saying HELLO
        again has emptied its grant queue, so it writes nothing old."""
        self.count_return(msg, peer)
        # The same process gave its grants up (a lost link, a pause): back uncharged, or a
        # run whose link drops now and then would quarantine good items.
        if ident in self.producers:
            self.drop(ident, charge=False)
        for old_ident, old in list(self.producers.items()):
            if same_name(old, msg.name, peer):
                other = old.token != msg.token
                alive = other and self.alive(old)
                if other and self.local(old) and not alive:
                    self.on_death(old)
                charge = other and (self.local(old) or self.trust.testifies(old.peer))
                self.drop(old_ident, may_write=self.local(old) and alive, charge=charge)
        for old_ident, old in list(self.zombies.items()):
            if same_name(old, msg.name, peer) and old.token == msg.token:
                self.slots.done_with(old_ident)
                del self.zombies[old_ident]
        self.n_joined += 1
        if self.first_local_at is None and not remote and msg.host == self.hostname:
            self.first_local_at = self.clock()
        producer = Producer(
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
        self.producers[ident] = producer
        return producer

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
        return self.in_place and (producer.remote or producer.peer.pid > 0)

    @staticmethod
    def alive(producer: Producer) -> bool:
        """Does its process live? The kernel's pid where we have it, else its claim."""
        return pid_alive(producer.peer.pid or producer.pid)

    def may_write(self, ident: bytes) -> bool:
        """Might this producer still write the slots taken back from it (local)?"""
        return (producer := self.producers.get(ident)) is not None and self.local(producer)

    # ------------------------------------------------------------ grants
    def credit(self, ident: bytes, n: int) -> None:
        """The producer asks for n more grants; it never holds more than max_credits."""
        producer = self.producers[ident]
        producer.credits = min(producer.credits + max(0, n), self.max_credits)

    def allowances(self) -> tuple[dict[str, int], collections.Counter[str]]:
        """Most grants each working account may hold together (the look-ahead's rows split
        evenly between accounts, and at most the account's own limit), and how many of
        its producers work. Producers that asked for nothing, or must say HELLO again, do
        not count: a peer of 30 identities gets one account's allowance."""
        working = collections.Counter(
            pr.peer.account
            for ident, pr in self.producers.items()
            if not pr.stalled and bool(pr.credits or self.slots.holding(ident))
        )
        fair = self.slots.capacity // max(1, len(working))
        return {a: max(1, min(fair, self.trust.limit(a))) for a in working}, working

    def grant_round(self) -> dict[bytes, list[list[p.GrantEntry]]]:
        """The runs each producer is granted now, up to its credits, its part of its
        account's allowance, and the account's; the producer served first rotates so
        none is always last."""
        order = list(self.producers)
        if not order:
            return {}
        self.turn = (self.turn + 1) % len(order)
        allowance, working = self.allowances()
        held = collections.Counter()
        for ident, pr in self.producers.items():
            held[pr.peer.account] += self.slots.holding(ident)
        out = {}
        for ident in order[self.turn :] + order[: self.turn]:
            producer = self.producers[ident]
            account, runs = producer.peer.account, []
            if account not in allowance or producer.stalled:
                continue
            own = min(self.max_credits, -(-allowance[account] // working[account]))
            while True:
                n = min(
                    self.run_size,
                    producer.credits,
                    own - self.slots.holding(ident),
                    allowance[account] - held[account],
                )
                run = self.grant(producer, n, others=len(allowance) > 1)
                if not run:
                    break
                runs.append(run)
                held[account] += len(run)
            if runs:
                out[ident] = runs
        return out

    def grant(self, producer: Producer, n: int, others: bool = False) -> list[p.GrantEntry]:
        """A run of up to n places for this producer, as far as its credits allow, or []
        (none, or it must say HELLO again first). others: other peers work too (see
        Ledger.grant)."""
        n = min(n, producer.credits)
        if n <= 0 or producer.stalled:
            return []
        local = self.local(producer)
        who = Grantee(
            producer.ident,
            producer.index,
            producer.peer,
            self.rows_for(producer),
            others,
            local,
            local,
        )
        run = self.slots.grant(who, n)
        producer.credits -= len(run)
        return run

    def unsend(self, ident: bytes, places: list[int]) -> None:
        """A GRANT that could not be sent: its places and positions come back at once,
        uncharged, and the producer keeps the credits (it never saw them)."""
        producer = self.producers.get(ident)
        for k in places:
            if producer is not None and self.slots.holds(ident, k):
                self.slots.take_back(k, fence=False, charged=False)
                producer.credits += 1

    def reset(self, position: int) -> None:
        """A consumer starts the plan at `position`: grants in flight are void, and their
        producers get nothing until they say HELLO again with an empty queue."""
        may_write = lambda ident: ident in self.producers and not self.producers[ident].remote  # noqa: E731
        for ident in self.slots.restart(position, may_write):
            if ident in self.producers:
                self.producers[ident].stalled = True

    # ------------------------------------------------------------ leases
    def drop(self, ident: bytes, may_write: bool = False, charge: bool = True) -> None:
        """A producer left (BYE) or died: its grants come back now. may_write: it might
        still be alive and writing (a stopped process), so its slots stay fenced.
        charge: count the sample it was working on against its item (not for a BYE)."""
        producer = self.producers.pop(ident, None)
        if producer is None:
            return
        self.slots.take_back_all(ident, fence=may_write, charge=charge, local=not producer.remote)
        if may_write:
            self.zombies[ident] = producer
        else:
            self.slots.done_with(ident)

    def revoke(self, ident: bytes, charge: bool = True) -> None:
        """Take back every grant of a live producer that may still hold them queued (an
        expired lease, a READY that had to be dropped): it gets REHELLO and no grant until
        it says HELLO again, which it does with an empty queue; its local slots stay
        FENCED until then, so it cannot write into a slot granted again."""
        producer = self.producers.get(ident)
        if producer is not None:
            producer.stalled = True
            fence = self.local(producer)
            self.slots.take_back_all(ident, fence, charge, local=not producer.remote)

    def expire(self) -> list[str]:
        """Leases are per grant: take back every grant older than lease_s, whatever its
        producer's heartbeats say, and drop local producers whose process is dead;
        returns the names of the producers concerned.

        Who pays: a producer silent for the whole lease is stuck on its current input,
        which is charged (revoke); a remote one's only if its peer testifies (peers.py).
        One that kept talking lost that GRANT or its READY on the way: nothing is
        charged. Either way its peer is struck once 10 of its grants expired (a grant a
        backup beat and it never answered counts: twins.py) with fewer than a quarter as
        many samples delivered. A remote one then loses just the expired grants (a late
        READY is stale); a local one is revoked, fenced, until it says HELLO again."""
        now, names = self.clock(), []
        self.slots.lift_old_fences(now)
        for ident, peer in self.slots.twins.beaten.unanswered(now, self.lease_s):
            if peer is not None and (why := self.trust.held_expired(peer, 1)):
                self.strike(ident, why, peer)
            elif self.may_write(ident):  # as an expired grant: HELLO again, then unfenced
                self.revoke(ident, charge=False)
        self.zombies = {i: z for i, z in self.zombies.items() if self.slots.fences(i)}
        for ident, producer in list(self.producers.items()):
            silent_s = now - producer.last_seen
            if self.local(producer) and not self.alive(producer):
                names.append(producer.name)
                self.on_death(producer)
                self.drop(ident)
            elif silent_s > FORGET_LEASES * self.lease_s and not self.slots.holding(ident):
                # A lost host: forget it. A local one that may live keeps its fences.
                alive = self.local(producer) and self.alive(producer)
                self.drop(ident, may_write=alive, charge=False)
                self.remember(ident, producer.name)
            elif expired := self.slots.expired(ident, now):
                names.append(producer.name)
                self._expire(ident, producer, expired, silent_s)
        return names

    def remember(self, ident: bytes, name: str) -> None:
        """A producer forgotten for silence: its late messages are counted as such."""
        self.forgotten[ident] = name
        self.n_forgotten += 1
        if len(self.forgotten) > MAX_PRODUCERS:
            del self.forgotten[next(iter(self.forgotten))]

    def _expire(self, ident: bytes, producer: Producer, expired: list[int], silent_s: float):
        """Who pays for leases that expired: see expire()."""
        peer = producer.peer
        if why := self.trust.held_expired(peer, len(expired)):
            self.strike(ident, why)  # its grants back uncharged; banned at max_strikes
            return
        if silent_s > self.lease_s:  # its item is charged: by a remote peer, if it testifies
            self.revoke(ident, charge=self.local(producer) or self.trust.testifies(peer))
            return
        self.trust.expired_while_talking(peer.account, self.account_holding(peer.account))
        if producer.remote:
            for k in expired:
                self.slots.take_back(k, fence=False, charged=False)
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
        """A backup beat a grant of this producer (twins.py): its account holds fewer."""
        if peer is not None:
            self.trust.beaten(peer.account, self.account_holding(peer.account))

    def account_holding(self, account: str) -> int:
        """Grants the producers of this account hold now."""
        return sum(
            self.slots.holding(i) for i, pr in self.producers.items() if pr.peer.account == account
        )

    def delivered(self, producer: Producer) -> None:
        """A sample of this producer was accepted."""
        producer.samples += 1
        self.trust.delivered(producer.peer)

    def reap_zombies(self) -> None:
        """Free the fenced places of dropped producers whose process has since died."""
        for ident, producer in list(self.zombies.items()):
            if not self.alive(producer):
                self.slots.done_with(ident)
                del self.zombies[ident]

    # ------------------------------------------------------------ stats
    def stats(self) -> BookStats:
        """Its part of the stager's stats: the producers listed (working ones first, then
        by samples, at most MAX_LISTED_PRODUCERS), the rest summed, and its counters."""
        holding = self.slots.holding
        producers = sorted(
            self.producers.values(),
            key=lambda pr: (pr.stalled, not holding(pr.ident), -pr.samples),
        )
        shown, rest = producers[:MAX_LISTED_PRODUCERS], producers[MAX_LISTED_PRODUCERS:]
        unlisted = UnlistedProducers(
            count=len(rest),
            samples=sum(pr.samples for pr in rest),
            grants=sum(holding(pr.ident) for pr in rest),
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
                holding(pr.ident),
                self.slots.fences(pr.ident),
                round(now - pr.last_seen, 3),
                pr.stalled,
                dict(pr.work),
            )
            for pr in shown
        )
        return BookStats(rows, unlisted, counters)
