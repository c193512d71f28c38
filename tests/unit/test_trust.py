"""Trust boundaries, tested as an attacker would, against the real stager in this process
(its sockets and rings; tests/support/stager_thread.py) with honest producer threads:
impostor consumers, producers that lie about who and where they are, five hundred that
say HELLO and vanish, a stale write after READY; and key files that are private. Each
run must keep the stager up, deliver its epoch exactly once with every row checked
against the item it claims to be, and count each refusal by reason. In another PID
namespace, and beside another user's segment, with real processes:
tests/process/test_trust.py."""

from __future__ import annotations

import collections
import os
import socket
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from ringfeed.producer.sources import SyntheticSource
from ringfeed.shared.memory.places import Places, write_sample
from ringfeed.shared.memory.ring import SlotState
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.run.run_secret import read_consumer_secret
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import KeysError, generate, load_client, load_server
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import keyed, small, tcp
from tests.support.liars import close_places, places_of, receive
from tests.support.peers import peer_socket
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread
from tests.support.stats import StatsReader


def test_only_the_runs_consumer_can_be_the_consumer(tmp_path: Path) -> None:
    n = 300
    with stager_thread(small(tmp_path, items=n, transport=tcp(free_port()))) as stager:
        cfg, client = stager.cfg, stager.client()
        secret = wait_for(lambda: read_consumer_secret(stager.dir), 30, "the consumer secret")
        assert (stager.dir / "consumer.secret").stat().st_mode & 0o777 == 0o600
        with (
            producer_threads(cfg, stager.control, n=2),
            peer_socket(stager.control) as impostor,
            peer_socket(stager.tcp) as far,
        ):
            impostor.send_multipart(p.encode(p.ConsumerHello("evil", 0, 0, "guess", {}, 0)))
            impostor.send_multipart(p.encode(p.ConsumerHello("evil", 0, 0, "", {}, 0)))
            # Even the right secret does not make a tcp peer the consumer.
            far.send_multipart(p.encode(p.ConsumerHello("evil", 0, 0, secret, {}, 0)))
            # Out of range: negative (refused at decode), past the plan's end (by the stager).
            impostor.send_multipart([msgpack.packb([p.VERSION, 12, "evil", -5, 0, secret])])
            impostor.send_multipart(p.encode(p.ConsumerHello("x", 10**12, 0, "guess", {}, 0)))
            for sock in (impostor, far):
                sock.send_multipart(p.encode(p.Bye(0, {})))  # would end the run if believed
            items = consume(client)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    dropped = collections.Counter(summary["dropped"])
    assert dropped["unauthorized"] >= 4, dropped
    assert dropped["malformed"] >= 1 and dropped["unknown-peer"] >= 2, dropped


def row_of(stats: dict, name: str) -> dict | None:
    """The stats row of the producer called name, if listed."""
    return next((pr for pr in stats.get("producers", []) if pr["name"] == name), None)


def test_producer_claims_give_no_more_than_a_remote_producer_has(tmp_path: Path) -> None:
    n = 300
    config = small(tmp_path, items=n, delay_s=0.004, transport=tcp(free_port()))
    head = socket.gethostname()
    with stager_thread(config) as stager, StatsReader(stager.stats) as stats:
        cfg, client = stager.cfg, stager.client()
        with (
            producer_threads(cfg, stager.control),
            peer_socket(stager.tcp) as liar,
            peer_socket(stager.tcp) as thief,
            peer_socket(stager.tcp) as second,
        ):
            joined = stats.first(lambda s: s.get("producers"), 20, "a producer joining")
            live = [pr["name"] for pr in joined["producers"]]
            prints = config_fingerprint(cfg)
            # A tcp peer that says it is local, on the head's host, with pid 1.
            liar.send_multipart(p.encode(p.Hello("liar", 1, head, False, "t1", "", prints)))
            # A live local producer's name from a tcp peer: a name of that peer's own
            # (names belong to their owner: its host here), not an eviction.
            thief.send_multipart(p.encode(p.Hello(live[0], 4242, head, False, "t2", "", prints)))
            wait_for(lambda: isinstance(receive(thief, 0.2), p.Welcome), 10, "the thief's join")
            # Another process of that same host under that name while the thief lives:
            # refused, told who holds it.
            second.send_multipart(p.encode(p.Hello(live[0], 4343, head, False, "t3", "", prints)))
            # A name of 100 KiB: over ZMQ_MAXMSGSIZE, so libzmq closes the link before
            # Python sees it (over the header limit, decode would drop it as malformed).
            huge = [p.VERSION, int(p.Kind.HELLO), "n" * 102400, 7, head, False, "t", "", {}]
            thief.send_multipart([msgpack.packb(huge)])
            liar_row = wait_for(lambda: row_of(stats.latest(), "liar"), 10, "the liar's row")
            items = consume(client)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    assert liar_row is not None and liar_row["remote"], liar_row  # believed only as remote
    rows = [pr for pr in summary["producers"] if pr["name"] == live[0]]
    assert sorted(pr["remote"] for pr in rows) == [False, True], rows  # both, neither evicted
    dropped = collections.Counter(summary["dropped"])
    assert dropped["refused-hello"] >= 1, dropped
    assert f"name {live[0]!r} of host " in stager.log.text()
    names = [pr["name"] for pr in summary["producers"]]
    assert all(len(name) <= p.MAX_NAME for name in names)


def joined(stats: dict) -> int:
    return len(stats.get("producers", [])) + stats.get("producers_unlisted", {}).get("count", 0)


def test_five_hundred_producers_that_say_hello_and_vanish(tmp_path: Path) -> None:
    """This process is one peer: ring.max_producers_per_peer of its ghosts join, the rest
    are refused; the honest producers hold a key of their own."""
    n = 400
    ring = {"lease_s": 0.5, "heartbeat_s": 0.1}
    config, keys = keyed(tmp_path, ("honest",), items=n, delay_s=0.01, ring=ring)
    with stager_thread(config) as stager, StatsReader(stager.stats) as stats:
        cfg, client = stager.cfg, stager.client()
        with zmq.Context() as ctx:
            for i in range(500):
                with ctx.socket(zmq.DEALER) as sock:
                    sock.setsockopt(zmq.LINGER, 10_000)  # a loaded machine
                    sock.connect(stager.control)
                    name = f"ghost-{i:03d}-" + "x" * 100  # as long as a name may be
                    hello = p.Hello(name, 10_000 + i, "far", True, "t", "", config_fingerprint(cfg))
                    sock.send_multipart(p.encode(hello))
        cap = cfg.ring.max_producers_per_peer
        seen = stats.first(lambda s: joined(s) >= cap, 10, "the ghosts")
        assert joined(seen) == cap
        # The stats stay under their limit by construction: 32 listed, the rest summed.
        assert len(seen["producers"]) <= 32
        with producer_threads(cfg, stager.tcp, n=2, keys=load_client(keys["honest"])):
            items = consume(client)
            late = stats.latest()
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    # Every ghost is either joined or refused. How many joined depends on the machine:
    # a ghost forgotten after FORGET_LEASES silent leases frees its place for a later one.
    # (An honest producer that said HELLO again counts as joined too: hence the bounds.)
    refused, joins = summary["dropped"]["refused-peer"], summary["counters"]["joined"] - 2
    assert refused <= 500 - cap and refused + joins >= 500, (refused, joins)
    # Forgotten after FORGET_LEASES silent leases: only the real producers remain.
    assert late.get("producers_unlisted", {}).get("count", 0) == 0
    assert all(not pr["name"].startswith("ghost") for pr in late["producers"])


def stamped_rows(cfg, item: int) -> list[np.ndarray]:
    """What a producer writes for a synthetic item, in ring field order."""
    sample = SyntheticSource(cfg).prepare(item)
    return [sample.tokens, sample.mel]


def got(sock: zmq.Socket, kind: type) -> bool:
    """Read one message if one comes within 100 ms: is it a `kind`?"""
    return bool(sock.poll(100)) and isinstance(p.decode(sock.recv_multipart())[0], kind)


def fill(places: Places, cfg, g: p.GrantEntry) -> p.Ready:
    """Write g's item into its place, sealed, as a producer does; its READY."""
    record = places.record(g.batch, g.place)
    record["writing_generation"] = g.generation
    dst = places.fields(g.batch, g.shape, g.place)
    pads = places.pads if g.batch >= 0 else None
    lengths, checksum, why = write_sample(
        dst, stamped_rows(cfg, g.item), pads, places.names, cfg.vocab_size
    )
    assert not why, why
    record["sealed_generation"] = g.generation
    return p.Ready.of([p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, 0)])


def fill_two_and_scribble(sock: zmq.Socket, cfg) -> None:
    """Say HELLO, take two grants and fill both; after the second's READY is accepted
    (its batch waits for the first) write into its place as a stale writer would; then
    BYE, and wait for its answer."""
    hello = p.Hello("stale", os.getpid(), "pod-7", False, "t", "", config_fingerprint(cfg))
    sock.send_multipart(p.encode(hello))
    welcome, _ = p.decode(sock.recv_multipart())
    sock.send_multipart(p.encode(p.Request(2)))
    grant, _ = p.decode(sock.recv_multipart())
    assert isinstance(grant, p.Grant) and len(grant.places) == 2
    places = places_of(cfg, welcome)
    try:
        g0, g1 = sorted(grant.entries(), key=lambda g: g.position)
        sock.send_multipart(p.encode(fill(places, cfg, g1)))
        # Accepted (the stager wrote READY into the place's record); its batch waits for
        # position 0, so it is not checked yet.
        record = places.record(g1.batch, g1.place)
        wait_for(lambda: record["state"][0] == SlotState.READY, 10, "READY accepted")
        places.fields(g1.batch, g1.shape, g1.place)[0][0] = 0  # the stale write, in tokens
        sock.send_multipart(p.encode(fill(places, cfg, g0)))
        sock.send_multipart(p.encode(p.Bye(0, {})))  # a re-grant to us comes back at once
        # Its answer: both READYs and the BYE were handled before the socket closes
        # (linger 0 drops what has not left).
        wait_for(lambda: got(sock, p.ByeAck), 10, "BYE_ACK", interval_s=0)
    finally:
        close_places(places)


def test_a_stale_write_after_ready_is_caught_by_the_check_after_copy(tmp_path: Path) -> None:
    """Plays a local producer that fills two places, then, as a stale writer the fence
    could not see (another PID namespace), scribbles over one after its READY. The
    stager must not deliver those bytes: it re-grants the item and counts it torn."""
    n = 64
    with stager_thread(small(tmp_path, items=n)) as stager:
        cfg, client = stager.cfg, stager.client()
        with peer_socket(stager.control) as sock:
            fill_two_and_scribble(sock, cfg)
        with producer_threads(cfg, stager.control):
            items = consume(client)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)  # consume() checked every row's stamp
    # Rows changed under an intact seqlock: a stale writer's doing, not the grantee's
    # (no strike); the item is granted again.
    counters = summary["counters"]
    assert counters["torn"] == 1 and summary["dropped"]["torn"] == 1
    assert counters["strikes"] == 0


def test_key_files_are_private_and_readable_keys_are_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    bundle = generate(keys, "worker-a")
    for folder in (keys, keys / "authorized", bundle):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    for secret in (keys / "server.key_secret", bundle / "client.key_secret"):
        assert secret.stat().st_mode & 0o777 == 0o600, secret
    load_server(keys), load_client(bundle)  # as made, they load
    (bundle / "client.key_secret").chmod(0o644)
    with pytest.raises(KeysError, match="chmod 600"):
        load_client(bundle)
