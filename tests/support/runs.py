"""Real runs in tests: scripts.runner.Run plus what only tests need, a run id, the
run's segments, and the end of a run.

Most tests start a run in one line:

    with started(config, tmp_path) as (run, client):   # stager, producers, a consumer
        items = consume(client)
        client.close()
        summary = finish(run, "producers")

and one that starts its processes in another order or with arguments wraps them in
``with Run(config, rid(), tmp_path) as run:``. Leaving either block stops every
process and removes the run's segments and socket files, so a failing test leaves
nothing behind. ``shm_segments(rid)`` is what the tests assert empty.
"""

from __future__ import annotations

import contextlib
import json
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.scripts import runner
from ringfeed.scripts.runner import DEFAULT_TIMEOUT_S
from ringfeed.shared.config.environment import endpoints
from ringfeed.shared.memory.segments import list_segments
from ringfeed.shared.run.share import Share
from tests.support.polling import wait_for
from tests.support.ports import free_ports

T = TypeVar("T")


class Run(runner.Run):
    """The launcher's Run, with the waits and signals tests use on it."""

    def poll_for(
        self, condition: Callable[[], T], timeout_s: float = DEFAULT_TIMEOUT_S, what: str = ""
    ) -> T:
        """wait_for(condition) that fails at once, with the logs, if a process of the
        run exits non-zero meanwhile; returns condition()'s first true value."""

        def holds() -> T:
            value = condition()
            failed = [verb for verb, proc in self.procs.items() if proc.poll() not in (None, 0)]
            if not value and failed:
                raise AssertionError(f"{failed} failed waiting for {what}\n{self.logs()}")
            return value

        return wait_for(holds, timeout_s, what, context=self.logs)

    def signal(self, verb: str, signum: int = signal.SIGTERM) -> None:
        """Send signum to verb's process unless it is gone."""
        with contextlib.suppress(ProcessLookupError):
            self.procs[verb].send_signal(signum)

    def worker_pids(self) -> list[int]:
        """The live workers of the local producer pool."""
        return runner.worker_pids(self.procs["producers"].pid)

    @property
    def stats(self) -> str:
        """The endpoint of the stager's stats stream (tests/support/stats.py reads it)."""
        return endpoints(self.cfg, self.run_id).stats


def rid(tag: str = "") -> str:
    """A fresh run id, so runs of concurrent tests never share segments or sockets."""
    return f"t{tag}{uuid.uuid4().hex[:8]}"


def shm_segments(run_id: str) -> list[str]:
    """The names of the run's segments in /dev/shm."""
    return [p.name for p in list_segments(run_id)]


@contextlib.contextmanager
def started(
    config: Path,
    tmp_path: Path,
    *verbs: str,
    run_id: str | None = None,
    consumer: str = "test",
    timeout_s: float = 30.0,
    **start: Any,
) -> Iterator[tuple[Run, BatchClient]]:
    """A Run of config (its logs in tmp_path) with `verbs` started in order (the stager
    and the producer pool if none are named) and a consumer of that name connected in
    this process; start: where it starts (BatchClient's position, batch_index, plan).
    Leaving the block closes the client, stops every process and cleans up."""
    with Run(config, run_id or rid(), tmp_path) as run:
        for verb in verbs or ("stager", "producers"):
            run.start(verb)
        yield run, run.client(name=consumer, timeout_s=timeout_s, **start)


def finish(run: Run, *verbs: str) -> dict[str, Any]:
    """Wait (bounded) for the stager and `verbs` to exit 0; no segment left; stager.json."""
    for verb in ("stager", *verbs):
        assert run.wait(verb, 20) == 0, f"{verb} failed\n{run.logs()}"
    assert shm_segments(run.run_id) == []
    return run.json("stager.json")


def batch_records(path: Path) -> dict[int, dict]:
    """step -> the last record written for it (a resumed run rewrites steps after its
    checkpoint); a line torn by SIGKILL is skipped."""
    records = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        records[record["step"]] = record
    return records


@contextlib.contextmanager
def workers(config: Path, tmp_path: Path, base: str, n: int = 2):
    """The runs of n training workers (stager, producers, trainer each), started."""
    cluster = ",".join(f"127.0.0.1:{port}" for port in free_ports(n))
    with contextlib.ExitStack() as stack:
        runs = []
        for k in range(n):
            run = stack.enter_context(Run(config, Share(k, n).run_id(base), tmp_path))
            args = ["--worker", f"{k}/{n}"]
            run.verb_args = {"stager": args, "trainer": [*args, "--cluster", cluster]}
            run.start_all()
            runs.append(run)
        yield runs
