"""The stager's slot ledger with its producer book: runs, exactly once, leases, fences,
batches in plan order (consumer/stager/ledger/). A fake clock, no sockets, no rings."""

from __future__ import annotations

import os
import random

import numpy as np

from ringfeed.consumer.stager.ledger.face import SAMPLE, Skip
from ringfeed.consumer.stager.peers import PeerId, PeerTrust
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.shared.memory.batch_ring import BatchState
from ringfeed.shared.memory.ring import SlotState
from tests.support.ledger_play import (
    PEER,
    ROWS,
    Clock,
    answer,
    begin,
    book,
    dead_pid,
    drain,
    grant_round,
    hello,
    join,
    ledger_of,
    place_of,
    retries,
    run,
    state,
)
from tests.support.ledger_play import (
    entries as run_entries,
)


def test_plan_is_a_permutation_per_epoch_and_reproducible() -> None:
    plan, again = Plan(Shuffle(50, seed=3)), Plan(Shuffle(50, seed=3))
    e0 = [plan.item_at(p) for p in range(50)]
    e1 = [plan.item_at(p) for p in range(50, 100)]
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    assert e0 == [again.item_at(p) for p in range(50)]


def test_a_run_names_rows_of_one_batch_under_one_generation() -> None:
    """GRANTs by the run: the messages per batch grow with the producers, not the rows."""
    m = book(n_items=20, credits=8)
    join(m, b"a")
    runs = grant_round(m)[b"a"]
    assert [len(r) for r in runs] == [4, 4]  # credits 8 in runs of half that: two batches
    for r in runs:
        assert len({g.generation for g in r}) == 1 and len({g.batch for g in r}) == 1
        assert [g.place for g in r] == [0, 1, 2, 3]  # in place: row k is position k
        assert all(g.batch >= 0 and g.shape == (ROWS, 8, 8) for g in r)
    assert [g.position for r in runs for g in r] == list(range(8))


def test_deterministic_delivery_follows_the_plan_whatever_the_finish_order() -> None:
    m = book(n_items=37, epochs=2)
    join(m, b"a")
    join(m, b"b")
    finished = drain(m, [b"a", b"b"], random.Random(1))
    assert [f.position for f in finished] == list(range(74))
    assert [f.item for f in finished] == [ledger_of(m).plan.item_at(q) for q in range(74)]
    assert (ledger_of(m).p_state == SlotState.FREE).all()


def test_unordered_mode_still_delivers_each_item_exactly_once() -> None:
    m = book(n_items=40, deterministic=False, epochs=1)
    join(m, b"a")
    finished = drain(m, [b"a"], random.Random(2))
    assert sorted(f.item for f in finished) == list(range(40))
    assert m.slots.progress().cursor == 40


def test_an_answer_naming_what_was_not_granted_is_refused_whole() -> None:
    m = book(n_items=20)
    join(m, b"a")
    join(m, b"b")
    (g0, g1, *_), other = run(m, b"a"), run(m, b"b")
    ledger = m.slots
    assert "never granted" in ledger.check(b"a", 999, [g0.place], [g0.item]).refused
    assert (
        "another producer"
        in ledger.check(b"a", other[0].generation, [other[0].place], [other[0].item]).refused
    )
    twice = ledger.check(b"a", g0.generation, [g0.place, g0.place], [g0.item, g0.item])
    assert "twice" in twice.refused
    assert "not in the run" in ledger.check(b"a", g0.generation, [3 + ROWS], [0]).refused
    assert "not the item" in ledger.check(b"a", g0.generation, [g1.place], [g0.item]).refused
    # Refused whole: nothing of it was taken, the places are still granted.
    assert state(m, g0) == state(m, g1) == SlotState.GRANTED


def test_expired_lease_fences_the_row_and_grants_the_item_again_in_a_spare() -> None:
    clock = Clock()
    m = book(clock=clock)
    join(m, b"slow", credits=1)
    (g,) = run(m, b"slow")
    clock.t = 6.0  # past lease_s with no word from "slow" (alive: it is this process)
    assert m.expire().names == ["slow"]
    assert state(m, g) == SlotState.FENCED  # it may still be writing
    join(m, b"fast", credits=1)
    (g2,) = run(m, b"fast")
    assert (g2.item, g2.position) == (g.item, g.position) and g2.batch == -1  # a spare
    assert answer(m, b"fast", g2)
    m.touch(b"slow")  # it speaks, but may still hold grants queued for that row
    assert state(m, g) == SlotState.FENCED and not run(m, b"slow")
    m.hello(b"slow-again", hello("slow", os.getpid()), remote=False, peer=PEER)  # queue empty
    assert state(m, g) == SlotState.FREE
    assert not answer(m, b"slow", g)  # a READY from before its HELLO is stale
    assert ledger_of(m).counters["reclaimed"] == 1


def test_a_batch_whose_row_may_still_be_written_moves_to_another_slot() -> None:
    """The fenced row's producer lives on and never answers: the batch is copied into a
    free slot, and the old slot is out of use until that producer is done."""
    clock = Clock()
    m = book(n_items=8, clock=clock)
    join(m, b"stuck", credits=1)
    (g,) = run(m, b"stuck")
    clock.t = 6.0
    m.expire()
    join(m, b"ok")
    while gs := run(m, b"ok"):
        for e in gs:
            assert answer(m, b"ok", e)
    batch = m.slots.next_batch()
    assert batch is not None and batch.moved_from == g.batch and batch.slot != g.batch
    assert ledger_of(m).s_state[g.batch] == BatchState.FENCED
    m.slots.sent(batch, 4)
    m.drop(b"stuck")  # its process is gone: the row, then its slot, are free again
    assert ledger_of(m).s_state[g.batch] == BatchState.FREE


def test_a_rows_fence_outlasts_its_lease_but_a_spares_does_not() -> None:
    """A row is delivered where it lies: its fence holds until its producer is known to
    write no more. A spare is copied and checked after the copy: its fence lifts after
    FENCE_LEASES leases whatever its producer does."""
    clock = Clock()
    m = book(n_items=40, clock=clock)
    join(m, b"slow", credits=1)
    (row,) = run(m, b"slow")
    clock.t = 6.0
    m.expire()  # revoked: its row fenced, its position in the retries
    m.hello(b"slow2", hello("slow", os.getpid()), remote=False, peer=PEER)
    m.producers[b"slow2"].credits = 1
    m.producers[b"slow2"].peer = PeerId("pool 1", "unseen", 0, unseen=True)  # spares only
    (spare,) = run(m, b"slow2")
    assert spare.batch == -1
    clock.t = 12.0
    m.expire()
    assert state(m, spare) == SlotState.FENCED
    clock.t = 12.0 + 4 * 5.0 + 1  # FENCE_LEASES
    m.expire()
    assert state(m, spare) == SlotState.FREE and state(m, row) == SlotState.FREE
    assert ledger_of(m).counters["fences_lifted"] == 1  # the spare's (the row's: its HELLO)


def test_dead_producer_frees_its_places_at_once() -> None:
    m = book()
    join(m, b"gone", pid=dead_pid(), credits=2)
    granted = run(m, b"gone")
    assert m.expire().names == ["gone"]
    assert all(state(m, g) == SlotState.FREE for g in granted)
    assert b"gone" not in m.producers


def test_restarted_producer_takes_over_its_name() -> None:
    m = book()
    join(m, b"w-0:old", pid=dead_pid(), credits=1, name="w-0")
    (g,) = run(m, b"w-0:old")
    m.hello(b"w-0:new", hello("w-0", os.getpid()), remote=False, peer=PEER)
    assert state(m, g) == SlotState.FREE and m.restarts == 1


def test_an_item_whose_lease_keeps_expiring_is_skipped_with_a_reason() -> None:
    clock = Clock()
    m = book(attempts=2, clock=clock)
    for round_ in range(2):
        ident = f"p{round_}".encode()
        join(m, ident, pid=dead_pid(), credits=1)
        (g,) = run(m, ident)
        assert g.position == 0
        begin(m, g)  # it died at work on it
        m.expire()
    join(m, b"ok")
    assert run(m, b"ok")[0].position == 1  # the plan goes on
    first = ledger_of(m).skips[0]  # position 0: row 0 of the first batch
    assert "lease expired 2 times" in first.reason


def test_the_look_ahead_leaves_the_oldest_batch_a_spare() -> None:
    """Spares past a reserve go only to positions of the oldest batch: later batches'
    retries could otherwise hold every spare while the oldest waits for one."""
    m = book(n_items=100, spares=4)
    assert ledger_of(m).spare_reserve == 2
    join(m, b"a")
    m.producers[b"a"].peer = PeerId("pool 1", "unseen", 0, unseen=True)  # spares only
    runs = grant_round(m)[b"a"]
    assert [g.position for r in runs for g in r] == [0, 1, 2, 3]  # all 4: the oldest batch's


def test_skip_from_a_producer_frees_the_place_and_remembers_the_item() -> None:
    m = book(n_items=3, epochs=2)
    join(m, b"a")
    (g,) = run(m, b"a", 1)
    verdict = m.slots.check(b"a", g.generation, [g.place], [g.item])
    m.slots.skip(verdict, Skip("empty audio", "audio"), "skip")
    assert state(m, g) == SlotState.FREE
    finished = drain(m, [b"a"], random.Random(0))
    skips = [f for f in finished if f.kind == "skip"]
    assert [f.item for f in skips] == [g.item, g.item]  # reported once per epoch
    assert sum(f.kind == "sample" for f in finished) == 4
    assert ledger_of(m).counters["grants"] == 5  # epoch 2 skipped it without a grant


def test_reset_moves_the_cursor_and_drops_work_in_flight() -> None:
    m = book(n_items=10, epochs=0)
    join(m, b"a")
    g = run(m, b"a")[0]
    m.reset(24)
    assert m.slots.progress().cursor == 24 and state(m, g) == SlotState.FENCED
    assert not answer(m, b"a", g)
    assert not run(m, b"a")  # its queued grants are void until it says HELLO again
    m.hello(b"a:again", hello("a", os.getpid()), remote=False, peer=PEER)
    m.producers[b"a:again"].credits = 1
    assert state(m, g) == SlotState.FREE
    assert run(m, b"a:again")[0].position == 24


def test_only_the_sample_in_progress_counts_against_its_item() -> None:
    m = book(n_items=10, attempts=1)
    join(m, b"w", pid=dead_pid(), credits=3)
    grants = run(m, b"w", 3)
    begin(m, grants[1])  # mid-write
    m.expire()  # dead: all three taken back, only the begun one's item was being written
    assert set(ledger_of(m).known_bad) == {grants[1].item}  # skipped, with reason
    assert retries(m) == [0, 2]  # back uncharged


def test_a_remote_producer_that_dies_mid_run_charges_the_first_unanswered_of_its_run() -> None:
    """A remote producer answers each sample as it is written; its places of one run share
    a grant time. Killed after answering the first two of four, only the third's item,
    the one it was at, is charged (the soak quarantined innocent items when an arbitrary
    place of the run was charged)."""
    m = book(n_items=10, attempts=1)
    m.hello(b"far", hello("far", 1), remote=True, peer=PeerId("key", "key", 0))
    m.producers[b"far"].credits = 4
    grants = run(m, b"far", 4)
    assert len({ledger_of(m).p_t[place_of(m, g)] for g in grants}) == 1
    for g in grants[:2]:
        assert answer(m, b"far", g)
    m.drop(b"far", charge=True)
    assert set(ledger_of(m).known_bad) == {grants[2].item}
    assert retries(m) == [grants[3].position]


def test_a_clean_goodbye_charges_nothing() -> None:
    m = book(attempts=1)
    join(m, b"w", credits=2)
    run(m, b"w")
    m.drop(b"w", charge=False)
    assert len(retries(m)) == 2 and not ledger_of(m).known_bad
    assert m.slots.holding(b"w") == (0, 0)


def test_a_heartbeating_producer_loses_a_grant_it_never_answers() -> None:
    """Leases are per grant: touching (heartbeats) never keeps a grant alive."""
    clock = Clock()
    m = book(n_items=6, clock=clock)
    join(m, b"mute", credits=2)
    mute = grant_round(m)[b"mute"][0]
    for _ in range(12):  # 6 s of heartbeats, past the 5 s lease
        clock.t += 0.5
        m.touch(b"mute")
        m.expire()
    assert m.producers[b"mute"].stalled and not m.slots.holding(b"mute")[0]
    assert all(state(m, g) == SlotState.FENCED for g in mute)  # local: may write
    join(m, b"good")
    finished = drain(m, [b"good"], random.Random(0))
    assert sorted(f.item for f in finished if f.kind == "sample") == list(range(6))


def test_a_grant_that_could_not_be_sent_comes_back_at_once_uncharged() -> None:
    m = book(n_items=6, attempts=1)
    join(m, b"a", credits=3)
    grants = []
    for r in m.grant_round()[b"a"]:
        grants += run_entries(r)
        m.unsend(b"a", r)
    assert m.producers[b"a"].credits == 3 and not m.slots.holding(b"a")[0]
    assert all(state(m, g) == SlotState.FREE for g in grants)
    assert not ledger_of(m).known_bad  # attempts=1, yet nothing was charged
    m.credit(b"a", 100)
    finished = drain(m, [b"a"], random.Random(0))
    assert sorted(f.item for f in finished if f.kind == "sample") == list(range(6))


def test_a_dataset_smaller_than_the_grants_out_waits_instead_of_spinning() -> None:
    """3 items, batches of 4 ahead: each item has one grant out at a time, and a round of
    grants ends (it once looped for ever pushing later epochs aside)."""
    m = book(n_items=3, epochs=0)
    join(m, b"w")
    grants = [g for r in grant_round(m)[b"w"] for g in r]
    assert sorted(g.item for g in grants) == [0, 1, 2]
    assert not run(m, b"w")
    for g in grants:
        assert answer(m, b"w", g)
    assert sorted(g.item for r in grant_round(m)[b"w"] for g in r) == [0, 1, 2]  # epoch 1


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


def test_known_skips_leave_no_hole_so_the_assembly_moves_no_row() -> None:
    """Items known bad before their batch is granted (outliers under data.outliers: skip,
    items quarantined in an earlier epoch) are skipped without a grant, and the positions
    after them are granted the rows they would otherwise be copied up into when the batch
    is assembled: each sample lies in its final row of its own batch slot."""
    m = book(n_items=20, credits=100, lookahead=2)
    ledger = ledger_of(m)
    plan = ledger.plan
    bad = {plan.item_at(1), plan.item_at(6), plan.item_at(7), plan.item_at(13)}
    ledger.mark_bad({item: ("an outlier", "outlier") for item in bad})  # as the stager at start
    join(m, b"a")
    delivered, skipped = [], []
    while not ledger.progress().exhausted:
        for g in [g for r in grant_round(m).get(b"a", []) for g in r]:
            assert answer(m, b"a", g)
        while (batch := ledger.next_batch()) is not None:
            sample = batch.kind == SAMPLE
            finals = np.add.accumulate(sample, dtype=np.int64) - 1
            assert (batch.src_slot[sample] == batch.slot).all(), batch
            assert (batch.src_index[sample] == finals[sample]).all(), (batch.src_index, finals)
            delivered += batch.items[sample].tolist()
            skipped += batch.items[~sample].tolist()
            assert ledger.freed(batch.slot, ledger.sent(batch, int(sample.sum())))
    assert sorted(skipped) == sorted(bad)
    assert delivered == [plan.item_at(q) for q in range(20) if plan.item_at(q) not in bad]


def test_a_free_that_names_another_slot_frees_nothing() -> None:
    """A consumer that frees the wrong slot (an off-by-one of a hand-written loop) with a
    batch's generation must free nothing: batch-slot generations come from one counter,
    so no two sent batches share one, and the batch still being read stays whole (with a
    counter per slot they advanced in step, and the other slot was refilled under it)."""
    m = book(n_items=20, credits=100, lookahead=2)
    ledger = ledger_of(m)
    join(m, b"a")
    sent = []
    while len(sent) < 2:
        for g in [g for r in grant_round(m).get(b"a", []) for g in r]:
            assert answer(m, b"a", g)
        while len(sent) < 2 and (batch := ledger.next_batch()) is not None:
            sent.append((batch.slot, ledger.sent(batch, int((batch.kind == SAMPLE).sum()))))
    (slot_a, gen_a), (slot_b, gen_b) = sent
    assert slot_a != slot_b and gen_a != gen_b
    assert not ledger.freed(slot_b, gen_a) and not ledger.freed(slot_a, gen_b)
    assert ledger.freed(slot_a, gen_a) and ledger.freed(slot_b, gen_b)
