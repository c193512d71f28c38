"""Peers that hold a way in (the ipc socket, or a valid CURVE key) and lie (issue 18's
cases 1, 2, 3, 5 and 11). Real stager and honest producer processes; the liars play the
protocol by hand (tests/support/liars.py). Each run must deliver its epoch exactly once with
every row checked, quarantine no innocent item, and end in bounded time."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints, run_dir
from ringfeed.shared.wire.keys import generate
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.fault_sources import inject_faults
from tests.support.liars import bad_checksums, in_thread, lie_per_grant, silent_identities
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.runs import Run, finish, rid
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


def keyed(tmp_path: Path, **over: dict) -> tuple[Path, str, str]:
    """A config with a CURVE-keyed tcp socket; returns it, the folder of the valid
    producer key the liar holds, and the endpoint."""
    keys = tmp_path / "keys"
    bundle = generate(keys, "liar")
    port = free_port()
    transport = {"kind": "tcp", "host": "127.0.0.1", "port": port, "keys_dir": str(keys)}
    return small(tmp_path, transport=transport, **over), str(bundle), f"tcp://127.0.0.1:{port}"


@pytest.mark.parametrize("lie", ["malformed", "content"])
def test_a_local_liar_is_struck_out_and_no_item_pays(tmp_path: Path, lie: str) -> None:
    """Case 1 (lengths [0, 0], HELLO again, repeat) and case 5 (token id 1,000,000 and
    NaN mels, sealed and hashed): each lie is a strike, never a charge on the item."""
    n = 200
    cfg_path = small(tmp_path, items=n, delay_s=0.005, producers={"workers": 1})
    cfg, run_id, stop = load_config(cfg_path), rid(), threading.Event()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        client = run.client(timeout_s=30)
        control = endpoints(cfg, run_id).control
        thread, tally = in_thread(lie_per_grant, cfg, control, "", stop, lie)
        run.poll_for(lambda: tally.refusals, 20, "the liar refused")
        run.start("producers")
        items = consume(client)
        stop.set()
        thread.join(5)
        client.close()
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)  # every row checked: no bad content got through
    assert not tally.errors, tally.errors
    assert tally.lies >= cfg.ring.max_strikes and tally.refusals >= 1, tally
    counters = summary["counters"]
    assert counters["strikes"] == cfg.ring.max_strikes and counters["peers_banned"] == 1
    assert counters["skipped"] == 0
    assert read_quarantine(run_dir(cfg, run_id) / "quarantine.jsonl") == []


def test_bad_content_from_two_peers_quarantines_the_item(tmp_path: Path) -> None:
    """Case 5's other half: the same item's rows out of range from two peers (two
    processes) is the item's fault, with a reason; the epoch is otherwise complete."""
    n = 60
    cfg_path = small(tmp_path, items=n, delay_s=0.005, producers={"workers": 1})
    cfg, run_id, stop = load_config(cfg_path), rid(), threading.Event()
    stop_file = tmp_path / "stop-liar"
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        client = run.client(timeout_s=30)
        other = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.liars",
                "content",
                str(cfg_path),
                run_id,
                stop_file,
            ],
            cwd=REPO,
        )
        control = endpoints(cfg, run_id).control
        thread, tally = in_thread(lie_per_grant, cfg, control, "", stop, "content")
        try:
            stats.first(lambda s: s["counters"].get("peers_banned") == 2, 30, "two bans")
            run.start("producers")
            items = consume(client)
        finally:
            stop.set()
            stop_file.touch()
            thread.join(5)
            other.wait(10)
        client.close()
        summary = finish(run, run_id, "producers")
    skipped = read_quarantine(run_dir(cfg, run_id) / "quarantine.jsonl")
    assert skipped and all(r["stage"] == "content" for r in skipped), skipped
    assert all("two producers sent bad rows" in r["reason"] for r in skipped)
    bad = {int(r["item_id"].rsplit("-", 1)[1]) for r in skipped}
    assert sorted(items) == sorted(set(range(n)) - bad)  # each row checked, once each
    assert summary["counters"]["peers_banned"] == 2


def test_a_fast_liar_with_bad_checksums_is_banned(tmp_path: Path) -> None:
    """Case 2: a remote peer with a valid key answers every GRANT at once with a wrong
    checksum; the honest producer (50 ms a sample) still delivers the epoch."""
    n = 100
    cfg_path, key, endpoint = keyed(tmp_path, items=n, delay_s=0.05, producers={"workers": 1})
    cfg, run_id, stop = load_config(cfg_path), rid(), threading.Event()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        client = run.client(timeout_s=30)
        thread, tally = in_thread(bad_checksums, cfg, endpoint, key, stop)
        run.poll_for(lambda: tally.joins, 20, "the liar joined")
        run.start("producers")
        items = consume(client)
        stop.set()
        thread.join(5)
        client.close()
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)
    assert not tally.errors and tally.refusals >= 1, tally
    assert summary["counters"]["peers_banned"] == 1 and summary["counters"]["skipped"] == 0


def test_thirty_identities_of_one_key_get_one_peers_share(tmp_path: Path) -> None:
    """Case 3: one key, 30 identities that join, ask, heartbeat and never deliver. They
    hold no more than one peer's share, their positions go to the honest producers, and
    nothing is charged."""
    n = 200
    cfg_path, key, endpoint = keyed(tmp_path, items=n, delay_s=0.005, producers={"workers": 2})
    cfg, run_id, stop = load_config(cfg_path), rid(), threading.Event()
    held: list[int] = []
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        client = run.client(timeout_s=30)
        thread, tally = in_thread(silent_identities, cfg, endpoint, key, stop, 30)
        run.poll_for(lambda: tally.joins >= 30, 20, "30 identities joined")
        run.start("producers")
        # Grants made while they were the only peer run out after a lease; from then on
        # fair share and their shrinking limit hold them.
        settled = time.monotonic() + 2 * cfg.ring.lease_s

        def sample(_: int) -> None:
            rows = stats.latest().get("producers", [])
            if time.monotonic() > settled:
                held.append(sum(r["grants"] for r in rows if r["name"].startswith("idle-")))

        items = consume(client, on_batch=sample)
        stop.set()
        thread.join(5)
        client.close()
        summary = finish(run, run_id, "producers")
    assert_exactly_once(items, cfg, n)
    assert not tally.errors and tally.lies >= 1, tally
    assert held and max(held) <= (cfg.ring.slots - 1) // 2, held  # one of two peers' share
    assert summary["counters"]["skipped"] == 0


def test_a_bad_item_costs_one_attempt_per_run(tmp_path: Path) -> None:
    """Case 11: epochs of 10 items, a ring of 32 slots: every item's next two epochs are
    in the grant window when it first fails. Each bad item is tried once in the run."""
    n, epochs, bad = 10, 3, (2, 5, 7)
    cfg_path = small(tmp_path, items=n, ring={"slots": 32}, stager={"epochs": epochs})
    inject_faults(cfg_path, raise_items=bad, delay_s=0.005)
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        items = consume(client)
        client.close()
        summary = finish(run, run_id, "producers")
        logs = run.logs(tail=1_000_000)
    assert sorted(items) == sorted([i for i in range(n) if i not in bad] * epochs)
    assert summary["counters"]["skipped"] == len(bad) * epochs
    for item in bad:
        assert logs.count(f"item {item} failed") == 1, f"item {item} tried more than once"
