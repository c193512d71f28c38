"""Hostile and broken messages against the real stager in this process (its sockets and
rings; tests/support/stager_thread.py) with honest producer threads: garbage,
truncated and oversized frames, a READY of a generation never granted, a HELLO with an
impossible pid, a second HELLO on one socket. Each run still delivers its epoch exactly
once, every row checked, and the stager stays up. Fuzzed frames against a stager
process: tests/process/test_hostile_messages.py."""

from __future__ import annotations

import collections
import socket
from pathlib import Path

import msgpack
import zmq

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.liars import Tally, connect, grants_of, join
from tests.support.peers import peer_socket
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread


def test_malformed_messages_and_lying_readys_are_dropped_and_counted(tmp_path: Path) -> None:
    n = 200
    with stager_thread(small(tmp_path, items=n, delay_s=0.001)) as stager:
        cfg, client = stager.cfg, stager.client()
        with producer_threads(cfg, stager.control, n=2), peer_socket(stager.control) as rogue:
            header = msgpack.packb([p.VERSION, int(p.Kind.READY), 1, [0], [2], [3, 4], [0], [0]])
            for frames in (
                [b"\xc1\xc1 garbage"],
                [header[:-3]],  # truncated
                [msgpack.packb([p.VERSION, 99])],  # unknown kind
            ):
                rogue.send_multipart(frames)
            hello = p.Hello("rogue", 1, "elsewhere", False, "t", "", config_fingerprint(cfg))
            rogue.send_multipart(p.encode(hello))
            never = p.Ready(12345, [0], [0], [3, 4], [0], [0])  # a generation never granted
            rogue.send_multipart(p.encode(never))
            # Oversized: dropped as malformed, or (past ZMQ_MAXMSGSIZE) by libzmq with the
            # connection, before it reaches Python. Last, as it may cost the rogue its link.
            rogue.send_multipart([b"\x91" + b"\x00" * (p.MAX_HEADER_BYTES + 1)])
            items = consume(client)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    dropped = collections.Counter(summary["dropped"])
    # A READY of a generation never granted is a lie, not a late answer: a strike.
    assert dropped["malformed"] >= 3 and dropped["not-granted"] == 1
    assert summary["counters"]["strikes"] >= 1


def test_a_hello_with_an_out_of_range_pid_does_not_kill_the_stager(tmp_path: Path) -> None:
    """HELLO.pid is any 64-bit int on the wire; os.kill takes a C int."""
    n = 200
    with stager_thread(small(tmp_path, items=n, delay_s=0.002)) as stager:
        cfg, client = stager.cfg, stager.client()
        with producer_threads(cfg, stager.control, n=2), peer_socket(stager.control) as rogue:
            rogue.send_multipart(
                p.encode(p.Hello("huge", 2**40, socket.gethostname(), False, "t", "", {}))
            )
            items = consume(client)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    assert summary["dropped"]["malformed"] >= 1  # the HELLO, dropped and counted


def test_a_second_hello_on_one_socket_does_not_orphan_its_grants(tmp_path: Path) -> None:
    """A peer that says HELLO twice on one identity, holding grants, then falls silent:
    its grants must still expire with the lease, or their positions never finish."""
    n = 200
    with stager_thread(small(tmp_path, items=n, delay_s=0.002)) as stager:
        cfg, client = stager.cfg, stager.client()
        with producer_threads(cfg, stager.control), peer_socket(stager.control) as peer:
            hello = p.encode(
                p.Hello("twice", 1, "elsewhere", False, "t", "", config_fingerprint(cfg))
            )
            peer.send_multipart(hello)
            peer.send_multipart(p.encode(p.Request(4)))
            got: list = []

            def granted() -> bool:
                if peer.poll(100):
                    got.append(p.decode(peer.recv_multipart())[0])
                return any(isinstance(m, p.Grant) for m in got)

            wait_for(granted, 10, "a grant to the peer", interval_s=0)
            peer.send_multipart(hello)  # then silence: no READY, no heartbeat
            items = consume(client, timeout_s=15)
            client.close()
        stager.summary()
    assert_exactly_once(items, cfg, n)


def test_a_ready_that_misnames_its_run_is_refused_whole_and_counted_by_why(
    tmp_path: Path,
) -> None:
    """A READY naming a place outside the run it answers, a place twice, or an item not
    the one granted is a lie about the whole run: refused whole (no place of it taken),
    counted by why (not-granted, repeated, wrong-item), a strike against its peer only;
    the honest producers deliver the epoch exactly once and no item is charged. The
    rogue is this process, as the honest threads are: strikes do not ban it here."""
    n = 120
    config = small(tmp_path, items=n, delay_s=0.002, ring={"max_strikes": 0})
    with stager_thread(config) as stager:
        cfg, client = stager.cfg, stager.client()
        tally = Tally()
        # The rogue first, alone: the honest producers would fill the look-ahead before
        # a consumer frees it, leaving no grant for a late rogue.
        with zmq.Context() as ctx:
            for lie in ("not-granted", "repeated", "wrong-item"):
                with connect(ctx, stager.control) as sock:
                    assert join(sock, cfg, f"rogue-{lie}", False, tally) is not None, lie
                    sock.send_multipart(p.encode(p.Request(2)))
                    run = grants_of(sock, timeout_s=10)
                    assert run, f"no grant to answer with a {lie} lie"
                    entries = [
                        p.ReadyEntry(g.place, g.generation, g.item, [1, 1], 0, 0) for g in run
                    ]
                    first = entries[0]
                    if lie == "not-granted":
                        outside = max(g.place for g in run) + 1
                        entries = [first._replace(place=outside)]
                    elif lie == "repeated":
                        entries = [first, first]
                    else:
                        entries = [first._replace(item=first.item + 1)]
                    sock.send_multipart(p.encode(p.Ready.of(entries)))
                    wait_for(lambda lie=lie: stager.stager.drop.counts[lie], 10, f"the {lie} drop")
        with producer_threads(cfg, stager.control):
            items = consume(client)
            client.close()
        summary = stager.summary()
        quarantined = read_quarantine(stager.dir / "quarantine.jsonl")
    assert_exactly_once(items, cfg, n)
    dropped = summary["dropped"]
    assert [dropped.get(w) for w in ("not-granted", "repeated", "wrong-item")] == [1, 1, 1]
    counters = summary["counters"]
    assert counters["strikes"] == 3 and counters["skipped"] == 0 and quarantined == []
