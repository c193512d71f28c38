"""The producer pool: N worker processes forked from it, restarted when they crash.

Process entry ``ringfeed producers``. Workers are forked from the pool, which has
imported what they run once: spawned, each worker imported it all again (0.45 s of
CPU per worker on 2 cores here, before its first grant: benchmarks/first_batch.py).
Forking is safe while the pool process runs one thread: it holds no ZeroMQ context
or socket (each worker makes its own after the fork), and `ringfeed producers`
loads its math libraries without thread pools (scripts/cli.py), which a forked
child would start again beside producers.math_threads. A pool that runs more
threads (started some other way) spawns its workers instead, and says so once.
Workers never import TensorFlow. A worker that dies after the stager welcomed it
(a poison input, an OOM kill, a library's exit(0)) is restarted after
restart_backoff_s, always: the stager charges the input it was working on and
skips that input after ring.max_item_attempts, so one item never stops the
pool. A worker that dies before it ever joined (a broken install, a bad
config) is restarted after restart_backoff_s * 2**k (at most MAX_BACKOFF_S),
at most producers.max_restarts times in a row (a worker alive HEALTHY_S starts
over). Only EXIT_FINISHED (the run is over), EXIT_ORPHANED (the stager is
gone) and EXIT_REFUSED (the stager refused it: another version or config) end
a worker for good, and only when its session chose it (the worker says so in shared
memory before it exits: code in a sample may exit with 3, 4 or 5 too); the pool then
ends with pool_exit_code's code. Tracebacks
are logged and sent to the stager by the worker itself.
A worker stuck in one sample for watchdog.HARD_FACTOR leases (a hang the
worker's own alarm cannot break: producer/process/watchdog.py) is SIGKILLed, and so
restarted like any worker that died at work.
On SIGTERM or Ctrl-C the pool stops its workers with SIGTERM, then SIGKILL
after TERM_GRACE_S.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringfeed.producer.features.fft import fastest
from ringfeed.producer.process.session import ENDINGS, EXIT_FINISHED, pool_exit_code
from ringfeed.producer.process.threads import pin_math_threads
from ringfeed.producer.process.watchdog import HARD_FACTOR, stuck_for
from ringfeed.producer.process.worker import run_worker
from ringfeed.shared.config import Config, config_from_yaml
from ringfeed.shared.corpus.registry import format_of
from ringfeed.shared.run.process import (
    POLL_S,
    STOP_SIGNALS,
    TERM_GRACE_S,
    StopFlag,
    Stopped,
    die_with_parent,
    setup_logging,
)

log = logging.getLogger(__name__)

# Longest wait before restarting a crashed worker, seconds.
MAX_BACKOFF_S = 30.0
# A worker alive this long is healthy again: its restart count and backoff start over.
HEALTHY_S = 60.0
# After one worker heard the run is over, the others get this long to hear it too.
RUN_END_GRACE_S = 3.0


def _child(
    config_yaml: str, name: str, endpoint: str, remote: bool, joined: Any, busy: Any, said: Any
) -> None:
    # The pool's handlers came with the fork: until run_worker installs its own, a
    # SIGTERM ends the worker, as it ended a freshly spawned one. The pool started it
    # with the stop signals blocked (ProducerPool.start): one sent before these lines
    # waited, and is delivered to the default action now, not to the pool's flag.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    # A pool that dies without stopping its workers (SIGKILL, the OOM killer) must not
    # leave them behind: SIGKILL, not SIGTERM, for a worker stopped then (a debugger,
    # SIGSTOP) keeps a SIGTERM pending for ever, and the rings' memory with it. What it
    # held is taken back as from any dead producer (its finished rows salvaged).
    die_with_parent(signal.SIGKILL)
    setup_logging()
    cfg = config_from_yaml(config_yaml)

    def welcomed() -> None:
        joined.value = 1

    code = run_worker(cfg, name, endpoint, remote, on_welcome=welcomed, busy=busy)
    said.value = code  # an ending the pool may trust: user code may exit 3 too (os._exit)
    sys.exit(code)


@dataclass
class Slot:
    name: str
    proc: mp.process.BaseProcess | None = None
    restarts: int = 0
    restart_at: float = 0.0
    started_at: float = 0.0
    finished: bool = False
    ending: int = 0  # the exit code that ended it for good (ENDINGS), or 0
    # Shared without a lock, all three: a worker SIGKILLed while it held a lock (a
    # multiprocessing Event's, in its set()) left it held for good, and the pool's next
    # look at it blocked for ever, signals and all: no worker restarted again.
    joined: Any = None  # shared int: 1 once the stager welcomed the worker
    busy: Any = None  # shared double: when the worker's current sample began (0: idle)
    said: Any = None  # shared int: the exit code the worker's session chose, or 0


class ProducerPool:
    """Starts, watches and stops the workers of one host."""

    def __init__(self, cfg: Config, endpoint: str, workers: int, remote: bool, prefix: str):
        from ringfeed.producer.process.threads import math_thread_env

        # For what a worker loads (all of it, spawned); what the pool loaded is pinned
        # (load_before_fork, or run_worker in a spawned worker).
        os.environ.update(math_thread_env(cfg.producers.math_threads))
        self.cfg, self.endpoint, self.remote = cfg, endpoint, remote
        self.spawned = False  # said once that the workers are spawned, not forked
        self.slots = [Slot(f"{prefix}-{i}") for i in range(workers)]
        self._yaml = cfg.to_yaml()
        self.ended_at = 0.0  # when the first worker was told the run is over

    def context(self) -> Any:
        """fork while this process runs one thread (a lock another thread holds would
        stay held in the child, a thread pool would start again there), else spawn."""
        threads = os_threads()
        if threads == 1:
            return mp.get_context("fork")
        if not self.spawned:
            self.spawned = True
            log.warning(
                "the producer pool runs %d threads (math libraries loaded with "
                "thread pools?): its workers are spawned, not forked, and each "
                "imports everything again; start it with `ringfeed producers`",
                threads,
            )
        return mp.get_context("spawn")

    def start(self, slot: Slot) -> None:
        ctx = self.context()
        slot.joined, slot.busy = ctx.Value("i", 0, lock=False), ctx.Value("d", 0.0, lock=False)
        slot.said = ctx.Value("i", 0, lock=False)
        slot.proc = ctx.Process(
            target=_child,
            args=(
                self._yaml,
                slot.name,
                self.endpoint,
                self.remote,
                slot.joined,
                slot.busy,
                slot.said,
            ),
            name=slot.name,
            daemon=False,
        )
        # Blocked across the fork: a SIGTERM that reached the child before _child reset
        # its handlers set a copy of the pool's stop flag that nothing reads, and the
        # worker ran on until stop_all killed it TERM_GRACE_S later.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            slot.proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        slot.started_at = time.monotonic()

    def watch(self, stop: StopFlag) -> int:
        """Main loop: restart dead workers until stop or all finished; returns exit code."""
        for slot in self.slots:
            if not stop.is_set():  # stopped while it loaded: no worker to start and stop
                self.start(slot)
        while not stop.wait(POLL_S * 4):
            for slot in self.slots:
                self.check(slot)
            if all(s.finished for s in self.slots):
                break
            if self.ended_at and time.monotonic() - self.ended_at > RUN_END_GRACE_S:
                log.info("the run ended; stopping workers that missed the stager's SHUTDOWN")
                break
        if stop.is_set():  # not the end of the run: a signal (a launcher's stop, Ctrl-C)
            name = signal.Signals(stop.signal).name if stop.signal else "its stop flag"
            log.info("producers stopping: the run was stopped by %s", name)
        self.stop_all()
        failed = [
            s.name
            for s in self.slots
            if s.finished and s.restarts > self.cfg.producers.max_restarts
        ]
        if failed and len(failed) == len(self.slots):
            return 1
        return pool_exit_code([s.ending for s in self.slots])

    def check(self, slot: Slot) -> None:
        now = time.monotonic()
        if slot.finished:
            return
        if slot.proc is None:
            if now >= slot.restart_at:
                self.start(slot)
            return
        if slot.proc.is_alive():
            if slot.restarts and now - slot.started_at > HEALTHY_S:
                slot.restarts = 0  # max_restarts counts crashes in a row, not over a run
            self.kill_if_stuck(slot, now)
            return
        code = slot.proc.exitcode
        slot.proc.join()
        slot.proc = None
        # An ending counts only if the session chose it: a library's exit(3) or os._exit(5)
        # in a sample's code is a death at work like any other.
        if (code in ENDINGS and slot.said.value == code) or self.ended_at:
            self.end(slot, code, now)
            return
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        if slot.joined.value:
            # It died at work (a poison input, an OOM kill): the stager charges that input
            # and skips it after ring.max_item_attempts; the pool never gives up on it.
            log.error("%s died (%s) while working; restarting it", slot.name, how)
            slot.restart_at = now + self.cfg.producers.restart_backoff_s
            return
        slot.restarts += 1
        if slot.restarts > self.cfg.producers.max_restarts:
            log.error(
                "%s died (%s); gave up after %d restarts (producers.max_restarts)",
                slot.name,
                how,
                self.cfg.producers.max_restarts,
            )
            slot.finished = True
            return
        delay = min(MAX_BACKOFF_S, self.cfg.producers.restart_backoff_s * 2 ** (slot.restarts - 1))
        log.error(
            "%s died (%s); restart %d/%d in %.1f s",
            slot.name,
            how,
            slot.restarts,
            self.cfg.producers.max_restarts,
            delay,
        )
        slot.restart_at = now + delay

    def kill_if_stuck(self, slot: Slot, now: float) -> None:
        """The hard bound on one sample's work (producer/process/watchdog.py)."""
        stuck = stuck_for(slot.busy, slot.proc.pid if slot.proc is not None else None, now)
        if slot.proc is not None and stuck > HARD_FACTOR * self.cfg.ring.lease_s:
            log.error(
                "%s has been stuck in one sample for %.0f s; killing it (the stager "
                "charges that item)",
                slot.name,
                stuck,
            )
            slot.proc.kill()
            slot.busy.value = 0.0

    def end(self, slot: Slot, code: int, now: float) -> None:
        """No restart: the run is over, its stager gone, or it refused us (ENDINGS); or
        another worker's ending already ended the run."""
        slot.finished = True
        if code in ENDINGS:
            slot.ending = code
            self.ended_at = self.ended_at or now
            if code != EXIT_FINISHED:
                log.error("%s %s; not restarting it", slot.name, ENDINGS[code])

    def stop_all(self) -> None:
        """SIGTERM every worker, SIGKILL what is left after TERM_GRACE_S."""
        live = [s.proc for s in self.slots if s.proc is not None and s.proc.is_alive()]
        for proc in live:
            proc.terminate()
        deadline = time.monotonic() + TERM_GRACE_S
        for proc in live:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("%s ignored SIGTERM for %.0f s; killing it", proc.name, TERM_GRACE_S)
                proc.kill()
                proc.join()


def os_threads() -> int:
    """The threads this process runs, native ones included (/proc: Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return threading.active_count()


def load_before_fork(cfg: Config) -> None:
    """What each worker would load and build for itself after the fork, done once here
    for all (~40 ms of each worker's start, benchmarks/first_batch.py): the math
    libraries' thread limit, the pipeline's modules, the mel's filterbank and FFT
    library. None of it starts a thread (the pool forks only while it runs one) or
    opens a file or socket a worker would share. The limit is 1, as the libraries were
    loaded (scripts/cli.py): a limit above 1 starts OpenBLAS's threads at once, so a
    worker with producers.math_threads > 1 raises its own after the fork."""
    pin_math_threads(1)
    if format_of(cfg).has_audio:
        from ringfeed.producer.pipeline import warm_up_shared

        try:
            warm_up_shared(cfg)
        except Exception as exc:  # noqa: BLE001 - each worker's own warm-up reports it
            log.warning(
                "the features' warm-up failed in the pool (%s); each producer's "
                "own warm-up tries again and reports it",
                exc,
            )


def main(cfg: Config, endpoint: str, workers: int, remote: bool = False, prefix: str = "") -> int:
    """Process entry of `ringfeed producers`; workers are named PREFIX-i.

    The default prefix is host.pool-pid: two pools on one host (local producers and
    extra ones started by hand) must not share names, or each HELLO would take over
    the other's grants as a restart of the same producer."""
    prefix = prefix or f"{socket.gethostname()}.{os.getpid()}"
    stop = StopFlag().install()
    try:
        with stop.raising():  # seconds on a busy host: a stop meanwhile ends it there
            if cfg.features.device == "producer" and format_of(cfg).has_audio:
                # Chosen before the fork, the workers inherit it: a host's first run times
                # the FFT libraries once (0.5 s of CPU importing scipy.fft), not in each.
                fastest(cfg.features.n_fft, cfg.features.cache_dir)
            load_before_fork(cfg)
    except Stopped as exc:
        log.info("producers: %s", exc)
        return 0
    pool = ProducerPool(cfg, endpoint, workers, remote, prefix)
    log.info("starting %d producers -> %s", workers, endpoint)
    return pool.watch(stop)
