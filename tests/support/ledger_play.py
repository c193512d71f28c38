"""The stager's slot ledger and producer book, played by hand on a fake clock, without
sockets or rings (tests of grants, answers, leases, fences, backups):

    m = book(n_items=40)                 # a ProducerBook over its Ledger (m.slots)
    join(m, b"a")                        # a local producer, its pid seen by the kernel
    for g in run(m, b"a"):               # one run of places, as its GRANT names them
        answer(m, b"a", g)               # its READY, as the intake takes it
    send_finished(m)                     # the batches the ledger finished, sent

Grants are the wire's entries (p.GrantEntry: what the producer reads); the ledger's
columns are read where a test checks its state (m.slots is the concrete Ledger here).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import NamedTuple

import numpy as np

from ringfeed.consumer.stager.ledger.face import SAMPLE, Run, Skip
from ringfeed.consumer.stager.ledger.table import Ledger, LedgerTerms
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.producer_book import BookTerms, ProducerBook
from ringfeed.shared.memory.ring import SlotState
from ringfeed.shared.wire import protocol as p

HOST = "this-host"
ROWS = 4  # a batch of the plain plan: 4 positions


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Done(NamedTuple):
    """How a position ended, as its batch was sent: a sample or a skip (its reason)."""

    position: int
    item: int
    kind: str
    reason: str = ""
    stage: str = ""


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
    terms = LedgerTerms(
        n_batch_slots=2 + lookahead + 1,
        rows_per_slot=ROWS,
        n_spares=spares,
        lookahead=lookahead,
        batch_rows=ROWS,
        lease_s=lease_s,
        max_attempts=attempts,
        deterministic=deterministic,
        default_shape=(ROWS, 8, 8),
    )
    plan = Plan(Shuffle(n_items, seed=seed), epochs=epochs)
    ledger = Ledger(plan=plan, terms=terms, clock=clock or Clock())
    book_terms = BookTerms(
        max_credits=credits,
        max_strikes=3,
        max_per_peer=64,
        in_place=True,
        lease_s=lease_s,
        capacity=ledger.capacity,
    )
    return ProducerBook(ledger=ledger, terms=book_terms, hostname=HOST, clock=ledger.clock)


def ledger_of(m: ProducerBook) -> Ledger:
    assert isinstance(m.slots, Ledger)
    return m.slots


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


def entries(run: Run | None) -> list[p.GrantEntry]:
    """A run as its GRANT names it to the producer."""
    if run is None:
        return []
    grant = p.Grant.of_run(
        run.generation,
        run.slot,
        run.shape,
        run.places.tolist(),
        run.items.tolist(),
        run.positions.tolist(),
    )
    return grant.entries()


def grant_round(m: ProducerBook) -> dict[bytes, list[list[p.GrantEntry]]]:
    """m.grant_round(), each run as its GRANT's entries."""
    return {ident: [entries(r) for r in runs] for ident, runs in m.grant_round().items()}


def place_of(m: ProducerBook, g: p.GrantEntry) -> int:
    """The ledger's number of a granted place."""
    ledger = ledger_of(m)
    return g.batch * ledger.R + g.place if g.batch >= 0 else ledger.n_rows + g.place


def begin(m: ProducerBook, g: p.GrantEntry) -> None:
    """Its producer starts writing g (its progress field, as a local producer writes it)."""
    records = ledger_of(m).records
    table = records.rows if g.batch >= 0 else records.spares
    table["writing_generation"][g.place + (g.batch * ROWS if g.batch >= 0 else 0)] = g.generation


def run(m: ProducerBook, ident: bytes, n: int = 16) -> list[p.GrantEntry]:
    """One run for this producer (its credits allow), as grant_round would make it."""
    return entries(m.grant(m.producers[ident], n))


def answer(m: ProducerBook, ident: bytes, g: p.GrantEntry) -> bool:
    """g's READY from ident, as the intake takes it: False if stale."""
    verdict = m.slots.check(ident, g.generation, [g.place], [g.item])
    assert not verdict.refused, verdict.refused
    lengths = np.ones((1, 2), np.int32)
    zeros = np.zeros(1, np.int64)
    done = m.slots.accept(verdict, verdict.owned, lengths, zeros, zeros)
    for holder, peer in done.beaten_holders:  # as the intake tells the book
        m.beaten(holder, peer)
    return bool(verdict.owned[0])


def send_finished(m: ProducerBook) -> list[Done]:
    """Every batch the ledger finished, in the order it hands them on; each sent (and
    freed by the consumer at once)."""
    out = []
    while (batch := m.slots.next_batch()) is not None:
        for position, item, kind in zip(
            batch.positions.tolist(), batch.items.tolist(), batch.kind.tolist(), strict=True
        ):
            if kind == SAMPLE:
                out.append(Done(position, item, "sample"))
            else:
                why = batch.skips[position]
                out.append(Done(position, item, "skip", why.reason, why.stage))
        n = int((batch.kind == SAMPLE).sum())
        generation = m.slots.sent(batch, n)
        assert m.slots.freed(batch.slot, generation)
    return out


def drain(m: ProducerBook, idents: list[bytes], rng: random.Random) -> list[Done]:
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
        if m.slots.progress().exhausted:
            return finished
    raise AssertionError("plan never finished")


def state(m: ProducerBook, g: p.GrantEntry) -> SlotState:
    return SlotState(int(ledger_of(m).p_state[place_of(m, g)]))


def skip(m: ProducerBook, ident: bytes, g: p.GrantEntry, reason: str) -> bool:
    """g's SKIP from ident, as the intake takes a local one: False if stale."""
    verdict = m.slots.check(ident, g.generation, [g.place], [g.item])
    assert not verdict.refused, verdict.refused
    if not verdict.owned[0]:
        return False
    m.slots.skip(verdict, Skip(reason, "audio"), "skip")
    return True


def retries(m: ProducerBook) -> list[int]:
    """The plan positions waiting to be granted again, in order."""
    return [position for position, _ in ledger_of(m).retries]
