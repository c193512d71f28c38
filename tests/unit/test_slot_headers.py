"""The slot ledger is the one writer of place state: after every kind of event the record
of every place in the rings (the batch ring's rows, the spare ring's slots) equals the
ledger's own view."""

from __future__ import annotations

import os
import random
import re

from ringfeed.consumer.stager.ledger.table import Ledger
from ringfeed.consumer.stager.producer_book import ProducerBook
from ringfeed.shared.memory.ring import SlotState, shown_state
from tests.support.ledger_play import (
    Clock,
    answer,
    book,
    dead_pid,
    grant_round,
    hello,
    join,
    ledger_of,
    place_of,
    run,
    send_finished,
    skip,
)
from tests.support.paths import REPO


def make(clock: Clock) -> ProducerBook:
    """A producer book over a ledger of 40 items in 3 epochs, 2 attempts, credits 4."""
    return book(n_items=40, epochs=3, attempts=2, clock=clock, credits=4)


def record(ledger: Ledger, k: int) -> dict[str, int]:
    """The ledger's view of place k as it must read in its record."""
    position = int(ledger.p_pos[k])
    return {
        "state": int(ledger.p_state[k]),
        "generation": int(ledger.p_gen[k]),
        "item": int(ledger.p_item[k]),
        "epoch": ledger.plan.epoch_of(position) if position >= 0 else 0,
        "producer": int(ledger.p_index[k]),
    }


def the_record(ledger: Ledger, k: int):
    rows, spares = ledger.records.rows, ledger.records.spares
    return rows[k] if k < ledger.n_rows else spares[k - ledger.n_rows]


def assert_records_match(m: ProducerBook, after: str) -> None:
    ledger = ledger_of(m)
    for k in range(len(ledger.p_state)):
        view, rec = record(ledger, k), the_record(ledger, k)
        shown = {key: int(rec[key]) for key in view}
        if ledger.p_state[k] == SlotState.READY:  # a READY changes the state only
            assert shown["state"] == view["state"], f"place {k} after {after}"
            continue
        assert shown == view, f"place {k} after {after}"


def test_every_kind_of_event_leaves_the_record_equal_to_the_ledger() -> None:
    clock, me = Clock(), os.getpid()
    m = make(clock)
    check = lambda what: assert_records_match(m, what)  # noqa: E731
    join(m, b"a", me)
    join(m, b"b", me)
    check("hello")
    runs = grant_round(m)
    assert runs and all(
        the_record(ledger_of(m), place_of(m, g))["state"] == SlotState.GRANTED
        for g in runs[b"a"][0]
    )
    check("grant")
    first = runs[b"a"][0]
    assert answer(m, b"a", first[0])
    check("ready")
    skip(m, b"a", first[1], "bad input")
    check("skip")
    for g in first[2:]:
        answer(m, b"a", g)
    for g in runs[b"b"][0]:
        answer(m, b"b", g)
    send_finished(m)
    check("batch sent")
    clock.t += 10.0  # past the lease: what is held is fenced (local and alive)
    m.expire()
    assert (ledger_of(m).p_state == SlotState.FENCED).any()
    check("lease expired (fence)")
    m.hello(b"b", hello("b", me), remote=False, peer=m.producers[b"a"].peer)  # unfenced
    check("hello again (unfence)")
    m.credit(b"b", 100)
    m.grant_round()
    check("grant after unfence")
    m.drop(b"a", may_write=True)  # a stopped process: fenced, a zombie
    check("producer dropped (may write)")
    m.zombies[b"a"].pid = dead_pid()
    m.zombies[b"a"].peer = m.zombies[b"a"].peer.__class__("pool 1", "dead", m.zombies[b"a"].pid)
    m.reap_zombies()
    check("reap")
    m.drop(b"b")
    check("producer dropped")
    join(m, b"c", me)
    m.grant_round()
    m.reset(8)  # a consumer restarts the plan: grants in flight are fenced
    check("reset")


def test_random_event_sequences_keep_the_records_equal_to_the_ledger() -> None:
    rng, clock, me = random.Random(3), Clock(), os.getpid()
    m = make(clock)
    held = []
    for step in range(600):
        ident = rng.choice([b"p0", b"p1", b"p2"])
        action = rng.choice(["hello", "grant", "ready", "skip", "send", "tick", "drop", "reset"])
        if action == "hello":
            join(m, ident, me)
        elif action == "grant":
            held += [(i, g) for i, runs in grant_round(m).items() for r in runs for g in r]
        elif action in ("ready", "skip") and held:
            who, g = held.pop(rng.randrange(len(held)))
            if action == "ready":
                answer(m, who, g)
            else:
                skip(m, who, g, "bad")
        elif action == "send":
            send_finished(m)
        elif action == "tick":
            clock.t += rng.choice([0.5, 6.0])
            m.expire()
        elif action == "drop" and ident in m.producers:
            m.drop(ident, may_write=rng.random() < 0.5)
        elif action == "reset" and rng.random() < 0.1:
            m.reset(m.slots.progress().cursor)
        assert_records_match(m, f"step {step} ({action})")


def test_shown_state_reads_the_producers_progress() -> None:
    m = make(Clock())
    join(m, b"a", os.getpid())
    g = run(m, b"a")[0]
    rec = the_record(ledger_of(m), place_of(m, g))
    assert shown_state(rec) is SlotState.GRANTED
    rec["writing_generation"] = g.generation
    assert shown_state(rec) is SlotState.WRITING
    rec["sealed_generation"] = g.generation
    assert shown_state(rec) is SlotState.READY
    assert int(rec["state"]) == SlotState.GRANTED  # the ledger's record is untouched


def test_no_code_but_the_ledger_writes_place_or_batch_slot_state() -> None:
    writes = re.compile(r"""\[\s*["']state["']\s*\]\s*(,[^=]*)?=[^=]""")
    allowed = {"consumer/stager/ledger/table.py"}
    offenders = []
    for folder in ("consumer", "producer", "shared", "scripts"):
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel not in allowed and writes.search(path.read_text()):
                offenders.append(rel)
    assert offenders == []
