"""The producer pool forks its workers (producer/process/pool.py) only while it runs one
thread: a lock another thread holds would stay held in the child, and a math
library's thread pool would start again there."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from unittest.mock import patch

from ringfeed.producer.process.pool import ProducerPool, os_threads
from ringfeed.shared.config import Config
from tests.support.paths import REPO


def test_a_pool_that_runs_a_thread_spawns_its_workers() -> None:
    with patch.dict(os.environ):  # the pool limits math threads for its children
        pool = ProducerPool(Config(), "ipc:///nowhere", 1, remote=False, prefix="t")
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    try:
        assert os_threads() > 1 and pool.context().get_start_method() == "spawn"
    finally:
        release.set()
        thread.join()


def as_ringfeed_producers(code: str) -> list[str]:
    """The words code prints, run in a fresh process started as `ringfeed producers` is
    (its math libraries loaded without thread pools: scripts/cli.py)."""
    code = "import sys; sys.argv[1:] = ['producers']\nimport ringfeed.scripts.cli\n" + code
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_ringfeed_producers_loads_its_math_libraries_without_thread_pools() -> None:
    """What `ringfeed producers` has imported before its pool starts runs one thread,
    so the pool forks; numpy's OpenBLAS alone starts one more without the limits."""
    code = (
        "import ringfeed.producer.process.pool as pool, numpy as np\n"
        "np.ones((64, 64)) @ np.ones((64, 64))\n"
        "print(pool.os_threads())\n"
    )
    assert as_ringfeed_producers(code) == ["1"]


def test_a_pool_forks_whatever_its_workers_math_threads() -> None:
    """What the pool loads for its workers before the fork (load_before_fork: the
    pipeline, the mel, the math libraries' limit) starts no thread, with
    producers.math_threads 1 or more (a limit above 1 started OpenBLAS's threads in the
    pool, which then spawned every worker); a worker raises its own limit."""
    code = (
        "import ringfeed.producer.process.pool as pool\n"
        "from ringfeed.shared.config import Config, replace\n"
        "for n in (1, 2):\n"
        "    cfg = replace(Config(), producers={'math_threads': n})\n"
        "    pool.load_before_fork(cfg)\n"
        "    p = pool.ProducerPool(cfg, 'ipc:///nowhere', 1, False, 't')\n"
        "    print(pool.os_threads(), p.context().get_start_method())\n"
    )
    assert as_ringfeed_producers(code) == ["1", "fork", "1", "fork"]


def test_a_failed_warm_up_before_the_fork_is_left_to_the_workers(caplog) -> None:
    """The pool's warm-up for its workers is only a head start: a failure there (any
    exception) must not end the pool, whose workers' own warm-up reports it to the
    stager as a crash, as before."""
    from ringfeed.producer import pipeline
    from ringfeed.producer.process import pool

    def broken(cfg: Config) -> None:
        raise ValueError("no mel for this config")

    with patch.object(pipeline, "warm_up_shared", broken), patch.dict(os.environ):
        pool.load_before_fork(Config())
    assert "no mel for this config" in caplog.text


def test_a_worker_told_to_stop_as_it_starts_stops_at_once() -> None:
    """A SIGTERM that reaches a worker before it has reset the handlers it forked with
    ends it; it once set the copy of the pool's stop flag, which nothing reads, and the
    worker ran on until stop_all killed it TERM_GRACE_S later (a launcher's stop just
    after the pool started its workers outlived the launcher's grace)."""
    code = (
        "import os, signal, time\n"
        "import ringfeed.producer.process.pool as pool\n"
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.shared.run.process import StopFlag\n"
        "StopFlag().install()\n"
        "p = pool.ProducerPool(Config(), 'ipc:///nowhere', 1, False, 't')\n"
        "for _ in range(5):\n"
        "    slot = p.slots[0]\n"
        "    p.start(slot)\n"
        "    os.kill(slot.proc.pid, signal.SIGTERM)\n"
        "    began = time.monotonic()\n"
        "    slot.proc.join(30)\n"
        "    print(slot.proc.exitcode, time.monotonic() - began < 2.0)\n"
    )
    assert as_ringfeed_producers(code) == ["-15", "True"] * 5


def test_a_pool_stopped_while_it_loads_starts_no_worker() -> None:
    """A stop that came while the pool loaded what its workers share (seconds, on a
    busy host) ends it before it starts a worker only to stop it."""
    from ringfeed.shared.run.process import StopFlag

    with patch.dict(os.environ):
        pool = ProducerPool(Config(), "ipc:///nowhere", 2, remote=False, prefix="t")
    stop = StopFlag()
    stop.set()
    assert pool.watch(stop) == 0
    assert all(slot.proc is None for slot in pool.slots)


def test_a_worker_killed_while_it_tells_the_pool_it_joined_never_hangs_the_pool() -> None:
    """A worker tells its pool it joined (at each WELCOME) through memory they share. A
    worker SIGKILLed inside that (the soak kills them at random) had died holding the lock
    of the multiprocessing Event it was setting; the pool's next look at it blocked for
    ever, signals and all, and no worker was restarted again. Here each worker dies right
    after it joins, and any multiprocessing Condition it would signal kills it while it
    holds that Condition's lock: the pool must go on restarting workers until stopped."""
    code = (
        "import os, signal\n"
        "import multiprocessing.synchronize as ms\n"
        "import ringfeed.producer.process.pool as pool\n"
        "from ringfeed.shared.config import Config, replace\n"
        "from ringfeed.shared.run.process import StopFlag\n"
        "def killed(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "ms.Condition.notify = ms.Condition.notify_all = killed\n"
        "def worker(cfg, name, endpoint, remote, on_welcome=None, busy=None):\n"
        "    on_welcome()\n"
        "    killed()\n"
        "pool.run_worker = worker\n"
        "cfg = replace(Config(), producers={'restart_backoff_s': 0.05})\n"
        "p = pool.ProducerPool(cfg, 'ipc:///nowhere', 1, False, 't')\n"
        "starts, start = [], p.start\n"
        "p.start = lambda slot: (starts.append(1), start(slot))\n"
        "stop = StopFlag()\n"
        "signal.signal(signal.SIGALRM, lambda *a: stop.set())\n"
        "signal.setitimer(signal.ITIMER_REAL, 3.0)\n"
        "p.watch(stop)\n"
        "print(p.context().get_start_method(), len(starts) >= 3)\n"
    )
    assert as_ringfeed_producers(code) == ["fork", "True"]
