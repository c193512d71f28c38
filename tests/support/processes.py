"""Processes of a run seen from outside: a signal to one that may be gone, its memory;
a process that sees a small tmpfs where the test puts one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The stager's RSS may grow by this much over a short faulty run (allocator noise).
# `ringfeed` as a command line of the test's own interpreter: [*CLI, "validate", CFG].
CLI = (sys.executable, "-m", "ringfeed.scripts.cli")
RSS_SLACK_KB = 16 * 1024


def rss_kb(pid: int) -> int:
    """Resident set size of a live process, KiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def send_signal(pid: int, signum: int) -> bool:
    """Signal pid; False if it is already gone (a worker may exit at any time)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def run_on_small_tmpfs(where: str, size: str, argv: list[str]) -> subprocess.CompletedProcess:
    """Run argv with a fresh tmpfs of `size` (mount's size=, e.g. "4m") mounted on the
    existing directory `where` in a private mount namespace: a real small filesystem
    that nothing outside the process sees, and that goes with it. Skips the test where
    no namespace can be made (not root and no unprivileged user namespaces)."""
    root = [] if os.geteuid() == 0 else ["--map-root-user"]
    mount = f'mount -t tmpfs -o size={size} tmpfs {where} && exec "$@"'
    cmd = ["unshare", *root, "--mount", "sh", "-c", mount, "sh"]
    try:
        probe = subprocess.run([*cmd, "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here: cannot mount a small tmpfs")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {probe.stderr.strip()}")
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=120)
