"""Processes of a run seen from outside: a signal to one that may be gone, its memory."""

from __future__ import annotations

import os
from pathlib import Path

# The stager's RSS may grow by this much over a short faulty run (allocator noise).
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
