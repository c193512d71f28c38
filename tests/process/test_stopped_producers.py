"""Producers SIGSTOPped past their lease and then woken: their slots are FENCED while
they may still write, whatever they send late is stale, and a producer that says HELLO
again gets its fenced slots back. (A woken producer's queued grants, played by hand:
tests/unit/test_stopped_producers.py.)

Real stager and producer processes; the test process is the consumer and checks
every row, the epoch exactly once, and the stager's memory across the fault.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ringfeed.scripts.runner import worker_pids
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.processes import RSS_SLACK_KB, rss_kb, send_signal
from tests.support.runs import Run, finish, rid
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


N_ITEMS, LEASE_S = 400, 0.5  # short leases: the faults last 2.5 of them


def stopped_configs(tmp_path: Path, patience_s: float) -> tuple[Path, Path]:
    """The run's config (the stager's lease: LEASE_S) and its local pool's, whose
    ring.lease_s is the producers' patience: how long a producer waits for word from
    the stager before it says HELLO again on a new socket."""
    # credits 4: a READY leaves after each sample, so the woken producer announces the
    # slot it was writing when stopped at once.
    over = {"producers": {"workers": 2, "credits": 4}}
    run_cfg = small(tmp_path, items=N_ITEMS, delay_s=0.01, ring={"lease_s": LEASE_S}, **over)
    (tmp_path / "pool").mkdir()
    patient = {"lease_s": patience_s}
    orphan = {**over["producers"], "orphan_s": max(30.0, 3 * patience_s)}
    pool_cfg = small(tmp_path / "pool", items=N_ITEMS, delay_s=0.01, ring=patient, producers=orphan)
    return run_cfg, pool_cfg


def wake_when_fenced(stats: StatsReader, pid: int, seen: dict[str, Any]) -> None:
    """Beside the consumer: SIGCONT the stopped pid once its slots show FENCED (kept in
    seen["fenced"]) and it has been stopped (since seen["stopped_at"]) 2.5 leases."""
    try:
        fenced = stats.first(lambda s: s["slots"].get("FENCED", 0), 10, "FENCED slots")
        seen["fenced"] = fenced["slots"]["FENCED"]
        # The fault: silent past the stager's lease and past its own patience.
        time.sleep(max(0.0, seen["stopped_at"] + 2.5 * LEASE_S - time.monotonic()))
    finally:
        send_signal(pid, signal.SIGCONT)


def stop_a_producer_past_its_lease(tmp_path: Path, patience_s: float) -> dict[str, Any]:
    """SIGSTOP one of two producers mid-epoch; SIGCONT it once its slots are FENCED and
    2.5 leases passed. Returns what was seen, with seen["summary"] = stager.json."""
    cfg_path, pool_cfg = stopped_configs(tmp_path, patience_s)
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
        waker = threading.Thread(
            target=lambda: wake_when_fenced(stats, stopped[0], seen), daemon=True
        )

        def stop_one(n_items: int) -> None:
            if n_items >= 40 and not stopped:
                stopped.append(worker_pids(pool.pid)[0])
                seen["rss0"] = rss_kb(stager.pid)
                os.kill(stopped[0], signal.SIGSTOP)
                seen["stopped_at"] = time.monotonic()
                waker.start()

        try:
            seen["items"] = consume(client, on_batch=stop_one, timeout_s=30)
            waker.join(15)
            seen["rss1"] = rss_kb(stager.pid)
        finally:
            for pid in stopped:
                send_signal(pid, signal.SIGCONT)
            client.close()
        seen["summary"] = finish(run, "producers")
    assert_exactly_once(seen["items"], cfg, N_ITEMS)  # consume() also checked every row
    assert seen["fenced"] >= 1, "the stopped producer's slots were never FENCED"
    assert seen["summary"]["counters"]["reclaimed"] >= 1
    assert seen["rss1"] - seen["rss0"] < RSS_SLACK_KB
    return seen


def test_stopped_producer_is_fenced_and_its_late_ready_dropped(tmp_path: Path) -> None:
    # A patient producer keeps its socket, so its late READY reaches the stager and is
    # dropped as stale; or, woken before it wrote, it sees its grant's generation moved
    # on in the slot header and drops the grant itself (it reports that in heartbeats).
    seen = stop_a_producer_past_its_lease(tmp_path, patience_s=30.0)
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
    seen = stop_a_producer_past_its_lease(tmp_path, patience_s=LEASE_S)
    summary = seen["summary"]
    assert summary["slots"].get("FENCED", 0) == 0, summary["slots"]
