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

from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.peers import peer_socket
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread


def test_malformed_messages_and_lying_readys_are_dropped_and_counted(tmp_path: Path) -> None:
    n = 200
    with stager_thread(small(tmp_path, items=n, delay_s=0.001)) as stager:
        cfg, client = stager.cfg, stager.client()
        with producer_threads(cfg, stager.control, n=2), peer_socket(stager.control) as rogue:
            header = msgpack.packb([p.VERSION, int(p.Kind.READY), [0], [1], [2], [3, 4], [0], [0]])
            for frames in (
                [b"\xc1\xc1 garbage"],
                [header[:-3]],  # truncated
                [msgpack.packb([p.VERSION, 99])],  # unknown kind
            ):
                rogue.send_multipart(frames)
            hello = p.Hello("rogue", 1, "elsewhere", False, "t", "", config_fingerprint(cfg))
            rogue.send_multipart(p.encode(hello))
            never = p.Ready([0], [12345], [0], [3, 4], [0], [0])  # a generation never granted
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
    assert dropped["malformed"] >= 4 and summary["counters"]["strikes"] >= 1


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
