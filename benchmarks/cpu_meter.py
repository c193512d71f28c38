"""CPU seconds of a benchmark's pipeline, by process: for benchmarks/peers.py (per sample
over a timed window) and benchmarks/first_batch.py (to the first batch).

Roles: "stager" and "producers" (a ringfeed process this one started, with what it
started: the pool's workers), "this process" (the batch client, or all of tf.data).
"""

from __future__ import annotations

import os
from pathlib import Path


class CpuMeter:
    """CPU seconds used by this process and its descendants, by role: "stager" and
    "producers" (a ringfeed process this one started, with what it started: the pool's
    workers), "this process" (the batch client, or all of tf.data). The processes are
    found in /proc once, at the first batch (a scan costs ~4 ms); each read() after
    reads only theirs, and a process that has ended keeps its last reading: at the end
    of data the stager stops the producers before the client hears of it."""

    def __init__(self) -> None:
        self.first = self.last = self._scan()

    def _scan(self) -> dict[int, tuple[str, float]]:
        table: dict[int, tuple[int, bytes]] = {}
        for d in Path("/proc").iterdir():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                table[int(d.name)] = (ppid, (d / "cmdline").read_bytes())
            except (OSError, ValueError):  # not a process, or gone since the listing
                continue
        me, found = os.getpid(), {}
        for pid in table:
            top = pid
            while top > 1 and top != me and table.get(top, (0, b""))[0] != me:
                top = table.get(top, (0, b""))[0]
            if top == me:
                found[pid] = "this process"
            elif top > 1:
                argv = table[top][1].split(b"\0")
                found[pid] = next(
                    (v.decode() for v in (b"stager", b"producers") if v in argv), "other"
                )
        return {pid: (role, cpu) for pid, role in found.items() if (cpu := cpu_s(pid)) >= 0}

    def totals_s(self) -> dict[str, float]:
        """CPU seconds each role had used when its processes were found (their whole life
        so far; this process's whole life too)."""
        roles: dict[str, float] = {}
        for role, cpu in self.first.values():
            roles[role] = roles.get(role, 0.0) + cpu
        return roles

    def read(self) -> None:
        self.last = {pid: (role, max(cpu, cpu_s(pid))) for pid, (role, cpu) in self.last.items()}

    def ms_per_sample(self, samples: int) -> dict[str, float]:
        roles: dict[str, float] = {}
        for pid, (role, cpu) in self.last.items():
            roles[role] = roles.get(role, 0.0) + 1e3 * (cpu - self.first[pid][1]) / samples
        return roles


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) pid has used so far; -1 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return -1.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
