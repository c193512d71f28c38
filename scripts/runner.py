"""One way to start a run from Python: the processes of one run id, watched and cleaned up.

    with Run(config_path, run_id, log_dir) as run:   # log_dir None: inherit stdout
        run.start_all("trainer")                      # stager, producers, consumer
        code = run.watch(stop)                        # until done, a failure or stop

Each process is ``python -m ringfeed.scripts.cli VERB CONFIG --run-id RID`` started in the
repository root; the model process may instead be a command of the user's own
(``start_command``: ``ringfeed run CONFIG -- python train.py``), told its run by
RINGFEED_CONFIG and RINGFEED_RUN_ID. Before the first stager the corpus is prepared, in
this process, by the code `ringfeed prepare` runs (producer/prepare/prepare.py: what is
current is skipped), as no process of a run prepares it. Leaving the block SIGTERMs
whatever is still alive, SIGKILLs it after the grace (``RINGFEED_GRACE_S``, 8 s), then
removes the run's
segments from /dev/shm and its ipc socket files, so a failing test, benchmark
or run leaves nothing behind. Used by ``ringfeed run`` (and so by
scripts/launch.sh), the tests and every benchmark; what only tests need (waiting
for a condition, signalling one verb) is tests/support/runs.py's subclass.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import (
    CONFIG_ENV,
    RUN_ID_ENV,
    child_environment,
    launch_grace_s,
    run_dir,
)
from ringfeed.shared.memory.segments import list_segments, socket_files
from ringfeed.shared.run.process import POOL_ORPHANED, StopFlag, die_with_parent
from ringfeed.shared.run.run_secret import remove_dead_run_records
from ringfeed.shared.run.share import ONE_WORKER, Share

log = logging.getLogger(__name__)

# A trainer spends its first ~10-30 s importing TensorFlow and compiling on 2 cores.
DEFAULT_TIMEOUT_S = 120.0
WATCH_POLL_S = 0.2
# A local pool whose workers all lost a stager that is still running (it was paused
# past producers.orphan_s) exits POOL_ORPHANED; the launcher starts it again this many
# times.
POOL_RESTARTS = 3


class _Spawner(threading.Thread):
    """One daemon thread that starts processes for the other threads and never ends
    before this process does."""

    def __init__(self) -> None:
        super().__init__(name="ringfeed-spawner", daemon=True)
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self.start()

    def run(self) -> None:
        while True:
            job, done = self.jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # the caller's to raise
                done.set_exception(exc)


_spawner: _Spawner | None = None
_spawner_made = threading.Lock()


def _forget_spawner() -> None:
    """In a forked child: the spawner thread was not copied, and its lock may have been
    held by another thread at the fork."""
    global _spawner, _spawner_made
    _spawner, _spawner_made = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)


def popen_for_life(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen(*args, **kwargs) from a thread that lives as long as this process.
    A child's die_with_parent (PR_SET_PDEATHSIG) fires when the *thread* that forked it
    ends, not the process: a loader built in a setup thread or an executor's task lost
    its stager and producers to SIGTERM as soon as that thread finished. The main thread
    starts them itself; any other hands them to one daemon thread kept for the purpose."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(*args, **kwargs)
    with _spawner_made:
        if _spawner is None:
            _spawner = _Spawner()
        spawner = _spawner
    done: Future = Future()
    spawner.jobs.put((lambda: subprocess.Popen(*args, **kwargs), done))
    return done.result()


class RunError(RuntimeError):
    """A process of a run did not end in time; the message carries every process's log."""


def worker_pids(pool_pid: int) -> list[int]:
    """A producer pool's live worker processes: its children (forked or spawned:
    producer/process/pool.py) but multiprocessing's resource tracker; a process that exits while
    /proc is read is left out."""
    workers = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        children = Path(f"/proc/{pool_pid}/task/{pool_pid}/children").read_text().split()
        for pid in map(int, children):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    workers.append(pid)
    return workers


def exit_code(returncode: int) -> int:
    """A Popen return code as a shell reports it (-9 -> 137)."""
    return 128 - returncode if returncode < 0 else returncode


class Run:
    """The processes of one run id: start verbs, wait, watch, signal, always clean up."""

    def __init__(
        self, config: Path, run_id: str, log_dir: Path | None = None, grace_s: float | None = None
    ) -> None:
        self.config, self.run_id, self.log_dir = Path(config).absolute(), run_id, log_dir
        self.cfg = load_config(self.config)
        self.grace_s = launch_grace_s() if grace_s is None else grace_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.clients: list[BatchClient] = []
        self.launches = 0
        self.failure: tuple[str, int] | None = None
        self.pool_restarts = 0
        # Extra arguments of some verbs (a training worker's --worker, --cluster).
        self.verb_args: dict[str, list[str]] = {}
        self.consumer = ""  # the verb that consumes the run (start_all, start_command)
        # Whether the first stager is started after the corpus is prepared here (False: it
        # was, by the launcher's validate; or a stager is to be started alone).
        self.prepares = True
        # Children in a session of their own: a terminal's Ctrl-C or SIGHUP reaches this
        # process alone, which stops them (consumer/client/data_side.py).
        self.own_session = False

    @property
    def dir(self) -> Path:
        return run_dir(self.cfg, self.run_id)

    # ------------------------------------------------------------ processes
    def prepare(self) -> None:
        """The corpus prepared for this run (once; what is current is skipped); raises
        as `ringfeed prepare` fails (CorpusError, ConfigError)."""
        if self.prepares:
            from ringfeed.producer.prepare.prepare import prepare

            prepare(self.cfg)
            self.prepares = False

    def start(self, verb: str, *extra: str) -> subprocess.Popen:
        """Start `ringfeed VERB CONFIG --run-id RID EXTRA...` (a stager after the corpus is
        prepared); a restarted verb replaces the earlier process of that name."""
        if verb == "stager" and self.prepares:
            self.prepare()
        cmd = [sys.executable, "-m", "ringfeed.scripts.cli", verb, str(self.config)]
        cmd += ["--run-id", self.run_id, *self.verb_args.get(verb, []), *extra]
        return self._popen(verb, cmd, child_environment())

    def start_command(self, command: list[str], share: Share = ONE_WORKER) -> subprocess.Popen:
        """The user's own training command as this run's model process ("command", so
        the launcher's lines call it what it is, not "trainer"): its
        loaders find the run in RINGFEED_CONFIG and RINGFEED_RUN_ID (the run's id without
        the worker's suffix; a training worker also gets RANK and WORLD_SIZE, which the
        PyTorch loader reads: consumer/client/torch_loader.py)."""
        env = child_environment() | {
            CONFIG_ENV: str(self.config),
            RUN_ID_ENV: share.base_run_id(self.run_id),
        }
        if share.count > 1:
            env |= {"RANK": str(share.index), "WORLD_SIZE": str(share.count)}
        self.consumer = "command"
        return self._popen("command", command, env)

    def _popen(self, verb: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        self.launches += 1
        # die_with_parent: a launcher killed with SIGKILL takes its run down with it. The
        # children share the launcher's working directory: outputs (run_root, the cache)
        # are relative to it.
        session = self.own_session
        if self.log_dir is None:
            proc = popen_for_life(
                cmd, preexec_fn=die_with_parent, env=env, start_new_session=session
            )
        else:
            path = self.log_dir / f"{self.run_id}-{verb}-{self.launches}.log"
            with path.open("w") as out:  # the child holds its own descriptor
                proc = popen_for_life(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent,
                    env=env,
                    start_new_session=session,
                )
        self.procs[verb] = proc
        return proc

    def start_all(self, consumer: str = "trainer") -> None:
        """The stager, the producer pool and the consumer verb ("none": a consumer of
        the user's own, e.g. ring_dataset in their process)."""
        for verb in ("stager", "producers", consumer):
            if verb != "none":
                self.start(verb)
        self.consumer = consumer if consumer != "none" else ""

    def wait(self, verb: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        """The exit code of `verb`; RunError with the logs if it runs past timeout_s."""
        try:
            return self.procs[verb].wait(timeout_s)
        except subprocess.TimeoutExpired:
            msg = f"{verb} still running after {timeout_s:.0f} s\n{self.logs()}"
            raise RunError(msg) from None

    def wait_all(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        return {v: self.wait(v, max(0.1, deadline - time.monotonic())) for v in self.procs}

    def watch(self, stop: StopFlag | None = None) -> int:
        """Wait for every process. The first that fails, or a stop signal, stops the
        others; once the stager has ended the run, or the consumer has ended well (a
        user's command need not say BYE), stragglers get the grace. Returns 0 if all
        exited 0, else the first failure's exit code (shell style)."""
        ended_at: float | None = None
        while True:
            codes = {verb: proc.poll() for verb, proc in self.procs.items()}
            if self._restart_pool(codes, stop):
                continue
            for verb, code in codes.items():
                if code not in (None, 0) and self.failure is None:
                    self.failure = (verb, exit_code(code))
                    log.error("%s exited with code %d; stopping the run", verb, exit_code(code))
            if all(code is not None for code in codes.values()):
                break
            if self.failure is not None or (stop is not None and stop.is_set()):
                self.stop()
                break
            if codes.get("stager") is not None or codes.get(self.consumer) == 0:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > self.grace_s:
                    self.stop()
                    break
            time.sleep(WATCH_POLL_S)
        if self.failure is None:
            failed = [(v, exit_code(p.returncode)) for v, p in self.procs.items() if p.returncode]
            self.failure = failed[0] if failed else None
        return self.failure[1] if self.failure else 0

    def _restart_pool(self, codes: dict[str, int | None], stop: StopFlag | None) -> bool:
        """Start the local pool again when it exited orphaned (POOL_ORPHANED) while the
        stager runs, up to POOL_RESTARTS times; True if it did. Any other exit of the
        pool is left to watch: 0 at the run's end, 2 when refused, 1 when its workers
        crashed past producers.max_restarts: each a failure."""
        if codes.get("producers") != POOL_ORPHANED or codes.get("stager", 0) is not None:
            return False
        if (stop is not None and stop.is_set()) or self.pool_restarts >= POOL_RESTARTS:
            if self.pool_restarts >= POOL_RESTARTS:
                log.error(
                    "the producer pool lost its stager %d times; ending the run",
                    self.pool_restarts + 1,
                )
            return False
        self.pool_restarts += 1
        log.warning(
            "the producer pool exited: its workers lost the stager, which still "
            "runs (paused?); starting it again (%d/%d)",
            self.pool_restarts,
            POOL_RESTARTS,
        )
        self.start("producers")
        return True

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM everything alive, SIGKILL after the grace; idempotent."""
        grace_s = self.grace_s if grace_s is None else grace_s
        live = [p for p in self.procs.values() if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("pid %d ignored SIGTERM for %.0f s; killing it", p.pid, grace_s)
                p.kill()
                p.wait()

    # ------------------------------------------------------------ consumers and results
    def client(self, name: str = "test", timeout_s: float = 60.0, **start: Any) -> BatchClient:
        """A connected consumer of this run in this process (closed on exit); start:
        where it starts (BatchClient's position, batch_index, plan)."""
        client = BatchClient(self.cfg, self.run_id, name, **start)
        try:
            client.connect(timeout_s=timeout_s)
        except BaseException as e:
            # Its socket open, its context's collection would wait for it for ever (a
            # stager that failed at start hung the test that started it).
            client.close(finished=False)
            if logs := self.logs():  # why the stager never answered is in its log
                e.add_note(logs)
            raise
        self.clients.append(client)
        return client

    def logs(self, tail: int = 4000) -> str:
        if self.log_dir is None:
            return ""
        parts = []
        for path in sorted(self.log_dir.glob(f"{self.run_id}-*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def json(self, name: str) -> dict[str, Any]:
        return json.loads((self.dir / name).read_text())

    # ------------------------------------------------------------ cleanup
    def cleanup(self) -> None:
        """Remove the run's segments, ipc socket files and its stager's record (call once
        its processes are gone: a stager killed with SIGKILL removes none of them)."""
        for path in list_segments(self.run_id):
            path.unlink(missing_ok=True)
        for path in socket_files(self.run_id):
            path.unlink(missing_ok=True)
        remove_dead_run_records(self.run_id)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self.clients:
            client.close(finished=False)
        self.stop()
        self.cleanup()
