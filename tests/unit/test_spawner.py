"""Where a run's processes are started from (scripts/runner.py popen_for_life): their
die_with_parent (PR_SET_PDEATHSIG) fires when the thread that forked them ends, so every
thread but the main one hands them to one daemon thread kept for it. The run started
from a thread that ends: tests/process/test_failures_propagate.py."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO

FORKED = """
import os, threading
from ringfeed.scripts import runner

def from_a_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(runner.popen_for_life(["true"]).wait()))
    t.start()
    t.join(10.0)
    return out

print(from_a_thread(), flush=True)  # the spawner thread is made
pid = os.fork()
if pid == 0:
    os._exit(0 if from_a_thread() == [0] else 1)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def test_a_forked_child_starts_processes_from_a_thread_of_its_own() -> None:
    """A child forked after the spawner thread was made has no such thread (fork copies
    only the calling one): its first call from a thread must make one, not wait for ever
    on the parent's."""
    out = subprocess.run(
        [sys.executable, "-c", FORKED], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[0]", "0"], out.stdout
