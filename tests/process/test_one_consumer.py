"""One consumer at a time (issue 18, case 7): two consumers with the run's secret once
fought over the plan, each hello restarting it (51 restarts in 20 s, 217 items twice).
Real stager, producers and consumer processes: a second consumer is refused, told who
holds the run, while the first is alive, busy or idle; once the first is dead, a new
one takes over at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ringfeed.consumer.client.batch_client import BatchClient, StagerRefused
from ringfeed.consumer.stager.consumer_side import SILENT_LEASES
from ringfeed.shared.config import load_config
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.runs import Run, finish, rid, started

pytestmark = pytest.mark.slow


def test_a_second_consumer_is_refused_while_the_first_consumes(tmp_path: Path) -> None:
    n = 300
    cfg_path = small(tmp_path, items=n, delay_s=0.002)
    cfg, run_id = load_config(cfg_path), rid()
    refused: list[str] = []
    with started(cfg_path, tmp_path, run_id=run_id, consumer="first") as (run, client):

        def second_consumer_midway(n_taken: int) -> None:
            if n_taken < 40 or refused:
                return
            # Idle longer than a holder without a pid would stay alive: the pid holds it.
            time.sleep(SILENT_LEASES * cfg.ring.lease_s + 0.5)
            second = run.start("drain")  # a real consumer process with the secret
            assert run.wait("drain", 60) == 1, run.logs()
            refused.append(run.logs(tail=100_000))
            assert second.returncode == 1

        try:
            items = consume(client, on_batch=second_consumer_midway, timeout_s=90)
        finally:
            client.close()
        summary = finish(run, "producers")
        logs = run.logs(tail=1_000_000)
    assert refused, "the second consumer was never started"
    assert f"held by consumer 'first' (pid {os.getpid()})" in refused[0]
    assert_exactly_once(items, cfg, n)
    assert summary["dropped"].get("refused-consumer", 0) >= 1, summary["dropped"]
    assert "replaces" not in logs and logs.count("starts at plan position") == 1


def test_a_new_consumer_takes_over_once_the_holder_is_killed(tmp_path: Path) -> None:
    n = 200
    cfg_path = small(tmp_path, items=n, delay_s=0.002)
    cfg, run_id = load_config(cfg_path), rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        holder = run.start("drain", "--step-s", "0.5")  # slow: alive and mostly idle
        run.poll_for(lambda: "starts at plan position" in run.logs(), 60, "the drain joining")
        early = BatchClient(cfg, run_id, name="early")
        try:
            with pytest.raises(StagerRefused, match=f"'drain' \\(pid {holder.pid}\\)"):
                early.connect(timeout_s=30)
        finally:
            early.close(finished=False)
        run.signal("drain", signal.SIGKILL)
        run.wait("drain", 10)
        t0 = time.monotonic()
        client = run.client(name="takeover", timeout_s=30)
        took_over_s = time.monotonic() - t0
        try:
            items = consume(client, timeout_s=60)
        finally:
            client.close()
        summary = finish(run, "producers")
    assert took_over_s < 5, f"the takeover took {took_over_s:.1f} s"
    assert_exactly_once(items, cfg, n)  # it restarted the plan at 0: the whole epoch
    assert summary["dropped"].get("refused-consumer", 0) >= 1, summary["dropped"]
