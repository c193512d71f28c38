"""Real stager and producer processes, real sockets and shared memory, no model.

The test process is the consumer (consumer.client.batch_client.BatchClient), so it
sees every delivered item id and checks exactly-once against the plan.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints
from tests.support.checks import consume
from tests.support.configs import small
from tests.support.paths import REPO
from tests.support.runs import Run, rid, shm_segments, started
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


def test_epoch_exactly_once_when_a_producer_is_sigkilled_mid_write(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=400, delay_s=0.01, ring={"lease_s": 2.0})
    cfg = load_config(cfg_path)
    run_id = rid()
    with (
        started(cfg_path, tmp_path, run_id=run_id) as (run, client),
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        killed = {}

        def kill_one(n_items: int) -> None:
            if n_items >= 80 and not killed:
                victim = run.worker_pids()[0]
                t0 = time.monotonic()
                subprocess.run(["kill", "-KILL", str(victim)], check=True)
                stats.first(
                    lambda s: s["counters"]["reclaimed"] > 0, 10, "the dead producer's slot back"
                )
                killed["reclaim_s"] = time.monotonic() - t0

        items = consume(client, on_batch=kill_one)
        client.close()
        assert run.wait("stager", 20) == 0 and run.wait("producers", 20) == 0
        assert shm_segments(run_id) == []
    plan = Plan(Shuffle(400, cfg.stager.seed), 1)
    assert items == [plan.item_at(i) for i in range(400)]  # deterministic: plan order
    # Within the lease (plus one stats interval of reporting delay): the stager sees the
    # dead pid without waiting for the lease to run out.
    assert killed["reclaim_s"] < cfg.ring.lease_s + 0.5
    assert run.json("stager.json")["counters"]["delivered"] == 400
    assert "died (signal SIGKILL) while working; restarting it" in run.logs(tail=100_000)


def test_backpressure_holds_producers_while_the_consumer_is_slow(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=200, delay_s=0.0)
    cfg = load_config(cfg_path)
    run_id = rid()
    with (
        started(cfg_path, tmp_path, run_id=run_id) as (run, client),
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        held = [client.next(timeout_s=30) for _ in range(cfg.stager.batch_slots)]
        # The consumer frees nothing: the batches ahead are filled and sent into every
        # slot of the batch ring, then grants stop.
        full = cfg.batch_ring_slots
        first = stats.first(lambda s: s["batches"] >= full, 10, "every batch slot sent")
        # Grants must stay put for a second of the stager's own time (its uptime, so a
        # stager that a loaded machine did not schedule is not taken for a held one).
        second = stats.first(
            lambda s: s["uptime_s"] >= first["uptime_s"] + 1.0, 10, "a second of stager time"
        )
        assert second["counters"]["grants"] == first["counters"]["grants"]
        assert first["counters"]["grants"] == full * cfg.stager.batch_size
        assert second["batches"] == full and second["batch_slots_ready"] == full
        items = [i for b in held for i in b.arrays["items"].tolist()]
        for b in held:
            client.free(b)
        items += consume(client)
        client.close()
        assert run.wait("stager", 20) == 0
    assert sorted(items) == list(range(200))


def flowing(stats: dict) -> bool:
    """Batches go out: a run past its start, in the middle of its work."""
    return stats["batches"] >= 10


def test_sigterm_stops_a_run_cleanly(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=100_000, delay_s=0.002)
    run_id = rid()
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(run.cfg, run_id).stats) as stats,
    ):
        run.start_all(consumer="drain")
        run.poll_for(lambda: len(shm_segments(run_id)) == 2, 30, "the rings")
        stats.first(flowing, 30, "batches flowing to the drain consumer")
        t0 = time.monotonic()
        for verb in ("producers", "drain", "stager"):
            run.signal(verb, signal.SIGTERM)
        codes = run.wait_all(10)
        assert time.monotonic() - t0 < 10
        assert codes == {"stager": 0, "producers": 0, "drain": 0}, run.logs()
        assert shm_segments(run_id) == []


def test_launcher_sigterm_exits_zero_and_leaves_no_segment(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=100_000, delay_s=0.002)
    run_id, log = rid(), tmp_path / "launch.log"
    launch = ["bash", "scripts/launch.sh", "run", str(cfg_path), "--run-id", run_id]
    with (
        StatsReader(endpoints(load_config(cfg_path), run_id).stats) as stats,  # connects on bind
        log.open("w") as out,
    ):
        proc = subprocess.Popen(
            [*launch, "--consumer", "drain"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            stats.first(flowing, 30, "batches flowing to the drain consumer")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert shm_segments(run_id) == []


def test_stager_sigkill_then_restart_cleans_up_and_completes(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=120, delay_s=0.002)
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        run.poll_for(lambda: len(shm_segments(run_id)) == 2, 30, "the rings")
        run.signal("stager", signal.SIGKILL)
        run.wait("stager", 10)
        assert len(shm_segments(run_id)) == 2  # a SIGKILLed owner cannot clean up
        # The new stager creates its rings with O_EXCL, so it gets this far only because
        # it removed the stale segments (or a stager of another run did: every stager
        # removes the segments of dead owners at start). Producers say HELLO again.
        run.start("stager")
        client = run.client(timeout_s=30)
        items = consume(client)
        client.close()
        assert run.wait("stager", 20) == 0 and run.wait("producers", 30) == 0
        assert shm_segments(run_id) == []
    assert sorted(items) == list(range(120))


def test_a_batch_across_an_epoch_boundary_says_both_epochs(tmp_path: Path) -> None:
    n = 30  # batches of 8: the fourth holds the last 6 of epoch 0 and the first 2 of epoch 1
    cfg_path = small(tmp_path, items=n, delay_s=0.0, stager={"batch_size": 8, "epochs": 2})
    run_id, spans, seen = rid(), [], 0
    with started(cfg_path, tmp_path, run_id=run_id) as (run, client):
        while (batch := client.next(timeout_s=30)) is not None:
            items = check_synthetic_rows(batch.arrays, batch.meta.n_valid, client.cfg)
            spans.append(
                (batch.meta.first_epoch, batch.meta.epoch, seen // n, (seen + len(items) - 1) // n)
            )
            seen += len(items)
            client.free(batch)
        client.close()
        assert run.wait("stager", 20) == 0
    assert seen == 2 * n
    assert all(
        first == want_first and last == want_last for first, last, want_first, want_last in spans
    )
    assert (0, 1) in {(first, last) for first, last, *_ in spans}
