"""Reliability under faults: killed, stopped and remote producers, fuzzed sockets, full shm.

Real stager and producer processes; the test process is the consumer. Every
run checks the three things a fault must never cost: each item of the epoch
delivered exactly once, no wait without a bound, and no segment of the run
left in /dev/shm. Where a run is long enough to mean something, the stager's
resident memory is compared before and after the fault.
"""

from __future__ import annotations

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

import pytest
import zmq

from scripts.runner import REPO, worker_pids
from shared import protocol as p
from shared.config import Config, endpoints, load_config
from shared.keys import generate
from shared.ring import Ring, SlotState, shown_state
from tests.checks import assert_exactly_once, consume
from tests.peers import StatsReader, free_port, peer_socket
from tests.polling import wait_for
from tests.processes import RSS_SLACK_KB, rss_kb, send_signal
from tests.runs import Run, finish, rid, shm_segments, small

pytestmark = pytest.mark.slow


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
                pids = worker_pids(pool.pid)
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
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        stager = run.start("stager")
        run.config = pool_cfg
        pool = run.start("producers")
        run.config = cfg_path
        client = run.client(timeout_s=30)

        def watch_and_resume() -> None:
            """Wake it once its slots show FENCED and it has been stopped 2.5 leases."""
            try:
                fenced = stats.first(lambda s: s["slots"].get("FENCED", 0), 10, "FENCED slots")
                seen["fenced"] = fenced["slots"]["FENCED"]
                # The fault: silent past the stager's lease and past its own patience.
                time.sleep(max(0.0, seen["stopped_at"] + 2.5 * lease_s - time.monotonic()))
            finally:
                send_signal(stopped[0], signal.SIGCONT)

        thread = threading.Thread(target=watch_and_resume, daemon=True)

        def stop_one(n_items: int) -> None:
            if n_items >= 40 and not stopped:
                stopped.append(worker_pids(pool.pid)[0])
                seen["rss0"] = rss_kb(stager.pid)
                os.kill(stopped[0], signal.SIGSTOP)
                seen["stopped_at"] = time.monotonic()
                thread.start()

        try:
            seen["items"] = consume(client, on_batch=stop_one, timeout_s=30)
            thread.join(10)
            seen["rss1"] = rss_kb(stager.pid)
        finally:
            for pid in stopped:
                send_signal(pid, signal.SIGCONT)
            client.close()
        seen["summary"] = finish(run, run_id, "producers")
    assert_exactly_once(seen["items"], cfg, n)  # consume() also checked every row's stamp
    assert seen["fenced"] >= 1, "the stopped producer's slots were never FENCED"
    assert seen["summary"]["counters"]["reclaimed"] >= 1
    assert seen["rss1"] - seen["rss0"] < RSS_SLACK_KB
    return seen["items"], seen


def test_stopped_producer_is_fenced_and_its_late_ready_dropped(tmp_path: Path) -> None:
    # A patient producer keeps its socket, so its late READY reaches the stager and is
    # dropped as stale; or, woken before it wrote, it sees its grant's generation moved
    # on in the slot header and drops the grant itself (it reports that in heartbeats).
    _, seen = stop_a_producer_past_its_lease(tmp_path, patience_s=30.0)
    summary = seen["summary"]
    dropped_itself = sum(p["work"].get("taken_back", 0) for p in summary["producers"])
    assert summary["dropped"].get("stale", 0) + dropped_itself >= 1, summary
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


class WokenProducer:
    """Plays a local producer by hand: takes grants, goes silent past its lease, then
    READYs one slot and watches whether its other, still queued, slots are granted to
    someone else before the stager told it to drop them (REHELLO)."""

    def __init__(self, cfg: Config, run_id: str, lease_s: float) -> None:
        self.cfg, self.run_id, self.lease_s = cfg, run_id, lease_s
        self.grants: set[tuple[int, int]] = set()
        self.held: list[tuple[int, int]] = []
        self.regranted: list[tuple[int, int, int]] = []
        self.rehello: float | None = None

    def drain(self, sock: zmq.Socket, timeout_ms: int) -> list:
        out = []
        while sock.poll(timeout_ms):
            msg, _ = p.decode(sock.recv_multipart())
            out.append(msg)
            if isinstance(msg, p.Grant):
                self.grants.update(zip(msg.slots, msg.generations, strict=True))
            if isinstance(msg, p.Rehello) and self.rehello is None:
                self.rehello = time.monotonic()
            timeout_ms = 0
        return out

    def run(self) -> None:
        with peer_socket(endpoints(self.cfg, self.run_id).control) as sock:
            me = socket.gethostname()
            sock.send_multipart(p.encode(p.Hello("woken", os.getpid(), me, False, "t", "")))
            welcome = next(m for m in self.drain(sock, 5000) if isinstance(m, p.Welcome))
            sock.send_multipart(p.encode(p.Request(4)))
            wait_for(lambda: self.granted(sock, 2), 10, "two grants", interval_s=0)
            self.held = sorted(self.grants)
            time.sleep(2.0 * self.lease_s)  # the fault: silent past the lease, as if SIGSTOPped
            (slot0, gen0), queued = self.held[0], self.held[1:]
            k = len(self.cfg.sample_fields())
            wrong_item = 10**9  # not the item granted: the stager must revoke this producer
            sock.send_multipart(p.encode(p.Ready([slot0], [gen0], [wrong_item], [1] * k, [0], [0])))
            # Woken, a worker heartbeats on: if the READY itself revoked it (a stager too
            # busy to see the lease run out first), REHELLO answers this.
            sock.send_multipart(p.encode(p.Heartbeat(0, {})))
            ring = Ring.attach(welcome.ring_name, writable=False)
            try:
                wait_for(lambda: self.settled(sock, ring, queued), 10, "REHELLO", interval_s=0)
            finally:
                ring.close()
            sock.send_multipart(p.encode(p.Bye(0, {})))

    def granted(self, sock: zmq.Socket, n: int) -> bool:
        """Read what the stager sent; True once it granted this producer n slots."""
        self.drain(sock, 100)
        return len(self.grants) >= n

    def settled(self, sock: zmq.Socket, ring: Ring, queued: list[tuple[int, int]]) -> bool:
        """Read what the stager sent and record each queued slot granted to another
        producer before any REHELLO; True once REHELLO came or all of them were."""
        self.drain(sock, 10)
        for slot, gen in queued:
            h = ring.slots[slot]
            g = int(h["generation"])
            live = shown_state(h) in (SlotState.GRANTED, SlotState.WRITING)
            mine = (slot, g) in self.grants
            seen = any(slot == s for s, _, _ in self.regranted)
            if g > gen + 1 and live and not mine and self.rehello is None and not seen:
                self.regranted.append((slot, gen, g))
        return self.rehello is not None or len(self.regranted) == len(queued)


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
    run_id = rid()
    woken = WokenProducer(cfg, run_id, lease_s)
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        thread = threading.Thread(target=woken.run, daemon=True)
        thread.start()
        try:
            items = consume(client, timeout_s=30)
            thread.join(15)
        finally:
            client.close()
        finish(run, run_id, "producers")
    assert len(woken.held) >= 2, "the hand-played producer got too few grants"
    assert woken.rehello is not None, "the woken producer was never told to drop its grants"
    assert_exactly_once(items, cfg, n)
    assert woken.regranted == [], (
        f"slots still queued in the woken producer (slot, its generation, new generation) "
        f"were granted to another producer without a REHELLO: {woken.regranted}"
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
                pids = worker_pids(remote.pid)
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
