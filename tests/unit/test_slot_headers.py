"""The slot manager is the one writer of slot state: after every kind of event the
record in the ring's slot headers equals the manager's own view."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import uuid

import numpy as np
import pytest

from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.producer_book import ProducerBook
from ringfeed.consumer.stager.slot_manager import SlotManager
from ringfeed.shared.memory.ring import Ring, SlotState, segment_name, shown_state
from ringfeed.shared.wire import protocol as p
from tests.support.paths import REPO

HOST = "this-host"
PEER = PeerId("pool 1", "uid 0 pid 1")  # every producer here: one local pool
FIELDS = {"tokens": ((4,), np.dtype(np.int32))}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def ring():
    run_id = f"hdr-{uuid.uuid4().hex[:6]}"
    with Ring.create(segment_name(run_id, "samples"), FIELDS, 6, run_id, "samples") as r:
        yield r


def make(ring: Ring, clock: Clock, n_items: int = 40) -> ProducerBook:
    """A producer book over a slot manager writing into the ring's headers (``m.slots``)."""
    slots = SlotManager(
        Plan(Shuffle(n_items, seed=1), epochs=3),
        ring.n_slots,
        lease_s=5.0,
        max_attempts=2,
        deterministic=True,
        clock=clock,
        headers=ring.slots,
    )
    return ProducerBook(slots, HOST, max_credits=4, max_strikes=3, max_per_peer=64)


def record(slots: SlotManager, k: int) -> dict[str, int]:
    """The manager's view of slot k as it must read in the header."""
    slot = slots.slots[k]
    return {
        "state": int(slot.state),
        "generation": slot.generation,
        "item": slot.item,
        "epoch": slots.plan.epoch_of(slot.position) if slot.position >= 0 else 0,
        "producer": slot.owner_index,
    }


def assert_headers_match(m: ProducerBook, ring: Ring, after: str) -> None:
    for k in range(ring.n_slots):
        rec, view = ring.slots[k], record(m.slots, k)
        header = {key: int(rec[key]) for key in view}
        assert header == view, f"slot {k} after {after}"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def hello(name: str, pid: int) -> p.Hello:
    return p.Hello(name, pid, HOST, False, token=f"{name}-{pid}", place="", config={})


def join(m: ProducerBook, ident: bytes, pid: int) -> None:
    m.hello(ident, hello(ident.decode(), pid), remote=False, peer=PEER)
    m.credit(ident, 100)


def test_every_kind_of_event_leaves_header_equal_to_manager(ring: Ring) -> None:
    clock, me = Clock(), os.getpid()
    m = make(ring, clock)
    check = lambda what: assert_headers_match(m, ring, what)  # noqa: E731
    join(m, b"a", me)
    join(m, b"b", me)
    check("hello")
    grants = m.grant_round()
    assert grants and all(ring.slots[s]["state"] == SlotState.GRANTED for s, *_ in grants[b"a"])
    check("grant")
    slot, gen, item, _ = grants[b"a"][0]
    assert m.slots.ready(b"a", slot, gen, item)
    check("ready")
    for event in m.slots.pop_events(10):
        if event.kind == "sample":
            m.slots.release(event.slot)
    check("taken into a batch")
    slot, gen, item, _ = grants[b"a"][1]
    assert m.slots.skip(b"a", slot, gen, item, "bad input", "audio", "")
    check("skip")
    clock.t += 10.0  # past the lease: b's grants are fenced (it is local and alive)
    m.expire()
    assert any(ring.slots[k]["state"] == SlotState.FENCED for k in range(ring.n_slots))
    check("lease expired (fence)")
    m.hello(b"b", hello("b", me), remote=False, peer=PEER)  # b says HELLO again: unfenced
    check("hello again (unfence)")
    m.credit(b"b", 100)
    m.grant_round()
    check("grant after unfence")
    m.drop(b"a", may_write=True)  # a stopped process: fenced, a zombie
    check("producer dropped (may write)")
    m.zombies[b"a"].pid = dead_pid()
    m.reap_zombies()
    check("reap")
    m.drop(b"b")
    check("producer dropped")
    join(m, b"c", me)
    m.grant_round()
    m.reset(7)  # a consumer restarts the plan: grants in flight are fenced
    check("reset")


def test_random_event_sequences_keep_header_equal_to_manager(ring: Ring) -> None:
    rng, clock, me = random.Random(3), Clock(), os.getpid()
    m = make(ring, clock)
    held: list[tuple[bytes, tuple[int, int, int, int]]] = []
    for step in range(600):
        ident = rng.choice([b"p0", b"p1", b"p2"])
        action = rng.choice(["hello", "grant", "ready", "skip", "pop", "tick", "drop", "reset"])
        if action == "hello":
            join(m, ident, me)
        elif action == "grant":
            held += [(i, g) for i, gs in m.grant_round().items() for g in gs]
        elif action in ("ready", "skip") and held:
            who, (slot, gen, item, _) = held.pop(rng.randrange(len(held)))
            if action == "ready":
                m.slots.ready(who, slot, gen, item)
            else:
                m.slots.skip(who, slot, gen, item, "bad", "audio", "")
        elif action == "pop":
            for event in m.slots.pop_events(rng.randint(0, 4)):
                if event.kind == "sample":
                    m.slots.release(event.slot)
        elif action == "tick":
            clock.t += rng.choice([0.5, 6.0])
            m.expire()
        elif action == "drop" and ident in m.producers:
            m.drop(ident, may_write=rng.random() < 0.5)
        elif action == "reset" and rng.random() < 0.1:
            m.reset(m.slots.cursor)
        assert_headers_match(m, ring, f"step {step} ({action})")


def test_shown_state_reads_the_producers_progress(ring: Ring) -> None:
    clock = Clock()
    m = make(ring, clock)
    join(m, b"a", os.getpid())
    slot, gen, _, _ = m.grant_round()[b"a"][0]
    rec = ring.slots[slot]
    assert shown_state(rec) is SlotState.GRANTED
    rec["writing_generation"] = gen
    assert shown_state(rec) is SlotState.WRITING
    rec["sealed_generation"] = gen
    assert shown_state(rec) is SlotState.READY
    assert int(rec["state"]) == SlotState.GRANTED  # the manager's record is untouched


def test_no_code_but_the_manager_writes_sample_slot_state() -> None:
    """The batch builder writes its own ring's state; nothing else writes any."""
    writes = re.compile(r"""\[\s*["']state["']\s*\]\s*(,[^=]*)?=[^=]""")
    allowed = {"consumer/stager/batch_builder.py"}
    offenders = []
    for folder in ("consumer", "producer", "shared", "scripts"):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel not in allowed and writes.search(path.read_text()):
                offenders.append(rel)
    assert offenders == []
