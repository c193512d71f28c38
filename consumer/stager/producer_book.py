"""Who the producers are, and when their grants are taken back: the slot manager's
producer side (consumer/stager/slot_manager.py mixes it in).

A HELLO joins under a name that belongs to one process at a time (told apart by
the token it draws once); a grant's lease is its own, whatever its producer's
heartbeats say; a producer that may still be writing (alive, local) has its slots
FENCED, for FENCE_LEASES leases at most, since a pid proves nothing across PID
namespaces. The guarantee against a late write is the stager's check after
copying (consumer/stager/stager.py, Stager.take); fencing only saves the work.
"""

from __future__ import annotations

from consumer.stager.state import Producer
from shared.ring import SlotState
from shared.segments import pid_alive

# A producer silent this many leases, holding nothing, is forgotten (a lost remote host):
# it no longer shows in the stats or dilutes the others' fair share of the ring.
FORGET_LEASES = 3
# A fenced slot is free again after this many leases whatever its producer's pid says: a
# pid proves nothing across PID namespaces and a liar may name pid 1, and the stager's
# check after copying (seqlock, consumer/stager/stager.py) catches a late write anyway.
FENCE_LEASES = 4
# Producers known at once, at most: a flood of HELLOs cannot grow the stager's memory.
MAX_PRODUCERS = 1024


class ProducerBook:
    """Producer bookkeeping of SlotManager: joins, leases, fences."""

    def refusal(self, ident: bytes, name: str, token: str) -> str:
        """'' if this HELLO may join, else why not. A name belongs to one process at a
        time: the same process (same token) may say HELLO again on a new socket, another
        one gets the name only once its holder is dead or silent for a lease."""
        if ident not in self.producers and len(self.producers) >= MAX_PRODUCERS:
            return f"{len(self.producers)} producers already joined (the most one run takes)"
        for old_ident, old in self.producers.items():
            if old.name != name or old_ident == ident or old.token == token:
                continue
            dead = self._local(old) and not pid_alive(old.pid)
            if not dead and self.clock() - old.last_seen <= self.lease_s:
                return f"name {name!r} is taken by a live producer (pid {old.pid} on {old.host})"
        return ""

    def hello(
        self, ident: bytes, name: str, pid: int, host: str, remote: bool, token: str = ""
    ) -> None:
        """A producer (re)joins (after :meth:`refusal` said yes). Its earlier registrations
        are dropped: a new process of the same name might still be racing an old one
        (fenced until that pid dies, FENCE_LEASES at most); the same process saying HELLO
        again has emptied its grant queue, so it writes nothing old."""
        if ident in self.producers:
            self.drop_producer(ident)
        for old_ident, old in list(self.producers.items()):
            if old.name == name:
                alive = old.token != token and pid_alive(old.pid)
                self.drop_producer(old_ident, may_write=self._local(old) and alive)
        for old_ident, old in list(self.zombies.items()):
            if old.name == name and old.token == token:
                self._unfence(old)
                del self.zombies[old_ident]
        if name in self.names_seen:
            self._counters["restarts"] += 1
        elif len(self.names_seen) < MAX_PRODUCERS * 4:  # bounded, whoever says HELLO
            self.names_seen.add(name)
        now, self.n_joined = self.clock(), self.n_joined + 1
        self.producers[ident] = Producer(
            ident, name, pid, host, remote, now, self.n_joined - 1, token=token
        )

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
        """Leases are per grant: take back every grant older than lease_s, whatever its
        producer's heartbeats say, and drop local producers whose process is dead;
        returns the names of the producers concerned.

        Who pays: a producer silent for the whole lease is stuck on its current input,
        which is charged (revoke). One that kept talking while a grant expired lost that
        GRANT or its READY on the way: nothing is charged. A remote one then loses just
        the expired grants (it cannot write our memory, and a late READY is stale); a
        local one is revoked, fenced, until it says HELLO with an empty queue."""
        now, names = self.clock(), []
        self._lift_old_fences(now)
        for ident, producer in list(self.producers.items()):
            silent_s = now - producer.last_seen
            if self._local(producer) and not pid_alive(producer.pid):
                names.append(producer.name)
                self.drop_producer(ident)
                continue
            if silent_s > FORGET_LEASES * self.lease_s and not producer.slots:
                # A lost host: forget it. A local one that may live keeps its fences.
                alive = self._local(producer) and pid_alive(producer.pid)
                self.drop_producer(ident, may_write=alive, charge=False)
                continue
            expired = [k for k in producer.slots if now - self.slots[k].t_granted > self.lease_s]
            if not expired:
                continue
            names.append(producer.name)
            if silent_s > self.lease_s:
                self.revoke(ident)
            elif producer.remote:
                for k in expired:
                    self._reclaim(k, fence=False, charged=False)
            else:
                self.revoke(ident, charge=False)
        return names

    def revoke(self, ident: bytes, charge: bool = True) -> None:
        """Take back every grant of a live producer that may still hold them queued (an
        expired lease, a READY that had to be dropped): it gets REHELLO and no grant until
        it says HELLO again, which it does with an empty queue; its local slots stay
        FENCED until then, so it cannot write into a slot granted again."""
        producer = self.producers.get(ident)
        if producer is not None:
            producer.stalled = True
            self._reclaim_all(producer, fence=self._local(producer), charge=charge)

    def unsend(self, ident: bytes, slots: list[int]) -> None:
        """A GRANT that could not be sent: its slots and positions come back at once,
        uncharged, and the producer keeps the credits (it never saw them)."""
        producer = self.producers.get(ident)
        for k in slots:
            if producer is not None and self.holds(ident, k):
                self._reclaim(k, fence=False, charged=False)
                producer.credits += 1

    def _local(self, producer: Producer) -> bool:
        return not producer.remote and producer.host == self.hostname

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

    def _fence_or_free(self, k: int) -> None:
        slot = self.slots[k]
        slot.generation += 1
        producer = self.producers.get(slot.producer) if slot.producer is not None else None
        if producer is not None and not producer.remote:
            slot.position = -1
            self._to(k, SlotState.FENCED)
            producer.fenced.add(k)
        else:
            self._free(k)

    def _unfence(self, producer: Producer) -> None:
        for k in producer.fenced:
            if self.slots[k].state == SlotState.FENCED:
                self._free(k)
        producer.fenced.clear()

    def _lift_old_fences(self, now: float) -> None:
        """Free slots fenced for FENCE_LEASES leases: fencing saves work, it does not
        guarantee anything (the stager's check after copying does)."""
        for k, slot in enumerate(self.slots):
            if slot.state == SlotState.FENCED and now - slot.t_fenced > FENCE_LEASES * self.lease_s:
                for producer in (*self.producers.values(), *self.zombies.values()):
                    producer.fenced.discard(k)
                self._free(k)
                self._counters["fences_lifted"] += 1
        for ident, zombie in list(self.zombies.items()):
            if not zombie.fenced:
                del self.zombies[ident]

    def reap_zombies(self) -> None:
        """Free the fenced slots of dropped producers whose process has since died."""
        for ident, producer in list(self.zombies.items()):
            if not pid_alive(producer.pid):
                self._unfence(producer)
                del self.zombies[ident]
