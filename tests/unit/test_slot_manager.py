"""The stager's slot bookkeeping: exactly once, leases, fencing, order. Fake clock."""

from __future__ import annotations

import os
import random
import subprocess
import sys

from ringfeed.consumer.stager.peers import PeerId, PeerTrust
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.producer_book import ProducerBook
from ringfeed.consumer.stager.slot_manager import SlotManager
from ringfeed.shared.memory.ring import SlotState
from ringfeed.shared.wire import protocol as p

HOST = "this-host"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# Every producer of these tests: one local pool.
PEER = PeerId("pool 1", "uid 0 pid 1")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def manager(
    n_items=10, n_slots=4, deterministic=True, epochs=1, attempts=3, clock=None, started=None
):
    """A producer book over its slot manager (``m.slots``), as the stager builds them."""
    slots = SlotManager(
        Plan(Shuffle(n_items, seed=7), epochs=epochs),
        n_slots,
        lease_s=5.0,
        max_attempts=attempts,
        deterministic=deterministic,
        clock=clock or Clock(),
        started=started,
    )
    return ProducerBook(slots, HOST, max_credits=16, max_strikes=3, max_per_peer=64)


def hello(name: str, pid: int) -> p.Hello:
    return p.Hello(name, pid, HOST, False, token=f"{name}-{pid}", place="", config={})


def join(m: ProducerBook, ident: bytes, pid: int | None = None, credits: int = 100) -> None:
    m.hello(ident, hello(ident.decode(), pid or os.getpid()), remote=False, peer=PEER)
    m.producers[ident].credits = credits


def drain(m: ProducerBook, idents: list[bytes], rng: random.Random, room: int = 1000) -> list:
    """Grant to everyone, finish grants in random order, collect events, until exhausted."""
    events, held = [], []
    for _ in range(10_000):
        for ident in idents:
            while (g := m.grant(ident)) is not None:
                held.append((ident, g))
        rng.shuffle(held)
        if held:
            ident, (slot, gen, item, _) = held.pop()
            assert m.slots.ready(ident, slot, gen, item)
        for event in m.slots.pop_events(room):
            events.append(event)
            if event.kind == "sample":
                m.slots.release(event.slot)
        if m.slots.exhausted():
            return events
    raise AssertionError("plan never finished")


def test_plan_is_a_permutation_per_epoch_and_reproducible() -> None:
    plan, again = Plan(Shuffle(50, seed=3)), Plan(Shuffle(50, seed=3))
    e0 = [plan.item_at(p) for p in range(50)]
    e1 = [plan.item_at(p) for p in range(50, 100)]
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    assert e0 == [again.item_at(p) for p in range(50)]


def test_deterministic_delivery_follows_the_plan_whatever_the_finish_order() -> None:
    m = manager(n_items=37, n_slots=6, epochs=2)
    join(m, b"a")
    join(m, b"b")
    events = drain(m, [b"a", b"b"], random.Random(1))
    assert [e.position for e in events] == list(range(74))
    assert [e.item for e in events] == [m.slots.plan.item_at(p) for p in range(74)]
    assert all(s.state == SlotState.FREE for s in m.slots.slots)


def test_unordered_mode_still_delivers_each_item_exactly_once() -> None:
    m = manager(n_items=40, n_slots=8, deterministic=False, epochs=1)
    join(m, b"a")
    events = drain(m, [b"a"], random.Random(2))
    assert sorted(e.item for e in events) == list(range(40))
    assert m.slots.cursor == 40


def test_expired_lease_fences_the_slot_and_grants_the_item_again() -> None:
    clock = Clock()
    m = manager(clock=clock)
    join(m, b"slow", credits=1)
    slot, gen, item, position = m.grant(b"slow")
    clock.t = 6.0  # past lease_s with no word from "slow" (alive: it is this process)
    assert m.expire() == ["slow"]
    assert m.slots.slots[slot].state == SlotState.FENCED  # it may still be writing
    join(m, b"fast", credits=1)
    slot2, gen2, item2, position2 = m.grant(b"fast")
    assert (item2, position2) == (item, position) and slot2 != slot
    assert m.slots.ready(b"fast", slot2, gen2, item2)
    assert not m.slots.ready(b"slow", slot, gen, item)  # the late READY is stale
    m.touch(b"slow")  # it speaks, but may still hold grants queued for that slot
    assert m.slots.slots[slot].state == SlotState.FENCED and m.grant(b"slow") is None
    m.hello(
        b"slow-again", hello("slow", os.getpid()), remote=False, peer=PEER
    )  # its queue is empty
    assert m.slots.slots[slot].state == SlotState.FREE
    assert [e.item for e in m.slots.pop_events(10)] == [item]
    assert m.slots.counters["reclaimed"] == 1


def test_dead_producer_frees_its_slots_at_once() -> None:
    m = manager()
    join(m, b"gone", pid=dead_pid(), credits=2)
    granted = [m.grant(b"gone"), m.grant(b"gone")]
    assert m.expire() == ["gone"]
    assert all(m.slots.slots[g[0]].state == SlotState.FREE for g in granted)
    assert b"gone" not in m.producers


def test_restarted_producer_takes_over_its_name() -> None:
    m = manager()
    m.hello(b"w-0:old", hello("w-0", dead_pid()), remote=False, peer=PEER)
    m.producers[b"w-0:old"].credits = 1
    slot, *_ = m.grant(b"w-0:old")
    m.hello(b"w-0:new", hello("w-0", os.getpid()), remote=False, peer=PEER)
    assert m.slots.slots[slot].state == SlotState.FREE and m.restarts == 1


def test_an_item_whose_lease_keeps_expiring_is_skipped_with_a_reason() -> None:
    clock = Clock()
    m = manager(attempts=2, clock=clock)
    for round_ in range(2):
        ident = f"p{round_}".encode()
        join(m, ident, pid=dead_pid(), credits=1)
        slot, gen, item, position = m.grant(ident)
        assert position == 0
        m.expire()
    event = m.slots.pop_events(10)[0]
    assert event.kind == "skip" and "lease expired 2 times" in event.reason
    join(m, b"ok")
    assert m.grant(b"ok")[3] == 1  # the plan goes on


def test_reorder_window_leaves_a_slot_for_the_oldest_item() -> None:
    clock = Clock()
    m = manager(n_items=100, n_slots=4, clock=clock)
    join(m, b"stuck", credits=1)
    head = m.grant(b"stuck")
    join(m, b"busy")
    grants = []
    while (g := m.grant(b"busy")) is not None:
        grants.append(g)
    assert len(grants) == 2  # window n_slots - 1: one slot stays free for the head
    for slot, gen, item, _ in grants:
        m.slots.ready(b"busy", slot, gen, item)
    assert m.slots.pop_events(10) == []  # waiting for the head in plan order
    clock.t = 100.0
    m.touch(b"busy")
    m.expire()  # "stuck" is alive but silent: its slot is fenced
    regrant = m.grant(b"busy")
    assert regrant is not None and regrant[3] == head[3]


def test_skip_from_a_producer_frees_the_slot_and_remembers_the_item() -> None:
    m = manager(n_items=3, epochs=2)
    join(m, b"a")
    slot, gen, item, _ = m.grant(b"a")
    assert m.slots.skip(b"a", slot, gen, item, "empty audio", "audio", "")
    assert m.slots.slots[slot].state == SlotState.FREE
    events = drain(m, [b"a"], random.Random(0))
    skips = [e for e in events if e.kind == "skip"]
    assert [e.item for e in skips] == [item, item]  # reported once per epoch
    assert sum(e.kind == "sample" for e in events) == 4
    assert m.slots.counters["grants"] == 5  # epoch 2 skipped it without granting it again


def test_reset_moves_the_cursor_and_drops_work_in_flight() -> None:
    m = manager(n_items=10, epochs=0)
    join(m, b"a")
    slot, gen, item, _ = m.grant(b"a")
    m.reset(25)
    assert m.slots.cursor == 25 and m.slots.slots[slot].state == SlotState.FENCED
    assert not m.slots.ready(b"a", slot, gen, item)
    assert m.grant(b"a") is None  # its queued grants are void until it says HELLO again
    m.hello(b"a:again", hello("a", os.getpid()), remote=False, peer=PEER)
    m.producers[b"a:again"].credits = 1
    assert m.slots.slots[slot].state == SlotState.FREE
    assert m.grant(b"a:again")[3] == 25


def test_only_the_sample_in_progress_counts_against_its_item() -> None:
    started = {1}
    m = manager(n_items=10, n_slots=4, attempts=1, started=lambda k: k in started)
    m.hello(b"w", hello("w", dead_pid()), remote=False, peer=PEER)
    m.producers[b"w"].credits = 3
    grants = [m.grant(b"w") for _ in range(3)]
    m.expire()  # dead: all three reclaimed, only slot 1's item was being written
    assert set(m.slots.known_bad) == {g[2] for g in grants if g[0] == 1}  # skipped, with reason
    assert len(m.slots.order.retry) == 2  # the queued two go back to the plan uncharged


def test_a_clean_goodbye_charges_nothing() -> None:
    m = manager(attempts=1)
    join(m, b"w", credits=2)
    m.grant(b"w")
    m.grant(b"w")
    m.drop(b"w", charge=False)
    assert m.slots.pop_events(10) == [] and len(m.slots.order.retry) == 2
    assert b"w" not in m.slots.held and b"w" not in m.slots.fenced  # nothing kept per ident


def test_a_heartbeating_producer_loses_a_grant_it_never_answers() -> None:
    """Leases are per grant: touching (heartbeats) never keeps a grant alive."""
    clock = Clock()
    m = manager(n_items=6, n_slots=4, clock=clock)
    join(m, b"mute", credits=2)
    mute = m.grant_round()[b"mute"]
    for _ in range(12):  # 6 s of heartbeats, past the 5 s lease
        clock.t += 0.5
        m.touch(b"mute")
        m.expire()
    assert m.producers[b"mute"].stalled and not m.slots.holding(b"mute")
    assert all(m.slots.slots[s].state == SlotState.FENCED for s, *_ in mute)  # local: may write
    join(m, b"good")
    events = drain(m, [b"good"], random.Random(0))
    assert sorted(e.item for e in events if e.kind == "sample") == list(range(6))


def test_a_grant_that_could_not_be_sent_comes_back_at_once_uncharged() -> None:
    m = manager(n_items=6, n_slots=4, attempts=1)
    join(m, b"a", credits=3)
    grants = m.grant_round()[b"a"]
    m.unsend(b"a", [g[0] for g in grants])
    assert m.producers[b"a"].credits == 3 and not m.slots.holding(b"a")
    assert all(m.slots.slots[g[0]].state == SlotState.FREE for g in grants)
    assert not m.slots.known_bad  # attempts=1, yet nothing was charged
    m.credit(b"a", 100)
    events = drain(m, [b"a"], random.Random(0))
    assert sorted(e.item for e in events if e.kind == "sample") == list(range(6))


def test_revoke_gives_back_every_grant_and_charges_only_the_started_one() -> None:
    started = set()
    m = manager(n_items=8, n_slots=6, attempts=1, started=started.__contains__)
    join(m, b"a")
    grants = m.grant_round()[b"a"]
    started.add(grants[0][0])
    m.revoke(b"a")  # e.g. a READY it sent could not be accepted
    assert m.producers[b"a"].stalled
    assert set(m.slots.known_bad) == {grants[0][2]}  # max_attempts=1: the started one is skipped
    assert sorted(m.slots.order.retry) == sorted(g[3] for g in grants[1:])


def test_a_dataset_smaller_than_the_grants_out_waits_instead_of_spinning() -> None:
    """Unordered mode, 4 items, 8 slots: each item has one grant out at a time, and a
    round of grants ends (it once looped for ever pushing later epochs aside)."""
    m = manager(n_items=4, n_slots=8, deterministic=False, epochs=0)
    join(m, b"w")
    grants = m.grant_round()[b"w"]
    assert sorted(g.item for g in grants) == [0, 1, 2, 3]
    assert m.grant(b"w") is None
    for slot, gen, item, _ in grants:
        assert m.slots.ready(b"w", slot, gen, item)
    m.slots.pop_events(8)
    assert sorted(g.item for g in m.grant_round()[b"w"]) == [0, 1, 2, 3]  # epoch 1


def test_a_peer_whose_grants_expire_while_it_talks_is_cut_once_a_lease_never_struck() -> None:
    """A lossy link makes an honest peer's grants expire just as a liar's do: its limit
    shrinks to one and grows back as it delivers; it is never struck for it."""
    clock = Clock()
    trust = PeerTrust(max_strikes=3, n_slots=16, lease_s=1.0, clock=clock)
    trust.expired_while_talking("k", 12)
    assert trust.limit("k") == 6
    trust.expired_while_talking("k", 6)  # the same lease: no second cut
    assert trust.limit("k") == 6
    for _ in range(10):
        clock.t += 1.0
        trust.expired_while_talking("k", trust.limit("k"))
    assert trust.limit("k") == 1 and trust.n_strikes == 0 and not trust.banned
    for _ in range(3):
        trust.delivered(PeerId("k", "k"))  # it works after all: one grant more per sample
    assert trust.limit("k") == 4
    for _ in range(20):
        trust.delivered(PeerId("k", "k"))
    assert trust.limit("k") == 16 and "k" not in trust.limits  # no limit of its own
