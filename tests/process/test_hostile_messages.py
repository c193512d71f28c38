"""Fuzzed frames on the live sockets of a stager process, real producers beside them:
the run still delivers its epoch exactly once, the stager stays up and its memory does
not grow, and the fuzzing process is banned for what it sent. The other hostile
messages play against the stager in the test process (tests/unit/test_hostile_messages.py)."""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.processes import RSS_SLACK_KB, rss_kb
from tests.support.runs import Run, finish, rid

pytestmark = pytest.mark.slow


# Payload frames a READY may not have (one per sample field at most).
TOO_MANY = p.MAX_PAYLOAD_FRAMES + 1


def fuzz_frames(rng: random.Random, n_places: int, n_fields: int) -> list[bytes]:
    """One hostile message: a mutated valid frame, a wrong type, a lie about places."""
    pick = rng.randrange(10)
    k, big = rng.randint(0, 3), rng.choice([0, 1, n_places, 2**31, 2**63 - 1, -1])
    ready = p.Ready(
        rng.randrange(-1, 10**3),
        [rng.randrange(-2, n_places + 2) for _ in range(k)],
        [rng.randrange(0, 10**6) for _ in range(k)],
        [rng.randint(-1, 100) for _ in range(k * n_fields)],
        [0] * k,
        [0] * k,
    )
    valid = rng.choice(
        [
            ready,
            p.Skip(
                rng.randrange(10**3), rng.randrange(-1, n_places + 1), big, "fuzz", "/x", "audio"
            ),
            p.Heartbeat(big, {"decoded": "many", "cache_hits": big}),
            p.Request(big),
            p.Crash("fuzz", "x" * rng.randrange(0, 60_000)),
            p.BatchFree(rng.randrange(-1, 4), big),
            p.StepStats(1, 0.1, 0.1, float("nan"), 1, 1),
        ]
    )
    frames = [bytes(f) for f in p.encode(valid)]
    header = bytearray(frames[0])
    if pick == 0:  # flipped bytes
        for _ in range(rng.randint(1, 4)):
            header[rng.randrange(len(header))] ^= 1 << rng.randrange(8)
    elif pick == 1:  # truncated
        header = header[: rng.randrange(len(header))]
    elif pick == 2:  # a kind of another message with these fields
        header = bytearray(
            msgpack.packb([p.VERSION, rng.randint(-1, 40), *valid.__dict__.values()])
        )
    elif pick == 3:  # huge lists
        size = rng.choice([4097, 5000])
        header = bytearray(msgpack.packb([p.VERSION, int(p.Kind.READY), *[[0] * size] * 8]))
    elif pick == 4:  # wrong types
        header = bytearray(
            msgpack.packb([p.VERSION, int(p.Kind.READY), "a", 1.5, None, {}, b"", [], "k", 2])
        )
    elif pick == 5:  # extra frames (a payload on a control message, or too many)
        return [bytes(header), *[b"\0" * rng.randrange(64)] * rng.choice([1, TOO_MANY, 20])]
    elif pick == 6:  # a remote-style READY with payload frames of the wrong sizes
        return [bytes(header), *[os.urandom(rng.randrange(256)) for _ in range(n_fields)]]
    elif pick == 7:  # random bytes
        header = bytearray(os.urandom(rng.randrange(1, 128)))
    return [bytes(header), *frames[1:]]  # 8, 9: valid frames that lie


def test_fuzzed_control_messages_are_dropped_and_the_epoch_completes(tmp_path: Path) -> None:
    n, n_msgs = 400, 2000
    cfg_path = small(tmp_path, items=n, delay_s=0.005)
    cfg = load_config(cfg_path)
    n_fields, prints = len(cfg.sample_fields()), config_fingerprint(cfg)
    run_id = rid()
    sent = collections.Counter()
    with Run(cfg_path, run_id, tmp_path) as run:
        stager = run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        control = endpoints(cfg, run_id).control
        rss0 = rss_kb(stager.pid)

        def fuzz() -> None:
            rng = random.Random(2024)
            with zmq.Context() as ctx:
                stranger, fake = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
                for sock in (stranger, fake):
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(control)
                # Another host's name: its grants are freed, not fenced, once it falls silent.
                fake.send_multipart(p.encode(p.Hello("fuzz", 1, "fuzz-1", False, "t", "", prints)))
                for i in range(n_msgs):
                    sock = fake if i % 2 else stranger
                    sock.send_multipart(fuzz_frames(rng, cfg.max_batch_rows, n_fields))
                    sent["fake" if i % 2 else "stranger"] += 1
                    while fake.poll(0):
                        fake.recv_multipart()  # grants it will never fill, heartbeats
                    if i % 50 == 0:  # the flood's own pace, not a wait: about 1000 a second
                        time.sleep(0.01)
                stranger.close()
                fake.close()

        thread = threading.Thread(target=fuzz, daemon=True)
        thread.start()
        try:
            items = consume(client, timeout_s=30)
            thread.join(20)
            assert not thread.is_alive()
            rss1 = rss_kb(stager.pid)
        finally:
            client.close()
        summary = finish(run, "producers")
    assert_exactly_once(items, cfg, n)
    dropped = summary["dropped"]
    assert sum(sent.values()) == n_msgs, sent
    assert dropped.get("malformed", 0) >= 500 and dropped.get("unknown-peer", 0) >= 1, dropped
    assert summary["counters"]["peers_banned"] >= 1  # the fuzzing process, for its garbage
    assert rss1 - rss0 < RSS_SLACK_KB, f"stager RSS {rss0} -> {rss1} KiB"
