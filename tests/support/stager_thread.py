"""The real stager in a thread of the test process, for checks at the level of messages.

    with stager_thread(config) as stager:            # consumer/stager/stager.py build()
        client = stager.client()                      # the run's consumer, here too
        with producer_threads(stager.cfg, stager.control, 2):   # honest producers
            items = consume(client)
            client.close()      # BYE: the stager ends the run and stops its producers
        summary = stager.summary()                    # its stager.json

Everything is as ``ringfeed stager`` makes it: the same parts, real ZeroMQ sockets and
real shared memory, its loop (Stager.run) and its ending (Stager.finish); only the
process is the test's. Starting one takes milliseconds where a process takes seconds.

One process is one peer to the stager on the ipc socket: the kernel shows it the same
pid behind every socket of the test (consumer/stager/peers.py). Hand-played local
peers and producer threads therefore share one fair share and one ban; a test whose
liar must be a peer apart from the honest producers gives one side a CURVE key of its
own over tcp (tests/support/configs.py keyed).

The one thing changed is a timer: stats go out every STATS_EVERY_S instead of the
stager's STATS_INTERVAL_S (0.5 s), so a test that reads the stats stream once a batch,
or waits for a counter, waits a fifth as long for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.consumer.stager import stager as stager_module
from ringfeed.consumer.stager.delivery import NothingDelivered
from ringfeed.consumer.stager.stager import build
from ringfeed.shared.config import Config, load_config
from ringfeed.shared.config.environment import endpoints, run_dir
from ringfeed.shared.memory.segments import list_segments, socket_files
from ringfeed.shared.run.process import LOG_FORMAT, StopFlag
from tests.support.runs import rid

# Longest a stager's loop may take to notice its stop flag and write stager.json.
END_WAIT_S = 10.0
# How often the stager in a thread publishes its stats, seconds.
STATS_EVERY_S = 0.1


class StagerLog(logging.Handler):
    """What the stager logs, formatted as its process would write it (one line per
    record, tracebacks included)."""

    LOGGER = "ringfeed.consumer.stager"

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%H:%M:%S"))
        self.lines: list[str] = []
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self.guard:
            self.lines.append(line)

    def text(self) -> str:
        with self.guard:
            return "\n".join(self.lines)

    @contextlib.contextmanager
    def attached(self) -> Iterator[StagerLog]:
        """Record the stager's INFO lines and above while inside (its logger's level
        is INFO meanwhile, as in its process)."""
        logger = logging.getLogger(self.LOGGER)
        level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)


class StagerThread:
    """One stager, built in this thread and run in another until the consumer's BYE,
    the end of its plan, or stop()."""

    def __init__(
        self, cfg: Config, run_id: str, cleanup: contextlib.ExitStack, log: StagerLog
    ) -> None:
        """cleanup: undoes what build() made; log: records what the stager logs."""
        self.cfg, self.run_id, self.log, self.flag = cfg, run_id, log, StopFlag()
        self.stager = build(cfg, run_id, self.flag, cleanup)
        self.ends = endpoints(cfg, run_id)
        self.clients: list[BatchClient] = []
        self.error: BaseException | None = None
        self.code: int | None = None  # what `ringfeed stager` would exit with
        self.thread = threading.Thread(target=self._run, name="stager", daemon=True)

    def _run(self) -> None:
        """stager.main's loop and ending, in this thread."""
        why = "stager stopping"
        try:
            self.stager.run()
            self.code = 0
        except NothingDelivered as exc:
            why, self.code = str(exc), 3
        except BaseException as exc:  # the test that waits for the end raises it
            self.error = exc
            logging.getLogger(StagerLog.LOGGER).exception("the stager's loop failed")
        finally:
            self.stager.finish(why)

    # ------------------------------------------------------------ endpoints
    @property
    def control(self) -> str:
        """The ipc control endpoint: local producers and the consumer."""
        return self.ends.control

    @property
    def tcp(self) -> str:
        """The tcp control endpoint (transport.kind: tcp): remote producers."""
        transport = self.cfg.transport
        return f"tcp://{transport.host}:{transport.port}"

    @property
    def stats(self) -> str:
        return self.ends.stats

    @property
    def dir(self) -> Path:
        return run_dir(self.cfg, self.run_id)

    # ------------------------------------------------------------ the run
    def client(self, name: str = "test", timeout_s: float = 30.0, **start: Any) -> BatchClient:
        """A connected consumer of this run in this process (closed at the end);
        start: where it starts (BatchClient's position, batch_index, plan, ...)."""
        client = BatchClient(self.cfg, self.run_id, name, **start)
        self.clients.append(client)
        client.connect(timeout_s=timeout_s)
        return client

    def stop(self) -> None:
        self.flag.set()

    def ended(self, timeout_s: float = END_WAIT_S) -> int:
        """Wait for the loop to end (the consumer's BYE, the plan's end or stop());
        its exit code as `ringfeed stager` would give it; its exception, raised."""
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise AssertionError(f"the stager still runs after {timeout_s:g} s")
        if self.error is not None:
            raise AssertionError("the stager's loop failed") from self.error
        assert self.code is not None
        return self.code

    def summary(self) -> dict[str, Any]:
        """stager.json, once the stager has ended as `ringfeed stager` exits 0 (its
        counters, drops, producers; tests/support/runs.py finish() for a process)."""
        assert self.ended() == 0, f"the stager ended with code {self.code}\n{self.log.text()}"
        return json.loads((self.dir / "stager.json").read_text())

    def close(self) -> None:
        """Close the clients, stop the loop and wait for it (bounded)."""
        for client in self.clients:
            client.close(finished=False)
        self.stop()
        self.thread.join(END_WAIT_S)


@contextlib.contextmanager
def stager_thread(config: Path | Config, run_id: str | None = None) -> Iterator[StagerThread]:
    """The stager of `config` (a file or a Config) running in a thread. Leaving the
    block stops it and removes what it made (rings, sockets and their files), however
    the test ended; stager.summary() still reads its stager.json."""
    cfg = config if isinstance(config, Config) else load_config(config)
    run_id = run_id or rid()
    log = StagerLog()
    every = mock.patch.object(stager_module, "STATS_INTERVAL_S", STATS_EVERY_S)
    with contextlib.ExitStack() as cleanup, log.attached(), every:
        cleanup.callback(remove_files, run_id)
        stager = StagerThread(cfg, run_id, cleanup, log)
        stager.thread.start()
        try:
            yield stager
        finally:
            stager.close()
            if stager.thread.is_alive():  # its loop still uses the sockets: files only
                cleanup.pop_all()
                remove_files(run_id)


def remove_files(run_id: str) -> None:
    """The run's segments and ipc socket files (the stager's cleanup removes them too:
    this is for a build() that failed half-way)."""
    for path in [*list_segments(run_id), *socket_files(run_id)]:
        path.unlink(missing_ok=True)
