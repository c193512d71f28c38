"""A stop signal while a process is still starting ends it there (StopFlag.raising): the
stager's build, the producer pool's loading and the trainer's TensorFlow take seconds on
a busy host, and a launcher's stop then outlived its grace (RINGFEED_GRACE_S) and ended
in SIGKILL, the run reported as failed. Each test sends the signal to this process from
inside the start, where it lands on a real host, and restores the test's own handlers."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import patch

import pytest

from ringfeed.consumer.stager import stager as stager_module
from ringfeed.producer.process import pool as pool_module
from ringfeed.shared.config import load_config
from ringfeed.shared.memory.segments import list_segments
from ringfeed.shared.run.process import STOP_SIGNALS, StopFlag, Stopped
from tests.support.configs import small
from tests.support.runs import rid


@contextlib.contextmanager
def own_handlers() -> Iterator[None]:
    """The test process's stop handlers, as they were, whatever the code under test
    installed."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def signal_self(*_: object, **__: object) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_within_raises_and_one_before_raises_at_the_door() -> None:
    with own_handlers():
        stop = StopFlag().install()
        with pytest.raises(Stopped, match="SIGTERM"), stop.raising():
            signal_self()
            raise AssertionError("the signal did not stop the start")
        assert stop.is_set()
        with pytest.raises(Stopped), stop.raising():  # already set: at once
            raise AssertionError("entered after a stop")
    with own_handlers():
        stop = StopFlag().install()
        with stop.raising():
            pass
        signal_self()  # once started, a signal only sets the flag that loops poll
        assert stop.is_set()


def test_a_stager_stopped_while_it_builds_ends_cleanly_and_leaves_no_ring(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The signal comes after the rings are made (as the launcher's stop does: it waits
    for them): the stager unwinds, unlinks them and ends as a stop, exit 0."""
    cfg = load_config(small(tmp_path, items=40))
    run_id = rid("startstop")
    caplog.set_level(logging.INFO, logger="ringfeed.consumer.stager")
    with own_handlers(), patch.object(stager_module, "make_plan", signal_self):
        code = stager_module.main(cfg, run_id)
    assert code == 0
    assert "stopped by SIGTERM while starting" in caplog.text
    assert "stager ready" not in caplog.text
    assert list(list_segments(run_id)) == []


def test_a_pool_stopped_while_it_loads_ends_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config(small(tmp_path, items=40))
    caplog.set_level(logging.INFO, logger="ringfeed.producer.process.pool")
    started = []
    with (
        own_handlers(),
        patch.dict(os.environ),
        patch.object(pool_module, "load_before_fork", signal_self),
        patch.object(pool_module.ProducerPool, "start", lambda self, slot: started.append(slot)),
    ):
        code = pool_module.main(cfg, "ipc:///nowhere", 2, prefix="t")
    assert code == 0 and started == []
    assert "stopped by SIGTERM while starting" in caplog.text


def test_a_trainer_stopped_while_tensorflow_loads_ends_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ringfeed.consumer.trainer import trainer as trainer_module

    cfg = load_config(small(tmp_path, items=40))
    caplog.set_level(logging.INFO, logger="ringfeed.consumer.trainer")
    with own_handlers(), patch.object(trainer_module, "build_step", signal_self):
        code = trainer_module.main(cfg, rid("trainstop"))
    assert code == 0
    assert "trainer stopped by SIGTERM while starting; no step taken" in caplog.text


def test_a_stop_within_held_steps_waits_for_their_end() -> None:
    """A ring created and its unlink registered are not cut apart: the Stopped of a
    signal within held() comes as it ends."""
    steps = []
    with own_handlers():
        stop = StopFlag().install()
        with pytest.raises(Stopped), stop.raising():
            with stop.held():
                signal_self()
                steps.append("created")
                steps.append("its unlink registered")
            steps.append("never")
    assert steps == ["created", "its unlink registered"]


def test_a_ray_pool_stopped_while_it_joins_its_cluster_ends_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ray.init with a cluster's address takes seconds (and retries for a minute when
    the head is not up yet); a stop meanwhile ends the driver there, exit 0, and no
    actor is placed."""
    ray = pytest.importorskip("ray")
    from ringfeed.producer.process import ray_pool

    cfg = load_config(small(tmp_path, items=40))
    caplog.set_level(logging.INFO, logger="ringfeed.producer.process.ray_pool")
    drivers = []
    with (
        own_handlers(),
        patch.object(ray, "init", signal_self),
        patch.object(ray_pool, "RayProducers", lambda *a: drivers.append(a)),
    ):
        code = ray_pool.main(cfg, "127.0.0.1:1", "tcp://127.0.0.1:1")
    assert code == 0 and drivers == []
    assert "stopped by SIGTERM while starting" in caplog.text
