"""Reliability under faults: killed, stopped and remote producers, fuzzed sockets, full shm.

Real stager and producer processes; the test process is the consumer. Every
run checks the three things a fault must never cost: each item of the epoch
delivered exactly once, no wait without a bound, and no segment of the run
left in /dev/shm. Where a run is long enough to mean something, the stager's
resident memory is compared before and after the fault.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from consumer.slot_manager import EpochPlan
from shared import protocol as p
from shared.config import Config, endpoints, load_config
from shared.keys import generate
from shared.ring import Ring, SlotState
from tests.runs import REPO, Run, shm_segments
from tests.test_remote_producers import free_port
from tests.test_transport_e2e import StatsReader, consume, rid, small, worker_pids

pytestmark = pytest.mark.slow

# The stager's RSS may grow by this much over a short faulty run (allocator noise).
RSS_SLACK_KB = 16 * 1024


def rss_kb(pid: int) -> int:
    """Resident set size of a live process, KiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def live_workers(pool_pid: int) -> list[int]:
    """worker_pids, tolerating a worker that exits while /proc is read."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return worker_pids(pool_pid)
    return []


def send_signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def assert_exactly_once(items: list[int], cfg: Config, n_items: int) -> None:
    """The delivered multiset is the epoch's plan; deterministic mode also keeps its order."""
    plan = EpochPlan(n_items, cfg.stager.seed, 1)
    expected = [plan.item_at(i) for i in range(n_items)]
    counts = collections.Counter(items)
    lost = sorted(set(expected) - set(counts))
    dup = sorted(i for i, c in counts.items() if c > 1)
    assert not lost and not dup, f"lost {lost[:20]}, duplicated {dup[:20]}"
    assert items == expected


def finish(run: Run, run_id: str, *verbs: str) -> dict:
    """Wait (bounded) for the stager and `verbs` to exit 0; no segment left; stager.json."""
    for verb in ("stager", *verbs):
        assert run.wait(verb, 20) == 0, f"{verb} failed\n{run.logs()}"
    assert shm_segments(run_id) == []
    return run.json("stager.json")


def test_producers_sigkilled_repeatedly_still_deliver_the_epoch_once(tmp_path: Path) -> None:
    n = 800
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=0.005,
        producers={"workers": 2, "restart_backoff_s": 0.05, "max_restarts": 20},
    )
    cfg = load_config(cfg_path)
    run_id, rng, kills = rid(), random.Random(7), []
    with Run(cfg_path, run_id, tmp_path) as run:
        stager = run.start("stager")
        pool = run.start("producers")
        client = run.client(timeout_s=30)
        done = threading.Event()

        def killer() -> None:
            while len(kills) < 5 and not done.wait(0.3):
                pids = live_workers(pool.pid)
                if pids and send_signal(victim := rng.choice(pids), signal.SIGKILL):
                    kills.append(victim)

        rss: list[int] = []
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            items = consume(client, on_batch=lambda k: rss.append(rss_kb(stager.pid)))
            rss.append(rss_kb(stager.pid))
        finally:
            done.set()
            thread.join(5)
            client.close()
        summary = finish(run, run_id, "producers")
    assert len(kills) >= 3, f"only {len(kills)} kills landed during the epoch"
    assert_exactly_once(items, cfg, n)
    # The pool restarted each one (the stager counts a restart only when the new HELLO
    # beats its check for the dead pid, so its counter proves nothing here).
    assert run.logs(tail=1_000_000).count("died (signal SIGKILL)") == len(kills)
    assert summary["counters"]["reclaimed"] >= 1
    assert rss[-1] - rss[0] < RSS_SLACK_KB, f"stager RSS {rss[0]} -> {rss[-1]} KiB"


def stop_a_producer_past_its_lease(tmp_path: Path, patience_s: float) -> tuple[list, dict]:
    """SIGSTOP one of two producers for 2.5 leases mid-epoch, then SIGCONT it.

    patience_s: the producers' own ring.lease_s, how long a producer waits for word
    from the stager before it says HELLO again on a new socket (the stager's is 1 s).
    Returns (delivered items, what was seen) with seen["summary"] = stager.json."""
    n, lease_s = 400, 1.0
    # credits 4: a READY leaves after each sample, so the woken producer announces the
    # slot it was writing when stopped at once.
    over = {"producers": {"workers": 2, "credits": 4}}
    cfg_path = small(tmp_path, items=n, delay_s=0.01, ring={"lease_s": lease_s}, **over)
    (tmp_path / "pool").mkdir()
    pool_cfg = small(tmp_path / "pool", items=n, delay_s=0.01, ring={"lease_s": patience_s}, **over)
    cfg = load_config(cfg_path)
    run_id, seen, stopped = rid(), {"fenced": 0}, []
    with Run(cfg_path, run_id, tmp_path) as run:
        stager = run.start("stager")
        run.config = pool_cfg
        pool = run.start("producers")
        run.config = cfg_path
        client = run.client(timeout_s=30)
        stats = StatsReader(endpoints(cfg, run_id).stats)

        def watch_and_resume() -> None:
            """While it is stopped its slots become FENCED; then wake it."""
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.5 * lease_s:
                fenced = stats.latest().get("slots", {}).get("FENCED", 0)
                seen["fenced"] = max(seen["fenced"], fenced)
            send_signal(stopped[0], signal.SIGCONT)

        thread = threading.Thread(target=watch_and_resume, daemon=True)

        def stop_one(n_items: int) -> None:
            if n_items >= 40 and not stopped:
                stopped.append(live_workers(pool.pid)[0])
                seen["rss0"] = rss_kb(stager.pid)
                os.kill(stopped[0], signal.SIGSTOP)
                thread.start()

        try:
            seen["items"] = consume(client, on_batch=stop_one, timeout_s=30)
            thread.join(10)
            seen["rss1"] = rss_kb(stager.pid)
        finally:
            for pid in stopped:
                send_signal(pid, signal.SIGCONT)
            client.close()
            stats.close()
        seen["summary"] = finish(run, run_id, "producers")
    assert_exactly_once(seen["items"], cfg, n)  # consume() also checked every row's stamp
    assert seen["fenced"] >= 1, "the stopped producer's slots were never FENCED"
    assert seen["summary"]["counters"]["reclaimed"] >= 1
    assert seen["rss1"] - seen["rss0"] < RSS_SLACK_KB
    return seen["items"], seen


def test_stopped_producer_is_fenced_and_its_late_ready_dropped(tmp_path: Path) -> None:
    # A patient producer keeps its socket, so its late READY reaches the stager.
    _, seen = stop_a_producer_past_its_lease(tmp_path, patience_s=30.0)
    summary = seen["summary"]
    assert summary["dropped"].get("stale", 0) >= 1, summary["dropped"]
    assert summary["slots"].get("FENCED", 0) == 0, summary["slots"]


def test_stopped_producer_that_says_hello_again_gets_its_fenced_slots_back(
    tmp_path: Path,
) -> None:
    # Same patience as the stager's lease: on waking, the producer drops its grants and
    # says HELLO again from the same pid. It can no longer write the slots fenced under
    # its old identity, so they must return to FREE, not stay fenced until it dies.
    _, seen = stop_a_producer_past_its_lease(tmp_path, patience_s=1.0)
    summary = seen["summary"]
    assert summary["slots"].get("FENCED", 0) == 0, summary["slots"]


def test_a_woken_producer_keeps_its_queued_grants_until_told_otherwise(tmp_path: Path) -> None:
    """A local producer stopped past its lease holds several grants in its queue (credits).

    When it speaks again its fenced slots are unfenced at once, but nothing tells it
    that the grants still queued in it are void: a real worker goes on to write them
    (producer/worker.py fills its queue in order). So none of those slots may be
    granted to another producer unless the stager first told this one to drop its
    grants (REHELLO). This test plays that producer by hand and watches the ring."""
    n, lease_s = 400, 1.0
    cfg_path = small(
        tmp_path, items=n, delay_s=0.005, ring={"lease_s": lease_s}, producers={"workers": 1}
    )
    cfg = load_config(cfg_path)
    run_id, seen = rid(), {"regranted": [], "rehello": None}
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)

        def woken_producer() -> None:
            with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(endpoints(cfg, run_id).control)
                me = socket.gethostname()
                sock.send_multipart(p.encode(p.Hello("woken", os.getpid(), me, False)))
                grants: set[tuple[int, int]] = set()

                def drain(timeout_ms: int) -> list:
                    out = []
                    while sock.poll(timeout_ms):
                        msg, _ = p.decode(sock.recv_multipart())
                        out.append(msg)
                        if isinstance(msg, p.Grant):
                            grants.update(zip(msg.slots, msg.generations, strict=True))
                        if isinstance(msg, p.Rehello) and seen["rehello"] is None:
                            seen["rehello"] = time.monotonic()
                        timeout_ms = 0
                    return out

                welcome = next(m for m in drain(5000) if isinstance(m, p.Welcome))
                sock.send_multipart(p.encode(p.Request(4)))
                deadline = time.monotonic() + 10
                while len(grants) < 2 and time.monotonic() < deadline:
                    drain(100)
                held = sorted(grants)
                seen["held"] = held
                time.sleep(2.0 * lease_s)  # SIGSTOPped: silent past the lease
                (slot0, gen0), queued = held[0], held[1:]
                k = len(cfg.sample_fields())
                sock.send_multipart(p.encode(p.Ready([slot0], [gen0], [-1], [1] * k, [0], [0])))
                ring = Ring.attach(welcome.ring_name, writable=False)
                try:
                    t0 = time.monotonic()
                    while time.monotonic() - t0 < 3.0 and len(seen["regranted"]) < len(queued):
                        drain(10)
                        for slot, gen in queued:
                            h = ring.slots[slot]
                            g = int(h["generation"])
                            live = h["state"] in (SlotState.GRANTED, SlotState.WRITING)
                            mine = (slot, g) in grants
                            if g > gen + 1 and live and not mine and seen["rehello"] is None:
                                seen["regranted"].append((slot, gen, g))
                                queued = [q for q in queued if q[0] != slot]
                finally:
                    ring.close()
                sock.send_multipart(p.encode(p.Bye(0)))

        thread = threading.Thread(target=woken_producer, daemon=True)
        thread.start()
        try:
            items = consume(client, timeout_s=30)
            thread.join(15)
        finally:
            client.close()
        finish(run, run_id, "producers")
    assert len(seen.get("held", [])) >= 2, "the hand-played producer got too few grants"
    assert_exactly_once(items, cfg, n)
    assert seen["regranted"] == [], (
        f"slots still queued in the woken producer (slot, its generation, new generation) "
        f"were granted to another producer without a REHELLO: {seen['regranted']}"
    )


def test_remote_tcp_producer_sigkilled_mid_send(tmp_path: Path) -> None:
    n, port = 400, free_port()
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=0.004,
        transport={"kind": "tcp", "host": "127.0.0.1", "port": port},
        producers={"workers": 1, "restart_backoff_s": 0.05, "max_restarts": 20},
    )
    cfg = load_config(cfg_path)
    run_id, kills = rid(), []
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        remote = run.start(
            "producers", "--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", "far"
        )
        run.procs["remote"] = remote
        client = run.client(timeout_s=30)

        def kill_remote(n_items: int) -> None:
            # Twice, 100 items apart: a remote worker sends a READY after every sample.
            if n_items >= 60 + 100 * len(kills) and len(kills) < 2:
                pids = live_workers(remote.pid)
                if pids and send_signal(pids[0], signal.SIGKILL):
                    kills.append(pids[0])

        try:
            items = consume(client, on_batch=kill_remote, timeout_s=30)
        finally:
            client.close()
        summary = finish(run, run_id, "producers", "remote")
    assert kills, "the remote producer was never killed"
    assert_exactly_once(items, cfg, n)
    producers = {q["name"]: q for q in summary["producers"]}
    assert any(not q["remote"] and q["samples"] > 0 for q in producers.values())


def fuzz_frames(rng: random.Random, n_slots: int, n_fields: int) -> list[bytes]:
    """One hostile message: a mutated valid frame, a wrong type, a lie about slots."""
    pick = rng.randrange(10)
    k, big = rng.randint(0, 3), rng.choice([0, 1, n_slots, 2**31, 2**63 - 1, -1])
    ready = p.Ready(
        [rng.randrange(-2, n_slots + 2) for _ in range(k)],
        [rng.randrange(0, 10**6) for _ in range(k)],
        [rng.randrange(0, 10**6) for _ in range(k)],
        [rng.randint(-1, 100) for _ in range(k * n_fields)],
        [0] * k,
        [0] * k,
    )
    valid = rng.choice(
        [
            ready,
            p.Skip(rng.randrange(-1, n_slots + 1), rng.randrange(10**6), big, "fuzz", "/x"),
            p.Heartbeat(big, {"decoded": "many", "cache_hits": big}),
            p.Request(big),
            p.Crash("fuzz", "x" * rng.randrange(0, 60_000)),
            p.BatchFree(rng.randrange(-1, 4), big),
            p.StepStats(1, 0.1, 0.1, float("nan")),
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
        header = bytearray(msgpack.packb([p.VERSION, int(p.Kind.READY), *[[0] * size] * 6]))
    elif pick == 4:  # wrong types
        header = bytearray(
            msgpack.packb([p.VERSION, int(p.Kind.READY), "a", 1.5, None, {}, b"", []])
        )
    elif pick == 5:  # extra frames (a payload on a control message, or too many)
        return [bytes(header), *[b"\0" * rng.randrange(64)] * rng.choice([1, 9, 20])]
    elif pick == 6:  # a remote-style READY with payload frames of the wrong sizes
        return [bytes(header), *[os.urandom(rng.randrange(256)) for _ in range(n_fields)]]
    elif pick == 7:  # random bytes
        header = bytearray(os.urandom(rng.randrange(1, 128)))
    return [bytes(header), *frames[1:]]  # 8, 9: valid frames that lie


def test_fuzzed_control_messages_are_dropped_and_the_epoch_completes(tmp_path: Path) -> None:
    n, n_msgs = 400, 2000
    cfg_path = small(tmp_path, items=n, delay_s=0.005)
    cfg = load_config(cfg_path)
    n_fields = len(cfg.sample_fields())
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
                fake.send_multipart(p.encode(p.Hello("fuzz", 1, "fuzzhost", False)))
                for i in range(n_msgs):
                    sock = fake if i % 2 else stranger
                    sock.send_multipart(fuzz_frames(rng, cfg.ring.slots, n_fields))
                    sent["fake" if i % 2 else "stranger"] += 1
                    while fake.poll(0):
                        fake.recv_multipart()  # grants it will never fill, heartbeats
                    if i % 50 == 0:
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
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)
    dropped = summary["dropped"]
    assert sum(sent.values()) == n_msgs
    assert dropped.get("malformed", 0) >= 500, dropped
    assert dropped.get("unknown-peer", 0) >= 1 and dropped.get("stale", 0) >= 1, dropped
    assert rss1 - rss0 < RSS_SLACK_KB, f"stager RSS {rss0} -> {rss1} KiB"


def test_a_hello_with_an_out_of_range_pid_does_not_kill_the_stager(tmp_path: Path) -> None:
    """HELLO.pid is any 64-bit int on the wire; os.kill takes a C int."""
    n = 200
    cfg_path = small(tmp_path, items=n, delay_s=0.002)
    cfg = load_config(cfg_path)
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as rogue:
            rogue.setsockopt(zmq.LINGER, 0)
            rogue.connect(endpoints(cfg, run_id).control)
            rogue.send_multipart(p.encode(p.Hello("huge", 2**40, socket.gethostname(), False)))
            try:
                items = consume(client, timeout_s=30)
            finally:
                client.close()
        finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)


def test_a_second_hello_on_one_socket_does_not_orphan_its_grants(tmp_path: Path) -> None:
    """A peer that says HELLO twice on one identity, holding grants, then falls silent:
    its grants must still expire with the lease, or their positions never finish."""
    n = 200
    cfg_path = small(tmp_path, items=n, delay_s=0.002, producers={"workers": 1})
    cfg = load_config(cfg_path)
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as peer:
            peer.setsockopt(zmq.LINGER, 0)
            peer.connect(endpoints(cfg, run_id).control)
            hello = p.encode(p.Hello("twice", 1, "elsewhere", False))
            peer.send_multipart(hello)
            peer.send_multipart(p.encode(p.Request(4)))
            got: list = []
            deadline = time.monotonic() + 10
            while not any(isinstance(m, p.Grant) for m in got) and time.monotonic() < deadline:
                if peer.poll(100):
                    got.append(p.decode(peer.recv_multipart())[0])
            peer.send_multipart(hello)  # then silence: no READY, no heartbeat
            try:
                items = consume(client, timeout_s=15)
            finally:
                client.close()
        finish(run, run_id, "producers")
    assert any(isinstance(m, p.Grant) for m in got), "the peer was never granted a slot"
    assert_exactly_once(items, cfg, n)


def test_rings_larger_than_free_shm_fail_fast_naming_ring_slots(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, ring={"slots": 10_000_000})  # ~200 GB of 20 KiB slots
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        t0 = time.monotonic()
        run.start("stager")
        code = run.wait("stager", 10)
        assert time.monotonic() - t0 < 10
        assert code != 0
        assert "ring.slots" in run.logs(), run.logs()
        assert shm_segments(run_id) == []
    validate = subprocess.run(
        [sys.executable, "-m", "scripts.cli", "validate", str(cfg_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert validate.returncode != 0 and "ring.slots" in validate.stderr


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def netns() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this one by a veth pair: (name, head ip, ns ip)."""
    tag = os.urandom(3).hex()
    name, host_if, ns_if = f"rf{tag}", f"rfh{tag}", f"rfn{tag}"
    base = 16 + int(tag, 16) % 200
    head_ip, ns_ip = f"10.{base}.77.1", f"10.{base}.77.2"
    if os.geteuid() != 0 or ip("netns", "add", name).returncode != 0:
        pytest.skip("needs root and `ip netns add`")
    try:
        for args in (
            ("link", "add", host_if, "type", "veth", "peer", "name", ns_if),
            ("link", "set", ns_if, "netns", name),
            ("addr", "add", f"{head_ip}/30", "dev", host_if),
            ("link", "set", host_if, "up"),
            ("-n", name, "addr", "add", f"{ns_ip}/30", "dev", ns_if),
            ("-n", name, "link", "set", ns_if, "up"),
            ("-n", name, "link", "set", "lo", "up"),
        ):
            result = ip(*args)
            if result.returncode != 0:
                pytest.skip(f"ip {' '.join(args)}: {result.stderr.strip()}")
        yield name, head_ip, ns_ip
    finally:
        ip("link", "del", host_if)
        ip("netns", "del", name)


def test_producer_in_another_network_namespace_over_veth(
    tmp_path: Path, netns: tuple[str, str, str]
) -> None:
    name, head_ip, _ = netns
    n, port = 300, free_port()
    keys = tmp_path / "keys"
    bundle = generate(keys, "ns")
    tcp = {"kind": "tcp", "host": head_ip, "port": port}
    over = {"transport": {**tcp, "keys_dir": str(keys)}, "producers": {"workers": 1}}
    cfg_path = small(tmp_path, items=n, delay_s=0.004, **over)
    (tmp_path / "ns").mkdir()
    ns_cfg = small(
        tmp_path / "ns", items=n, delay_s=0.004, transport={**tcp, "keys_dir": str(bundle)}
    )
    cfg = load_config(cfg_path)
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        out = (tmp_path / f"{run_id}-netns.log").open("w")
        run.procs["netns"] = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-m", "scripts.cli", "producers"]
            + [str(ns_cfg), "--run-id", run_id, "--remote", "--name", "netns"]
            + ["--connect", f"tcp://{head_ip}:{port}"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        client = run.client(timeout_s=30)
        try:
            items = consume(client, timeout_s=30)
        finally:
            client.close()
        summary = finish(run, run_id, "producers", "netns")
    assert_exactly_once(items, cfg, n)
    producers = {q["name"]: q for q in summary["producers"]}
    assert producers["netns-0"]["remote"] and producers["netns-0"]["samples"] > 0
