"""Launch a real run's processes from tests: stager, producers, trainer (or drain).

Each process is `python -m scripts.cli VERB CONFIG --run-id RID` started in the
repository root, its output in tmp files named after the verb. A test wraps a
run in `with Run(...) as run:`; leaving the block SIGTERMs, then SIGKILLs,
whatever is still alive and removes the run's segments, so a failing test
leaves nothing behind. `shm_segments(rid)` is what the tests assert empty.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from consumer.batch_client import BatchClient

REPO = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")
# A trainer spends its first ~10-30 s importing TensorFlow and compiling on 2 cores.
DEFAULT_TIMEOUT_S = 120.0


def write_config(tmp_path: Path, raw: dict[str, Any], name: str = "config.yaml") -> Path:
    """Write raw as YAML with run.root in tmp_path; returns the file."""
    raw = {**raw, "run": {"root": str(tmp_path / "runs")}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def shm_segments(run_id: str) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"ringfeed-{run_id}-*"))


class Run:
    """The processes of one run id; start verbs, wait, signal, always clean up."""

    def __init__(self, config: Path, run_id: str, log_dir: Path) -> None:
        self.config, self.run_id, self.log_dir = config, run_id, log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.clients: list[BatchClient] = []
        self.launches = 0

    @property
    def dir(self) -> Path:
        root = yaml.safe_load(self.config.read_text())["run"]["root"]
        return Path(root) / self.run_id

    def start(self, verb: str, *extra: str) -> subprocess.Popen:
        self.launches += 1
        out = (self.log_dir / f"{self.run_id}-{verb}-{self.launches}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "scripts.cli", verb, str(self.config), "--run-id"]
            + [self.run_id, *extra],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()  # the child holds its own descriptor
        self.procs[verb] = proc
        return proc

    def start_all(self, consumer: str = "trainer") -> None:
        for verb in ("stager", "producers", consumer):
            self.start(verb)

    def wait(self, verb: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        try:
            return self.procs[verb].wait(timeout_s)
        except subprocess.TimeoutExpired:
            msg = f"{verb} still running after {timeout_s:.0f} s\n{self.logs()}"
            raise AssertionError(msg) from None

    def wait_all(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        return {v: self.wait(v, max(0.1, deadline - time.monotonic())) for v in self.procs}

    def client(self, name: str = "test", timeout_s: float = 60.0) -> BatchClient:
        """A connected consumer of this run in the test process (closed on exit)."""
        from shared.config import load_config

        client = BatchClient(load_config(self.config), self.run_id, name)
        client.connect(timeout_s=timeout_s)
        self.clients.append(client)
        return client

    def signal(self, verb: str, signum: int = signal.SIGTERM) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.procs[verb].send_signal(signum)

    def poll_for(self, predicate, timeout_s: float = DEFAULT_TIMEOUT_S, what: str = "") -> None:
        """Wait until predicate() is true; fail with the logs after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            if any(p.poll() not in (None, 0) for p in self.procs.values()):
                raise AssertionError(f"a process failed waiting for {what}\n{self.logs()}")
            time.sleep(0.1)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM everything alive, SIGKILL after grace_s; idempotent."""
        live = [p for p in self.procs.values() if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def logs(self, tail: int = 4000) -> str:
        parts = []
        for path in sorted(self.log_dir.glob(f"{self.run_id}-*.log")):
            parts.append(f"--- {path.name}\n{path.read_text()[-tail:]}")
        return "\n".join(parts)

    def json(self, name: str) -> dict[str, Any]:
        return json.loads((self.dir / name).read_text())

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self.clients:
            client.close(finished=False)
        self.stop(grace_s=5.0)
        for name in shm_segments(self.run_id):
            with contextlib.suppress(FileNotFoundError):
                (SHM / name).unlink()
