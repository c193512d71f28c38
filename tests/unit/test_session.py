"""A producer's session (producer/process/session.py) on a fake clock: no processes, no sockets.

Each rule of the session's docstring, driven turn by turn as the worker's loop drives
it (a tick every turn), with plain protocol messages in and out; the process tests
(test_orphans_and_refusals.py, test_stopped_producers.py, test_faults.py) check the
same rules end to end.
"""

from __future__ import annotations

import logging
import random

import msgpack
import pytest

from ringfeed.producer.process.session import (
    EXIT_FINISHED,
    EXIT_ORPHANED,
    EXIT_REFUSED,
    NEW_SOCKET,
    Action,
    Join,
)
from ringfeed.shared.run.process import BYE_AGAIN_S, SHUTDOWN_WAIT_S
from ringfeed.shared.wire import protocol as p
from tests.support.session_loop import (
    HELLO,
    N_ITEMS,
    RULES,
    STAGES,
    TURN_S,
    WELCOME,
    Loop,
    Stager,
    answers_heartbeats,
    grants,
    never_heard_of_it,
)


def test_start_says_hello_on_a_new_socket_and_a_welcome_joins_and_asks() -> None:
    loop = Loop()
    assert loop.said == [(1000.0, NEW_SOCKET), (1000.0, HELLO)]
    assert loop.session.take() is None and not loop.session.welcomed
    loop.welcomed()
    assert loop.session.welcomed and loop.session.ending is None


def test_a_welcome_for_another_number_of_items_is_a_crash_that_says_what_to_change() -> None:
    with pytest.raises(RuntimeError, match="plans 9 items but this producer reads 8: both"):
        Loop().hear(p.Welcome("run", "ring", 9, {}))


def test_grants_are_taken_oldest_first_and_counted() -> None:
    loop = Loop().welcomed()
    loop.hear(grants(3, 1))
    loop.hear(grants(2))
    taken = [loop.session.take() for _ in range(4)]
    assert [g.place if g else None for g in taken] == [3, 1, 2, None]
    loop.session.filled(taken[0])
    loop.session.dropped(taken[1])
    loop.session.filled(taken[2])
    assert (loop.session.done, loop.session.taken_back) == (2, 1)


def test_a_run_is_taken_whole_and_alone() -> None:
    """The worker fills one GRANT's run and answers it with one READY: take_run gives
    the oldest run's queued grants in order, none of the next run's."""
    loop = Loop().welcomed()
    loop.hear(p.Grant.of([p.GrantEntry(w, 1, w, w) for w in (0, 1, 2)]))
    loop.hear(p.Grant.of([p.GrantEntry(w, 2, 10 + w, 10 + w) for w in (0, 1)]))
    runs = []
    while run := loop.session.take_run():
        runs.append([(g.generation, g.place) for g in run])
    assert runs == [[(1, 0), (1, 1), (1, 2)], [(2, 0), (2, 1)]]


def test_a_heartbeat_every_heartbeat_s_carries_the_counters_within_bounds() -> None:
    loop = Loop().welcomed()
    loop.session.filled(p.GrantEntry(0, 1, 0, 0))
    loop.run(5.0, answers_heartbeats)
    beats = loop.times(p.Heartbeat)
    assert len(beats) == 5
    gaps = [b - a for a, b in zip([1000.0, *beats], beats, strict=False)]
    assert all(RULES.heartbeat_s <= gap < RULES.heartbeat_s + TURN_S for gap in gaps), gaps
    beat = next(a for _, a in loop.said if isinstance(a, p.Heartbeat))
    assert beat == p.Heartbeat(1, {**STAGES, "taken_back": 0})
    too_many = {f"stage{k}": k for k in range(p.MAX_WORK_KEYS + 5)} | {"x" * 99: 1}
    loop.session.stages = lambda: too_many
    work = loop.session.work()
    assert len(work) == p.MAX_WORK_KEYS and "x" * 99 not in work
    assert p.decode(p.encode(p.Heartbeat(1, work)))[0].work == work  # the stager keeps it


def test_every_counter_a_producer_can_have_fits_the_protocol() -> None:
    """The most a producer reports (a corpus of remote tar shards: the pipeline's stages,
    its text work, the shard cache's counters, taken_back) fits in one HEARTBEAT: none
    is cut off by MAX_WORK_KEYS or MAX_WORK_KEY."""
    import dataclasses

    from ringfeed.producer.sample import PipelineCounters
    from ringfeed.shared.corpus.object_store import ShardCache

    shard_cache = ShardCache.__new__(ShardCache)
    shard_cache.hits = shard_cache.fetched = shard_cache.fetched_bytes = 0
    shard_cache.retries = 0
    names = [f.name for f in dataclasses.fields(PipelineCounters)]
    names += ["normalized", "phonemized", *shard_cache.counters(), "taken_back"]
    assert len(names) == len(set(names)) <= p.MAX_WORK_KEYS, names
    assert all(len(name) <= p.MAX_WORK_KEY for name in names), names


def test_an_idle_producer_asks_again_every_heartbeat_a_busy_one_does_not() -> None:
    """A lost REQUEST, or a lost READY's credit, costs one heartbeat_s, not the run."""
    loop = Loop().welcomed()  # its REQUEST is lost: no GRANT comes
    loop.run(3.0, answers_heartbeats)
    assert len(loop.times(p.Request)) == 1 + 3  # the WELCOME's, then every heartbeat_s
    busy_since = loop.now
    loop.hear(grants(0, 1))
    loop.run(3.0, answers_heartbeats)
    assert loop.times(p.Request, busy_since) == []  # grants queued: it asks for nothing
    for _ in range(2):  # filled; their READYs (and the credit they carried) are lost
        loop.session.filled(loop.session.take())
    idle_since = loop.now
    loop.run(RULES.heartbeat_s, answers_heartbeats)
    assert loop.times(p.Request, idle_since)[0] - idle_since <= RULES.heartbeat_s
    assert loop.hellos(since=1000.0) == [] and loop.session.ending is None


@pytest.mark.parametrize(
    ("stager", "every_s"),
    [(never_heard_of_it, RULES.heartbeat_s), (answers_heartbeats, RULES.lease_s + TURN_S)],
    ids=["lost HELLO", "lost WELCOME"],
)
def test_a_lost_hello_or_welcome_costs_a_heartbeat_or_a_lease(
    stager: Stager, every_s: float
) -> None:
    """A stager that never saw the HELLO answers its HEARTBEAT with REHELLO; one whose
    WELCOME was lost answers it, and the producer says HELLO again after a lease."""
    loop = Loop()
    loop.run(2.5 * RULES.lease_s, stager)
    hellos = loop.hellos(since=1000.0)
    assert len(hellos) == int(2.5 * RULES.lease_s / every_s)
    assert {h - t for t, h in zip([1000.0, *hellos], hellos, strict=False)} == {every_s}
    loop.welcomed()
    loop.run(3 * RULES.lease_s, answers_heartbeats)
    assert loop.hellos(since=hellos[-1]) == [] and loop.session.ending is None


def test_a_stager_silent_for_a_lease_after_welcome_gets_hello_again_and_the_grants_go() -> None:
    loop = Loop().welcomed()
    loop.hear(grants(0, 1, 2))
    loop.run(RULES.lease_s + TURN_S)  # silent: not even its heartbeats are answered
    assert len(loop.hellos(since=1000.0)) == 1 and not loop.session.welcomed
    assert loop.session.take() is None and loop.session.taken_back == 3


def test_an_orphan_after_a_welcome_only_exits_its_hellos_do_not_keep_it_alive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Loop().welcomed()
    with caplog.at_level(logging.WARNING):
        loop.run(3 * RULES.orphan_s)
    assert loop.session.ending == EXIT_ORPHANED == loop.session.exit_code
    assert RULES.orphan_s < loop.now - 1000.0 <= RULES.orphan_s + TURN_S
    assert len(loop.hellos(since=1000.0)) == 2  # silent a lease, then no WELCOME in two
    assert "w0: no word from the stager for 30 s (it is gone); exiting" in caplog.text
    assert loop.session.tick(loop.now + 1.0) == []  # ended: nothing more
    assert loop.session.leave(loop.now) == [] and loop.session.left(loop.now)  # no BYE


def test_a_word_from_the_stager_resets_the_orphan_clock() -> None:
    loop = Loop().welcomed()
    loop.run(5 * RULES.orphan_s, answers_heartbeats)
    assert loop.session.ending is None and loop.hellos(since=1000.0) == []


@pytest.mark.parametrize("welcomed", [True, False])
def test_a_pause_longer_than_a_lease_says_hello_instead_of_orphaning(
    welcomed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP (or a suspended VM) for three orphan times: its silence was its own."""
    loop = Loop().welcomed() if welcomed else Loop()
    loop.hear(grants(0, 1))
    loop.run(1.0, answers_heartbeats)
    loop.now += 3 * RULES.orphan_s  # stopped
    with caplog.at_level(logging.WARNING):
        assert loop.do(loop.session.tick(loop.now)) == [NEW_SOCKET, HELLO]
    assert "this producer did not run for 90 s" in caplog.text
    assert loop.session.ending is None and loop.session.take() is None
    loop.welcomed()
    loop.run(RULES.orphan_s - 1.0)  # the orphan clock started anew at the pause's end
    assert loop.session.ending is None
    loop.run(2.0)
    assert loop.session.ending == EXIT_ORPHANED


def test_a_pause_shorter_than_a_lease_is_no_pause() -> None:
    loop = Loop().welcomed()
    loop.now += RULES.lease_s - 1.0  # a slow sample
    assert [type(a) for a in loop.session.tick(loop.now)] == [p.Request, p.Heartbeat]
    assert loop.session.welcomed


def test_rehello_voids_the_queued_grants_and_says_hello_again() -> None:
    loop = Loop().welcomed()
    loop.hear(grants(4, 5, 6))
    loop.session.take()
    assert loop.hear(p.Rehello()) == [NEW_SOCKET, HELLO]
    assert loop.session.take() is None and loop.session.taken_back == 2
    loop.welcomed()
    loop.run(RULES.heartbeat_s + TURN_S, answers_heartbeats)
    beat = [a for _, a in loop.said if isinstance(a, p.Heartbeat)][-1]
    assert beat.work["taken_back"] == 2


def test_shutdown_ends_it_finished_with_a_bye_that_waits_for_its_ack() -> None:
    loop = Loop().welcomed()
    loop.hear(grants(0))
    loop.session.filled(loop.session.take())
    loop.hear(p.Shutdown("run finished"))
    assert loop.session.ending == EXIT_FINISHED
    assert loop.session.leave(loop.now) == [p.Bye(1, {**STAGES, "taken_back": 0})]
    assert not loop.session.left(loop.now + SHUTDOWN_WAIT_S - TURN_S)
    assert loop.hear(p.Rehello()) == [] and loop.hear(grants(1)) == []  # leaving
    assert loop.session.take() is None
    loop.hear(p.ByeAck())
    assert loop.session.left(loop.now)


def test_a_stopped_producer_says_bye_and_waits_at_most_shutdown_wait_s() -> None:
    """SIGTERM: the worker's stop flag ends the loop; the session ends finished."""
    loop = Loop().welcomed()
    assert [type(a) for a in loop.session.leave(loop.now)] == [p.Bye]
    assert not loop.session.left(loop.now + SHUTDOWN_WAIT_S - TURN_S)
    assert loop.session.left(loop.now + SHUTDOWN_WAIT_S)
    assert loop.session.exit_code == EXIT_FINISHED


def test_bye_is_said_again_every_bye_again_s_until_its_ack() -> None:
    """A lossy link loses a BYE as it loses any message: the worker ticks the session
    while it waits (producer/process/worker.py await_bye_ack), and the session says the
    same BYE again every BYE_AGAIN_S, nothing else, until BYE_ACK."""
    loop = Loop().welcomed()
    loop.hear(grants(0))
    loop.session.filled(loop.session.take())
    bye = loop.session.leave(loop.now)
    assert bye == [p.Bye(1, {**STAGES, "taken_back": 0})]
    said = []
    t = loop.now
    while not loop.session.left(t) and t < loop.now + BYE_AGAIN_S * 2.5:
        said += [(round(t - loop.now, 3), a) for a in loop.session.tick(t)]
        t += TURN_S
    assert [a for _, a in said] == bye * 2
    assert [s for s, _ in said] == [BYE_AGAIN_S, 2 * BYE_AGAIN_S]
    loop.hear(p.ByeAck())
    assert loop.session.left(t) and loop.session.tick(t + BYE_AGAIN_S) == []


def test_a_producer_never_welcomed_on_its_socket_leaves_without_a_word() -> None:
    loop = Loop()
    assert loop.session.leave(loop.now) == [] and loop.session.left(loop.now)


def test_refused_ends_it_for_good_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    loop = Loop()
    with caplog.at_level(logging.ERROR):
        loop.hear(p.Refused("config differs: features.n_mels (80 here): use the same"))
    assert loop.session.ending == EXIT_REFUSED == loop.session.exit_code
    assert "w0: refused by the stager: config differs: features.n_mels" in caplog.text
    assert loop.hear(WELCOME) == [] and loop.session.tick(loop.now + 99.0) == []
    assert loop.session.leave(loop.now) == []


def test_a_message_in_another_protocol_version_ends_it_naming_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = p.VERSION - 1
    frame = msgpack.packb([old, int(p.Kind.WELCOME), "run", "ring", N_ITEMS, {}])
    loop = Loop()
    with pytest.raises(p.VersionMismatch) as mismatch:
        p.decode([frame])
    with caplog.at_level(logging.ERROR):
        loop.session.heard_other_version(mismatch.value)
    assert loop.session.ending == EXIT_REFUSED
    assert (
        f"the stager speaks ringfeed protocol version {old}, this producer version "
        f"{p.VERSION}: run the same ringfeed version on every host"
    ) in caplog.text


class LossyStager:
    """A stager behind a link that loses each message either way with probability
    `loss`. It welcomes a HELLO and answers anything else from a socket that has not
    said HELLO with REHELLO; it keeps at most CAP credits, grants from N_SLOTS slots,
    takes a grant back after a lease without READY, answers each HEARTBEAT."""

    CAP, N_SLOTS = RULES.credits, 6

    def __init__(self, loop: Loop, loss: float, seed: int) -> None:
        self.loop, self.loss, self.rng = loop, loss, random.Random(seed)
        self.known = False  # has the producer's current socket said HELLO?
        self.credits, self.held, self.next_gen = 0, {}, 1  # held: slot -> granted at

    def lost(self) -> bool:
        return self.rng.random() < self.loss

    def __call__(self, action: Action) -> list[p.Message]:
        if action is NEW_SOCKET:  # a new identity: an unknown peer until its HELLO
            self.known = False
        if action is NEW_SOCKET or isinstance(action, Join) or self.lost():
            return []
        if action == HELLO:
            self.known, self.credits, self.held = True, 0, {}  # the old grants go back
            return [] if self.lost() else [WELCOME]
        if not self.known:
            return [] if self.lost() else [p.Rehello()]
        if isinstance(action, p.Request):
            self.credits = min(self.credits + action.credits, self.CAP)
        heartbeat = isinstance(action, p.Heartbeat) and not self.lost()
        return [p.Heartbeat(0, {})] if heartbeat else []

    def turn(self) -> None:
        """Expire leases, grant what credits allow, fill one grant (its READY lossy)."""
        now, session = self.loop.now, self.loop.session
        self.held = {s: t for s, t in self.held.items() if now - t <= RULES.lease_s}
        free = [s for s in range(self.N_SLOTS) if s not in self.held][: self.credits]
        if free:
            self.credits -= len(free)
            self.held.update({s: now for s in free})
            self.next_gen += 1
            if not self.lost():
                self.loop.hear(p.Grant.of([p.GrantEntry(s, self.next_gen, s, s) for s in free]))
        grant = session.take()
        if grant is not None:
            session.filled(grant)
            if not self.lost() and self.held.pop(grant.place, None) is not None:
                self.credits = min(self.credits + 1, self.CAP)


def test_a_lossy_link_slows_the_producer_and_never_ends_it() -> None:
    """A fifth of all messages lost either way, for ten minutes: HELLOs, WELCOMEs,
    REQUESTs, GRANTs, READYs' credits, heartbeats and their answers. Each loss costs a
    heartbeat or a lease; the producer keeps working, is never orphaned, and once the
    link heals it fills a grant every turn again within two leases."""
    loop = Loop()
    stager = LossyStager(loop, loss=0.2, seed=7)
    lossy_s, healed_s = 600.0, 2 * RULES.lease_s
    filled_at = []
    while loop.now < 1000.0 + lossy_s + healed_s:
        stager.loss = 0.2 if loop.now < 1000.0 + lossy_s else 0.0
        before = loop.session.done
        stager.turn()
        if loop.session.done > before:
            filled_at.append(loop.now)
        loop.run(TURN_S, stager)
        assert loop.session.ending is None, f"ended at {loop.now - 1000.0:.1f} s"
    lossy = [t for t in filled_at if t < 1000.0 + lossy_s]
    gaps = [b - a for a, b in zip([1000.0, *lossy], lossy, strict=False)]
    assert max(gaps) < 2 * RULES.lease_s, max(gaps)
    assert len(lossy) >= stager.N_SLOTS * lossy_s / RULES.lease_s  # each slot once a lease
    last_lease = [t for t in filled_at if t > loop.now - RULES.lease_s]
    assert len(last_lease) >= 0.9 * RULES.lease_s / TURN_S, len(last_lease)
