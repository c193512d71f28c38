"""Honest producers in threads of the test process: the real producer loop
(producer/process/worker.py Worker) against a stager, without a process of its own.

    with producer_threads(cfg, stager.control, n=2) as workers:   # local: write the ring
        ...
    with producer_threads(cfg, stager.tcp, keys=load_client(bundle)):  # remote, keyed

Each Worker is made in its own thread (its per-sample alarm needs the main thread, so
in a thread it runs unbounded, as producer/process/watchdog.py says) and runs until the
stager ends its session (SHUTDOWN at the plan's end) or the block ends. Faults
injected for the config (tests/support/fault_sources.py) reach it through the same
source hook a producer process reads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ringfeed.producer.process.session import ENDINGS, EXIT_FINISHED
from ringfeed.producer.process.worker import Worker
from ringfeed.shared.config import Config
from ringfeed.shared.run.process import StopFlag
from ringfeed.shared.wire.keys import ClientKeys

# Longest a worker may take to say BYE and close once stopped (session's wait included).
JOIN_S = 10.0


class ProducerThread(threading.Thread):
    """One Worker in a thread; `code` is its session's exit code once it ended."""

    def __init__(
        self, cfg: Config, name: str, endpoint: str, stop: StopFlag, keys: ClientKeys | None
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.cfg, self.endpoint, self.stop, self.keys = cfg, endpoint, stop, keys
        self.code: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        remote = self.endpoint.startswith("tcp://")
        try:
            worker = Worker(self.cfg, self.name, self.endpoint, remote, self.stop, keys=self.keys)
            try:
                worker.source.warm_up()
                worker.run()
            finally:
                worker.close()
            self.code = worker.session.exit_code
        except BaseException as exc:  # the block that started it raises it
            self.error = exc


@contextlib.contextmanager
def producer_threads(
    cfg: Config,
    endpoint: str,
    n: int = 1,
    name: str = "thread",
    keys: ClientKeys | None = None,
) -> Iterator[list[ProducerThread]]:
    """n producers NAME-0 .. NAME-(n-1) of cfg's samples, connected to endpoint (tcp:
    remote, with keys where the stager wants them). Leaving the block stops those still
    running and fails the test if one raised or ended otherwise than finished (refused,
    or orphaned: what makes a producer pool exit non-zero)."""
    stop = StopFlag()
    threads = [ProducerThread(cfg, f"{name}-{k}", endpoint, stop, keys) for k in range(n)]
    for thread in threads:
        thread.start()
    try:
        yield threads
    finally:
        stop.set()
        for thread in threads:
            thread.join(JOIN_S)
    errors = [f"{t.name}: {t.error!r}" for t in threads if t.error is not None]
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a producer thread did not stop"
    endings = {t.name: ENDINGS.get(t.code, t.code) for t in threads if t.code != EXIT_FINISHED}
    assert not endings, endings
