"""Faults that once stalled or ended a run: a lossy TCP link, a poison item that raises
or kills its worker, a stager restarted under its consumer (a producer that never
answers its grants: tests/unit/test_faults.py). Real processes; every row of every
batch is checked against the item it claims to be; every run ends within a bound and
leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.scripts.lossy_link import LossyLink
from ringfeed.shared.config import load_config
from tests.support.checks import consume, plan_items
from tests.support.configs import ALL_REMOTE, small, tcp
from tests.support.fault_sources import inject_faults
from tests.support.ports import free_port
from tests.support.runs import Run, rid, shm_segments, started

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("drop", [0.1, 0.3])
def test_an_epoch_crosses_a_link_that_drops_messages_exactly_once(
    tmp_path: Path, drop: float
) -> None:
    """At 30 % loss about half the grants expire: the producers still deliver about one
    sample per expiry, so they are never struck for holding (issue 35)."""
    n, stager_port, link_port = 120, free_port(), free_port()
    # Each lost GRANT or READY costs a lease: a short one keeps the epoch short.
    ring = {"lease_s": 0.5, "heartbeat_s": 0.1, **ALL_REMOTE}
    cfg_path = small(tmp_path, items=n, delay_s=0.002, transport=tcp(stager_port), ring=ring)
    run_id, link = rid(), LossyLink(link_port, stager_port, drop=drop)
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        link.start()
        run.start("producers", "--remote", "--connect", f"tcp://127.0.0.1:{link_port}")
        client = run.client(timeout_s=30)
        try:
            items = consume(client, timeout_s=90)
        finally:
            link.stop.set()
        client.close()
        assert run.wait("stager", 20) == 0
        summary = run.json("stager.json")
    assert link.dropped >= 10, "the link dropped too little to mean anything"
    assert items == plan_items(load_config(cfg_path), n)
    assert summary["counters"]["reclaimed"] >= 1  # lost GRANTs and READYs came back
    # A lost message is no lie: honest producers behind a bad link are never struck.
    assert summary["counters"]["strikes"] == 0 and summary["counters"]["peers_banned"] == 0
    assert shm_segments(run_id) == []


@pytest.mark.parametrize("fault", ["raise", "exit", "loop", "stuck"])
def test_a_poison_item_costs_that_item_once_and_nothing_else(tmp_path: Path, fault: str) -> None:
    """An item whose work raises is quarantined at once with the exception; one whose
    work ends its process (exit 3, the code of a worker whose run finished, as a misbehaving
    library might) is charged for each
    death and skipped after ring.max_item_attempts; the pool never gives up. One whose
    work never ends is cut off by the worker's alarm (an endless Python loop) or, where
    no alarm reaches (a hung C call), by the pool, which kills the worker."""
    n, poison = 60, 17
    cfg_path = small(
        tmp_path,
        items=n,
        stager={"batch_size": 8, "epochs": 2},
        producers={"workers": 2, "restart_backoff_s": 0.1, "max_restarts": 2},
    )
    inject_faults(cfg_path, delay_s=0.002, **{f"{fault}_items": [poison]})
    run_id = rid()
    with started(cfg_path, tmp_path, run_id=run_id) as (run, client):
        items = consume(client, timeout_s=90)
        client.close()
        codes = run.wait_all(30)
        summary = run.json("stager.json")
        quarantine = read_quarantine(run.dir / "quarantine.jsonl")
        logs = run.logs(tail=1_000_000)
    assert codes == {"stager": 0, "producers": 0}, logs
    assert items == plan_items(load_config(cfg_path), n, 2, {poison})  # twice each, poison never
    assert [r["item_id"] for r in quarantine] == [f"synthetic-{poison:06d}"]  # once per run
    record = quarantine[0]
    if fault == "raise":
        # raised by the hook around the source, in no stage of ours (producer/sample.py)
        assert record["stage"] == "source" and "ZeroDivisionError" in record["reason"]
        assert "died (" not in logs  # no worker died for it
    elif fault == "exit":
        assert record["stage"] == "lease" and "max_item_attempts" in record["reason"]
        assert logs.count("died (exit code 3) while working") == 3  # max_item_attempts
    elif fault == "loop":  # its SKIP, or the stager's charges if the lease ran out first
        assert "took more than ring.lease_s" in record["reason"] or record["stage"] == "lease"
        assert "died (" not in logs and "stuck in one sample" not in logs  # the alarm did it
    else:
        assert record["stage"] == "lease" and "max_item_attempts" in record["reason"]
        assert "stuck in one sample" in logs and "died (signal SIGKILL) while working" in logs
    assert summary["counters"]["skipped"] == 2  # once per epoch, tried in the first only
    assert shm_segments(run_id) == []


def test_a_producer_dead_half_way_through_a_run_has_its_finished_rows_delivered_once(
    tmp_path: Path,
) -> None:
    """One worker takes positions 0-7 as one run and dies (its process exits) at position
    5: the five rows it wrote whole, sealed but never announced (a run is answered at its
    end), are delivered from where they lie, once; the rest of the run is granted again;
    the item it died on is charged, and skipped after ring.max_item_attempts; no row is
    torn, and every row is checked against its item."""
    n = 40
    cfg_path = small(
        tmp_path,
        items=n,
        stager={"batch_size": 8, "epochs": 1},
        producers={"workers": 1, "credits": 16, "restart_backoff_s": 0.1, "max_restarts": 5},
    )
    cfg = load_config(cfg_path)
    poison = Plan(Shuffle(n, cfg.stager.seed), 1).item_at(5)
    inject_faults(cfg_path, delay_s=0.002, exit_items=[poison])
    run_id = rid()
    with started(cfg_path, tmp_path, run_id=run_id) as (run, client):
        items = consume(client, timeout_s=90)
        client.close()
        codes = run.wait_all(30)
        summary = run.json("stager.json")
        quarantine = read_quarantine(run.dir / "quarantine.jsonl")
    assert codes == {"stager": 0, "producers": 0}
    assert items == plan_items(cfg, n, 1, {poison})  # each once, in plan order
    counters = summary["counters"]
    assert counters["salvaged"] >= 5 and counters["torn"] == 0, counters
    assert [r["item_id"] for r in quarantine] == [f"synthetic-{poison:06d}"]
    assert shm_segments(run_id) == []


def test_a_restarted_stager_is_rejoined_where_its_consumer_stands(tmp_path: Path) -> None:
    """SIGKILL the stager mid-epoch and start a new one: the consumer answers its REHELLO
    at the batch after the last it took, producers say HELLO again, an item quarantined
    before the restart is skipped without a try after it, and the batches are exactly
    those of an uninterrupted run."""
    n, poison = 240, 3
    cfg_path = small(
        tmp_path,
        items=n,
        stager={"batch_size": 8, "epochs": 2},
    )
    inject_faults(cfg_path, delay_s=0.004, raise_items=[poison])
    run_id = rid()
    with started(cfg_path, tmp_path, run_id=run_id) as (run, client):

        def restart_once(n_taken: int) -> None:
            if n_taken >= 300 and run.launches == 2:
                run.signal("stager", 9)
                run.wait("stager", 10)
                run.start("stager")

        kept: list[dict] = []
        items = consume(client, on_batch=restart_once, timeout_s=120, kept=kept)
        client.close()
        assert run.wait("stager", 30) == 0
        # Views kept past their free, across the restart and past close, stay readable
        # (a view that outlived its map once crashed the process that printed it).
        assert all(repr(a) and a.sum() is not None for arrays in kept for a in arrays.values())
        quarantine = read_quarantine(run.dir / "quarantine.jsonl")
        logs = run.logs(tail=1_000_000)
    assert run.launches == 3, "the stager was never restarted"
    assert "1 items quarantined earlier in this run are skipped" in logs
    assert items == plan_items(load_config(cfg_path), n, 2, {poison})
    assert [r["item_id"] for r in quarantine] == [f"synthetic-{poison:06d}"]
    assert shm_segments(run_id) == []
