"""Reliability under faults: killed and remote producers, a full /dev/shm, a producer
in another network namespace (stopped producers: test_stopped_producers.py).

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
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfeed.scripts.runner import worker_pids
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints
from ringfeed.shared.run.process import POOL_ORPHANED
from ringfeed.shared.wire.keys import generate
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small, tcp
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.processes import CLI, RSS_SLACK_KB, rss_kb, send_signal
from tests.support.runs import Run, finish, rid, shm_segments
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


def test_producers_sigkilled_repeatedly_still_deliver_the_epoch_once(tmp_path: Path) -> None:
    # Each kill charges the item its worker was on; five kills 0.3 s apart can charge one
    # innocent item three times (1 run in ~20), which ring.max_item_attempts=3 rightly
    # quarantines. Six attempts keep the promise under test exact: nothing skipped.
    n = 800
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=0.005,
        ring={"max_item_attempts": 6},
        producers={"workers": 2, "restart_backoff_s": 0.05, "max_restarts": 20},
    )
    cfg = load_config(cfg_path)
    run_id, rng, kills = rid(), random.Random(7), []
    with Run(cfg_path, run_id, tmp_path) as run:
        stager = run.start("stager")
        pool = run.start("producers")
        client = run.client(timeout_s=30)
        done, flowing = threading.Event(), threading.Event()

        def killer() -> None:
            flowing.wait(30)  # kills before the workers joined would take back nothing
            while len(kills) < 5 and not done.wait(0.3):
                pids = worker_pids(pool.pid)
                if pids and send_signal(victim := rng.choice(pids), signal.SIGKILL):
                    kills.append(victim)

        rss: list[int] = []
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            items = consume(
                client, on_batch=lambda k: [flowing.set(), rss.append(rss_kb(stager.pid))]
            )
            rss.append(rss_kb(stager.pid))
        finally:
            done.set()
            thread.join(5)
            client.close()
        summary = finish(run, "producers")
    assert len(kills) >= 3, f"only {len(kills)} kills landed during the epoch"
    assert_exactly_once(items, cfg, n)
    # The pool restarted each one (the stager counts a restart only when the new HELLO
    # beats its check for the dead pid, so its counter proves nothing here).
    assert run.logs(tail=1_000_000).count("died (signal SIGKILL)") == len(kills)
    assert summary["counters"]["reclaimed"] >= 1
    assert rss[-1] - rss[0] < RSS_SLACK_KB, f"stager RSS {rss[0]} -> {rss[-1]} KiB"


def test_remote_tcp_producer_sigkilled_mid_send(tmp_path: Path) -> None:
    n, port = 400, free_port()
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=0.004,
        transport=tcp(port),
        # A worker restarted after the last SHUTDOWN never hears the stager again: its pool
        # ends as an orphan after orphan_s, not hours.
        producers={"workers": 1, "restart_backoff_s": 0.05, "max_restarts": 20, "orphan_s": 5},
    )
    cfg = load_config(cfg_path)
    run_id, kills = rid(), []
    with Run(cfg_path, run_id, tmp_path) as run, StatsReader(endpoints(cfg, run_id).stats) as stats:
        run.start("stager")
        local = run.start("producers")
        remote = run.start(
            "producers", "--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", "far"
        )
        run.procs["producers"], run.procs["remote"] = local, remote
        # Killed while it works, not while it starts (a pool slower to start than the local
        # one was once killed twice before it ever joined).
        far = lambda s: any(pr["name"] == "far-0" for pr in s["producers"])  # noqa: E731
        stats.first(far, 30, "the remote producer joining")
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
        summary = finish(run, "producers")
        # Finished, or orphaned: a worker restarted after the last SHUTDOWN never heard it.
        assert run.wait("remote", 30) in (0, POOL_ORPHANED), run.logs()
    assert kills, "the remote producer was never killed"
    assert_exactly_once(items, cfg, n)
    producers = {q["name"]: q for q in summary["producers"]}
    assert any(not q["remote"] and q["samples"] > 0 for q in producers.values())


def test_rings_larger_than_free_shm_fail_fast_naming_the_key(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, ring={"lookahead": 10_000_000})  # ~200 GB of 20 KiB slots
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        t0 = time.monotonic()
        run.start("stager")
        code = run.wait("stager", 10)
        assert time.monotonic() - t0 < 10
        assert code != 0
        assert "ring.lookahead" in run.logs(), run.logs()
        assert shm_segments(run_id) == []
    validate = subprocess.run(
        [*CLI, "validate", str(cfg_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert validate.returncode != 0 and "ring.lookahead" in validate.stderr


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
    transport = tcp(port, host=head_ip)
    over = {"transport": {**transport, "keys_dir": str(keys)}, "producers": {"workers": 1}}
    cfg_path = small(tmp_path, items=n, delay_s=0.004, **over)
    (tmp_path / "ns").mkdir()
    ns_cfg = small(
        tmp_path / "ns", items=n, delay_s=0.004, transport={**transport, "keys_dir": str(bundle)}
    )
    cfg = load_config(cfg_path)
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        out = (tmp_path / f"{run_id}-netns.log").open("w")
        run.procs["netns"] = subprocess.Popen(
            ["ip", "netns", "exec", name, *CLI, "producers"]
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
        summary = finish(run, "producers", "netns")
    assert_exactly_once(items, cfg, n)
    producers = {q["name"]: q for q in summary["producers"]}
    assert producers["netns-0"]["remote"] and producers["netns-0"]["samples"] > 0
