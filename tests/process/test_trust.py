"""Trust boundaries, tested as an attacker would: real stager and producers, hand-played
peers that lie (key files: tests/unit/test_trust.py). Each run must keep the stager up,
deliver its epoch exactly once with every row checked against the item it claims to
be, and count each refusal by reason."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from ringfeed.consumer.stager.run_secret import read_consumer_secret
from ringfeed.producer.sources import SyntheticSource
from ringfeed.scripts.runner import worker_pids
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints, run_dir
from ringfeed.shared.memory.ring import SEGMENT_PREFIX, SHM_DIR, Ring, SlotState, rows_checksum
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.run.process import die_with_parent
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.paths import REPO
from tests.support.peers import peer_socket
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.processes import CLI
from tests.support.runs import Run, finish, rid
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


def test_only_the_runs_consumer_can_be_the_consumer(tmp_path: Path) -> None:
    port = free_port()
    n = 300
    cfg_path = small(
        tmp_path, items=n, transport={"kind": "tcp", "host": "127.0.0.1", "port": port}
    )
    cfg, run_id = load_config(cfg_path), rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        secret = run.poll_for(
            lambda: read_consumer_secret(run_dir(cfg, run_id)), 30, "the consumer secret"
        )
        assert (run_dir(cfg, run_id) / "consumer.secret").stat().st_mode & 0o777 == 0o600
        local, remote = endpoints(cfg, run_id).control, f"tcp://127.0.0.1:{port}"
        with peer_socket(local) as impostor, peer_socket(remote) as far:
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
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)
    dropped = collections.Counter(summary["dropped"])
    assert dropped["unauthorized"] >= 4, dropped
    assert dropped["malformed"] >= 1 and dropped["unknown-peer"] >= 2, dropped


def test_producer_claims_give_no_more_than_a_remote_producer_has(tmp_path: Path) -> None:
    port = free_port()
    n = 300
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=0.004,
        transport={"kind": "tcp", "host": "127.0.0.1", "port": port},
        producers={"workers": 1},
    )
    cfg, run_id = load_config(cfg_path), rid()
    head = socket.gethostname()
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        joined = stats.first(lambda s: s.get("producers"), 20, "a producer joining")
        live = [pr["name"] for pr in joined["producers"]]
        remote = f"tcp://127.0.0.1:{port}"
        with peer_socket(remote) as liar, peer_socket(remote) as thief:
            # A tcp peer that says it is local, on the head's host, with pid 1.
            liar.send_multipart(
                p.encode(p.Hello("liar", 1, head, False, "t1", "", config_fingerprint(cfg)))
            )
            # A second HELLO under a live producer's name: refused, not an eviction.
            thief.send_multipart(
                p.encode(p.Hello(live[0], 4242, head, False, "t2", "", config_fingerprint(cfg)))
            )
            # A name of 100 KiB: over ZMQ_MAXMSGSIZE, so libzmq closes the link before
            # Python sees it (over the header limit, decode would drop it as malformed).
            huge = [p.VERSION, int(p.Kind.HELLO), "n" * 102400, 7, head, False, "t", "", {}]
            thief.send_multipart([msgpack.packb(huge)])
            liar_row = wait_for(lambda: row_of(stats.latest(), "liar"), 10, "the liar's row")
            items = consume(client)
        client.close()
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)
    assert liar_row is not None and liar_row["remote"], liar_row  # believed only as remote
    names = [pr["name"] for pr in summary["producers"]]
    assert live[0] in names and names.count(live[0]) == 1
    dropped = collections.Counter(summary["dropped"])
    assert dropped["refused-hello"] >= 1, dropped
    assert all(len(name) <= p.MAX_NAME for name in names)


def row_of(stats: dict, name: str) -> dict | None:
    """The stats row of the producer called name, if listed."""
    return next((pr for pr in stats.get("producers", []) if pr["name"] == name), None)


def joined(stats: dict) -> int:
    return len(stats.get("producers", [])) + stats.get("producers_unlisted", {}).get("count", 0)


def test_five_hundred_producers_that_say_hello_and_vanish(tmp_path: Path) -> None:
    n = 400
    cfg_path = small(tmp_path, items=n, delay_s=0.01, ring={"lease_s": 0.5, "heartbeat_s": 0.1})
    cfg, run_id = load_config(cfg_path), rid()
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        client = run.client(timeout_s=30)
        with zmq.Context() as ctx:
            for i in range(500):
                with ctx.socket(zmq.DEALER) as sock:
                    sock.setsockopt(zmq.LINGER, 1000)
                    sock.connect(endpoints(cfg, run_id).control)
                    name = f"ghost-{i:03d}-" + "x" * 100  # as long as a name may be
                    hello = p.Hello(name, 10_000 + i, "far", True, "t", "", config_fingerprint(cfg))
                    sock.send_multipart(p.encode(hello))
        # One process is one peer: ring.max_producers_per_peer of them join, the rest
        # are refused.
        cap = cfg.ring.max_producers_per_peer
        seen = stats.first(lambda s: joined(s) >= cap, 10, "the ghosts")
        assert joined(seen) == cap
        # The stats stay under their limit by construction: 32 listed, the rest summed.
        assert len(seen["producers"]) <= 32
        run.start("producers")
        items = consume(client)
        late = stats.latest()
        client.close()
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)
    assert summary["dropped"]["refused-peer"] == 500 - cap
    # Forgotten after FORGET_LEASES silent leases: only the real producers remain.
    assert late.get("producers_unlisted", {}).get("count", 0) == 0
    assert all(not pr["name"].startswith("ghost") for pr in late["producers"])


def stamped_rows(cfg, item: int) -> list[np.ndarray]:
    """What a producer writes for a synthetic item, in ring field order."""
    sample = SyntheticSource(cfg).prepare(item)
    return [sample.tokens, sample.mel]


def test_a_stale_write_after_ready_is_caught_by_the_check_after_copy(tmp_path: Path) -> None:
    """Plays a local producer that fills two slots, then, as a stale writer the fence
    could not see (another PID namespace), scribbles over one after its READY. The
    stager must not deliver those bytes: it re-grants the item and counts it torn."""
    n = 64
    cfg_path = small(tmp_path, items=n, producers={"workers": 1})
    cfg, run_id = load_config(cfg_path), rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        client = run.client(timeout_s=30)
        with peer_socket(endpoints(cfg, run_id).control) as sock:
            hello = p.Hello("stale", os.getpid(), "pod-7", False, "t", "", config_fingerprint(cfg))
            sock.send_multipart(p.encode(hello))
            welcome, _ = p.decode(sock.recv_multipart())
            sock.send_multipart(p.encode(p.Request(2)))
            grant, _ = p.decode(sock.recv_multipart())
            assert isinstance(grant, p.Grant) and len(grant.slots) == 2
            ring = Ring.attach(welcome.ring_name)
            entries = sorted(
                zip(grant.positions, grant.slots, grant.generations, grant.items, strict=True)
            )
            try:
                (_, s0, g0, i0), (_, s1, g1, i1) = entries
                lengths1 = fill(ring, cfg, s1, g1, i1)
                ready1 = p.Ready([s1], [g1], [i1], lengths1, [expected(cfg, i1)], [0])
                sock.send_multipart(p.encode(ready1))
                # Accepted (the stager wrote READY into the slot's record); it waits
                # behind position 0 (plan order), so it is not copied yet.
                wait_for(lambda: ring.slots[s1]["state"] == SlotState.READY, 10, "READY accepted")
                ring.view("tokens")[s1][0] = 0  # the stale write
                lengths0 = fill(ring, cfg, s0, g0, i0)
                ready0 = p.Ready([s0], [g0], [i0], lengths0, [expected(cfg, i0)], [0])
                sock.send_multipart(p.encode(ready0))
                sock.send_multipart(p.encode(p.Bye(0, {})))  # a re-grant to us comes back at once
                # Its answer: both READYs and the BYE were handled before the socket
                # closes (linger 0 drops what has not left).
                wait_for(lambda: got(sock, p.ByeAck), 10, "BYE_ACK", interval_s=0)
            finally:
                ring.close()
            run.start("producers")
            items = consume(client)
        client.close()
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)  # consume() checked every row's stamp
    # Rows changed under an intact seqlock: a stale writer's doing, not the grantee's
    # (no strike); the item is granted again.
    counters = summary["counters"]
    assert counters["torn"] == 1 and summary["dropped"]["torn"] == 1
    assert counters["strikes"] == 0


def got(sock: zmq.Socket, kind: type) -> bool:
    """Read one message if one comes within 100 ms: is it a `kind`?"""
    return bool(sock.poll(100)) and isinstance(p.decode(sock.recv_multipart())[0], kind)


def fill(ring: Ring, cfg, slot: int, generation: int, item: int) -> list[int]:
    header = ring.slots[slot]
    header["writing_generation"] = generation
    rows = stamped_rows(cfg, item)
    for name, arr in zip(ring.fields, rows, strict=True):
        ring.view(name)[slot][: len(arr)] = arr
        ring.view(name)[slot][len(arr) :] = 0
    header["sealed_generation"] = generation
    return [len(a) for a in rows]


def expected(cfg, item: int) -> int:
    return rows_checksum(stamped_rows(cfg, item))


def can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--uts", "--fork", "true"], capture_output=True)
    return probe.returncode == 0


def pod_holds_nothing(stats: dict) -> bool:
    """No producer of the pod (host pod-7) holds a grant: any it held were taken back."""
    return all(pr["grants"] == 0 for pr in stats["producers"] if pr["host"] == "pod-7")


def stop_the_pods_worker(pod_pid: int, stats: StatsReader, lease_s: float) -> int:
    """SIGSTOP the worker of the pool inside the pod (pod_pid: its unshare) past its
    lease, until the stager took back its grants; SIGCONT it; returns its pid."""
    children = Path(f"/proc/{pod_pid}/task/{pod_pid}/children").read_text()
    workers = [w for pool_pid in map(int, children.split()) for w in worker_pids(pool_pid)]
    assert workers, "the pod's worker is not running"
    os.kill(workers[0], signal.SIGSTOP)
    try:
        time.sleep(2.5 * lease_s)  # the fault: stopped past its lease, grants queued
        stats.first(pod_holds_nothing, 10, "the stopped pod's grants taken back")
    finally:
        os.kill(workers[0], signal.SIGCONT)
    return workers[0]


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare (PID and UTS namespaces)")
def test_a_producer_in_another_pid_and_uts_namespace_never_delivers_stale_rows(
    tmp_path: Path,
) -> None:
    """A pool in its own PID and UTS namespaces (a pod sharing /dev/shm): its pids and
    host name mean nothing here, so it cannot be fenced. Its worker is stopped past its
    lease three times while its slots are granted again; every row must still be right."""
    n, lease_s = 600, 0.5
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=0.004,
        features={"max_frames": 1024},  # slots of 320 KiB: writes take a while
        ring={"lease_s": lease_s, "heartbeat_s": 0.1},
        producers={"workers": 1},
    )
    cfg, run_id = load_config(cfg_path), rid()
    cli = [*CLI, "producers", str(cfg_path), "--run-id", run_id]
    pod_cmd = ["unshare", "--pid", "--uts", "--fork", "--kill-child", "sh", "-c",
               'hostname pod-7 && exec "$@"', "sh", *cli]  # fmt: skip
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        run.start("producers")
        pod = subprocess.Popen(pod_cmd, cwd=REPO, preexec_fn=die_with_parent)
        run.procs["pod"] = pod
        client = run.client(timeout_s=30)
        stopped = []

        def stop_the_pod(n_items: int) -> None:
            if n_items >= 100 * (len(stopped) + 1) and len(stopped) < 3:
                stopped.append(stop_the_pods_worker(pod.pid, stats, lease_s))

        items = consume(client, on_batch=stop_the_pod)
        client.close()
        summary = finish(run, run_id, "producers", "pod")
    assert len(stopped) == 3
    assert_exactly_once(items, cfg, n)  # consume() checked every row's stamp
    pod_rows = [pr for pr in summary["producers"] if pr["host"] == "pod-7"]
    assert pod_rows and not pod_rows[0]["remote"]  # it maps the ring, like a local one
    # The stale-writer situation did arise: woken, the worker found grants it still held
    # granted again (their generation moved on) and dropped them; any write that slips
    # past that check is caught by the stager's check after copying ("torn").
    assert pod_rows[0]["work"]["taken_back"] + summary["counters"]["torn"] >= 1, summary


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")
def test_another_users_segment_in_dev_shm_does_not_stop_a_run(tmp_path: Path) -> None:
    # Another user's file under our own prefix (the worst case: a squatter) and one
    # under theirs: neither may stop the stager or `ringfeed cleanup`.
    squat = [SHM_DIR / f"{SEGMENT_PREFIX}squat-samples", SHM_DIR / "ringfeed-65534-x-samples"]
    for path in squat:
        path.write_bytes(b"\0" * 64)
        os.chown(path, 65534, 65534)
        os.utime(path, (time.time() - 3600, time.time() - 3600))  # old: looks stale
    try:
        n = 120
        cfg_path = small(tmp_path, items=n)
        cfg, run_id = load_config(cfg_path), rid()
        with Run(cfg_path, run_id, tmp_path) as run:
            run.start("stager")
            run.start("producers")
            client = run.client(timeout_s=30)
            items = consume(client)
            client.close()
            finish(run, run_id, "producers")
        assert_exactly_once(items, cfg, n)
        cleanup = subprocess.run([*CLI, "cleanup"], cwd=REPO, capture_output=True)
        assert cleanup.returncode == 0, cleanup.stderr
    finally:
        for path in squat:
            path.unlink(missing_ok=True)
