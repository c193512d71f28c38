"""The producer pool forks its workers (producer/pool.py): only from a process that runs
no thread of its own, since a lock another thread holds stays held in the child."""

from __future__ import annotations

import os
import threading
from unittest.mock import patch

import pytest

from ringfeed.producer.pool import ProducerPool
from ringfeed.shared.config import Config


def test_a_pool_that_runs_a_thread_refuses_to_fork() -> None:
    with patch.dict(os.environ):  # the pool limits math threads for its children
        pool = ProducerPool(Config(), "ipc:///nowhere", 1, remote=False, prefix="t")
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    try:
        with pytest.raises(RuntimeError, match="must not fork"):
            pool.start(pool.slots[0])
        assert pool.slots[0].proc is None  # nothing was started
    finally:
        release.set()
        thread.join()
