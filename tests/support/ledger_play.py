"""The stager's slot ledger and producer book, played by hand on a fake clock, without
sockets or rings (tests of grants, answers, leases, fences, backups):

    m = book(n_items=40)                 # a ProducerBook over its Ledger (m.slots)
    join(m, b"a")                        # a local producer, its pid seen by the kernel
    for g in run(m, b"a"):               # one run of places
        answer(m, b"a", g)               # its READY, as the intake takes it
    send_finished(m)                     # the batches the ledger finished, sent
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

from ringfeed.consumer.stager.ledger import Ledger
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.producer_book import ProducerBook
from ringfeed.consumer.stager.state import Finished
from ringfeed.shared.memory.ring import SlotState
from ringfeed.shared.wire import protocol as p

HOST = "this-host"
ROWS = 4  # a batch of the plain plan: 4 positions


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# Every producer of these tests: one local pool, its pid seen by the kernel (this one).
PEER = PeerId("pool 1", "uid 0 pid 1", os.getpid())


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def book(
    n_items=10,
    lookahead=2,
    deterministic=True,
    epochs=1,
    attempts=3,
    clock=None,
    spares=8,
    credits=16,
    lease_s=5.0,
    seed=7,
) -> ProducerBook:
    """A producer book over its ledger (``m.slots``), as the stager builds them: batch
    slots for 2 consumer batches, the look-ahead and one to move a batch to; batches of
    ROWS positions."""
    ledger = Ledger(
        Plan(Shuffle(n_items, seed=seed), epochs=epochs),
        2 + lookahead + 1,
        ROWS,
        spares,
        lookahead,
        ROWS,
        lease_s=lease_s,
        max_attempts=attempts,
        deterministic=deterministic,
        clock=clock or Clock(),
        default_shape=(ROWS, 8, 8),
    )
    return ProducerBook(ledger, HOST, max_credits=credits, max_strikes=3, max_per_peer=64)


def hello(name: str, pid: int) -> p.Hello:
    return p.Hello(name, pid, HOST, False, token=f"{name}-{pid}", place="", config={})


def peer_of(pid: int) -> PeerId:
    """The local pool's peer as the kernel shows a process of it with this pid."""
    return PeerId(PEER.account, f"uid 0 pid {pid}", pid)


def join(
    m: ProducerBook, ident: bytes, pid: int | None = None, credits: int = 100, name: str = ""
) -> None:
    pid = pid or os.getpid()
    m.hello(ident, hello(name or ident.decode(), pid), remote=False, peer=peer_of(pid))
    m.producers[ident].credits = credits


def begin(m: ProducerBook, g: p.GrantEntry) -> None:
    """Its producer starts writing g (its progress field, as a local producer writes it)."""
    m.slots.records[0 if g.batch >= 0 else 1]["writing_generation"][
        g.place + (g.batch * ROWS if g.batch >= 0 else 0)
    ] = g.generation


def run(m: ProducerBook, ident: bytes, n: int = 16) -> list[p.GrantEntry]:
    """One run for this producer (its credits allow), as grant_round would make it."""
    return m.grant(m.producers[ident], n)


def answer(m: ProducerBook, ident: bytes, g: p.GrantEntry) -> bool:
    """g's READY from ident, as the intake takes it: False if stale."""
    verdict = m.slots.answer(ident, g.generation, [g.place], [g.item])
    assert not verdict.refused, verdict.refused
    if not verdict.owned:
        return False
    (k,) = verdict.owned
    m.slots.answered(k)
    m.slots.ready(k, p.ReadyEntry(g.place, g.generation, g.item, [1, 1], 0, 0), ident, PEER)
    return True


def send_finished(m: ProducerBook) -> list[Finished]:
    """Every batch the ledger finished, in the order it hands them on; each sent (and
    freed by the consumer at once)."""
    out = []
    while (batch := m.slots.complete()) is not None:
        out += [pos.done for pos in batch.positions]
        n = sum(pos.done.kind == "sample" for pos in batch.positions)
        generation = m.slots.sent(batch, n)
        assert m.slots.freed(batch.slot, generation)
    return out


def drain(m: ProducerBook, idents: list[bytes], rng: random.Random) -> list[Finished]:
    """Grant runs to everyone, answer grants in random order, send finished batches,
    until the plan is exhausted."""
    finished, held = [], []
    for _ in range(10_000):
        for ident in idents:
            while g := run(m, ident):
                held += [(ident, e) for e in g]
        rng.shuffle(held)
        if held:
            ident, g = held.pop()
            assert answer(m, ident, g)
            m.credit(ident, 1)
        finished += send_finished(m)
        if m.slots.exhausted():
            return finished
    raise AssertionError("plan never finished")


def state(m: ProducerBook, g: p.GrantEntry) -> SlotState:
    return m.slots.places[m.slots.place_of(g)].state


def skip(m: ProducerBook, ident: bytes, g: p.GrantEntry, reason: str) -> bool:
    """g's SKIP from ident, as the intake takes a local one: False if stale."""
    verdict = m.slots.answer(ident, g.generation, [g.place], [g.item])
    assert not verdict.refused, verdict.refused
    if not verdict.owned:
        return False
    (k,) = verdict.owned
    pos = m.slots.answered(k)
    m.slots.skip(k, Finished("skip", pos.position, pos.item, reason=reason, stage="audio"))
    return True
