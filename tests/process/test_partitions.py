"""Partitions heal (producer/process/session.py, shared/run/run_clock.py): a remote pool
whose stager stood still for minutes keeps asking and rejoins the same run; a paused
producer is counted as a pause; a run whose consumer died ends on its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringfeed.scripts.runner import worker_pids
from ringfeed.shared.config import load_config
from ringfeed.shared.run.process import STAGER_NO_CONSUMER
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import ALL_REMOTE, small
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.processes import CLI, send_signal
from tests.support.runs import Run, finish, rid

pytestmark = pytest.mark.slow

# How long the stager stands still: 15 leases, five times the 3 s after which these
# tests' pools used to give up (and their default, 30 s, is half of what it is now).
STAGER_STOP_S = 15.0


def test_a_remote_pool_rejoins_a_stager_stopped_for_fifteen_leases_exactly_once(
    tmp_path: Path,
) -> None:
    """SIGSTOP the stager mid-epoch with a remote pool over tcp: the pool's HELLOs back
    off and go unanswered, nobody exits; on SIGCONT the stager's leases have not aged
    (its run clock left the stop out), the pool rejoins, and the epoch arrives exactly
    once, every row checked, with nothing quarantined."""
    n, port = 400, free_port()
    tcp = {"kind": "tcp", "host": "127.0.0.1", "port": port}
    config = small(tmp_path, items=n, delay_s=0.005, transport=tcp, ring=ALL_REMOTE)
    cfg = load_config(config)
    stopped: list[float] = []

    def stop_once(n_items: int) -> None:
        if stopped or n_items < n // 4:
            return
        stager = run.procs["stager"]
        stager.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        time.sleep(STAGER_STOP_S)
        stager.send_signal(signal.SIGCONT)
        stopped.append(time.monotonic() - started)

    with Run(config, rid(), tmp_path) as run:
        run.start("stager")
        cmd = [
            *CLI,
            "producers",
            str(config),
            "--run-id",
            run.run_id,
            "--remote",
            "--connect",
            f"tcp://127.0.0.1:{port}",
            "--name",
            "far",
        ]
        with (tmp_path / f"{run.run_id}-far.log").open("w") as out:
            run.procs["producers"] = subprocess.Popen(
                cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )
        client = run.client(timeout_s=60)
        items = consume(client, on_batch=stop_once, timeout_s=90)
        client.close()
        stats = finish(run, "producers")
        logs = run.logs(tail=200_000)
    assert stopped and stopped[0] >= STAGER_STOP_S, "the stager was never stopped"
    assert_exactly_once(items, cfg, n)
    assert "lost its stager" not in logs and "saying HELLO again" in logs, logs
    assert "the stager did not run for" in logs, logs
    assert stats["counters"]["skipped"] == 0 and stats["counters"]["restarts"] == 0, stats
    assert not (run.dir / "quarantine.jsonl").read_text().strip()


def test_a_producer_stopped_long_enough_to_be_forgotten_counts_as_a_pause(
    tmp_path: Path,
) -> None:
    """SIGSTOP a local worker past the leases after which the stager forgets it, then
    SIGCONT: it says HELLO again as the same process. The stager counts one pause, no
    restart and no message of an unknown peer; the epoch arrives exactly once."""
    n = 300
    config = small(tmp_path, items=n, delay_s=0.01, producers={"workers": 2})
    cfg = load_config(config)
    paused: list[int] = []

    def pause_once(n_items: int) -> None:
        if paused or n_items < n // 4:
            return
        pid = worker_pids(run.procs["producers"].pid)[0]
        paused.append(pid)
        send_signal(pid, signal.SIGSTOP)
        time.sleep(5 * cfg.ring.lease_s)  # past FORGET_LEASES (3) leases
        send_signal(pid, signal.SIGCONT)

    with Run(config, rid(), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        items = consume(client, on_batch=pause_once)
        client.close()
        stats = finish(run, "producers")
        logs = run.logs(tail=200_000)
    assert paused, "no worker was paused"
    assert_exactly_once(items, cfg, n)
    counters = stats["counters"]
    assert counters["pauses"] >= 1 and counters["restarts"] == 0, (counters, logs)
    assert "unknown-peer" not in stats.get("dropped", {}), stats.get("dropped")


def test_a_run_whose_consumer_died_ends_after_consumer_wait_s(tmp_path: Path) -> None:
    """`--consumer none` and a user loop that takes a few batches and dies (os._exit):
    the stager ends the run consumer_wait_s later with exit code 6 and says why; the
    launcher stops the producers and exits with that code."""
    config = small(tmp_path, items=100_000, stager={"epochs": 0, "consumer_wait_s": 3.0})
    with Run(config, rid(), tmp_path) as run:
        run.start_all("none")
        loop = [sys.executable, "-c", CRASHING_LOOP, str(config), run.run_id]
        user = subprocess.run(loop, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert user.returncode == 7, user.stdout + user.stderr
        died = time.monotonic()
        code = run.watch()
        took_s = time.monotonic() - died
        logs = run.logs(tail=200_000)
    assert code == STAGER_NO_CONSUMER, logs
    assert 3.0 <= took_s < 3.0 + 15, f"{took_s:.1f} s\n{logs}"
    assert "is gone and none came for 3 s (stager.consumer_wait_s)" in logs, logs
    assert "stager says stop" in logs  # the producers heard why


# A user's loop over the run that crashes after three batches, without a goodbye.
CRASHING_LOOP = """
import os, sys
from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.shared.config import load_config
client = BatchClient(load_config(sys.argv[1]), sys.argv[2], "user-loop")
client.connect(timeout_s=60)
for _ in range(3):
    client.free(client.next(timeout_s=60))
os._exit(7)
"""
