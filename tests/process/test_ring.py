"""The ring across processes: a view outlives its map in a child, a killed owner's
segment is removed, a zombie is dead, rings that do not fit are refused at creation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.memory.ring import HEADER_DTYPE, Ring, segment_name
from ringfeed.shared.memory.segments import list_segments, pid_alive, remove_stale_segments
from ringfeed.shared.memory.shm import SHM_DIR
from tests.support.polling import wait_for
from tests.support.processes import run_on_small_tmpfs


def test_a_view_kept_past_close_and_unlink_stays_readable(run_id: str) -> None:
    """A view of an attached ring outlives the ring's close, the owner's close and the
    segment's unlink (a batch kept after free, a stager restarted): reading or printing
    it neither crashes nor reads unmapped memory. In a child: a crash is an exit code."""
    code = (
        "import numpy as np\n"
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.shared.memory.ring import Ring, segment_name\n"
        f"owner = Ring.create(segment_name('{run_id}', 'samples'), Config().sample_fields(), "
        f"2, '{run_id}', 'samples')\n"
        "owner.view('tokens')[1] = np.arange(owner.view('tokens').shape[1])\n"
        "reader = Ring.attach(owner.name)\n"
        "kept = reader.view('tokens')[1]\n"
        "reader.close(); owner.close(); owner.unlink()\n"
        "print(int(kept.sum()), repr(kept)[:20])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    n = Config().text.max_text_len
    assert out.stdout.split()[0] == str(n * (n - 1) // 2)


def test_stale_segment_of_a_killed_owner_is_removed(run_id: str) -> None:
    code = (
        "import sys, time\n"
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.shared.memory.ring import Ring, segment_name\n"
        f"Ring.create(segment_name('{run_id}', 'spares'), Config().sample_fields(), 2, "
        f"'{run_id}', 'spares')\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"  # the owner lives on, holding its segment, until SIGKILLed below
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    assert remove_stale_segments(run_id) == []  # owner alive: kept
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert remove_stale_segments(run_id) == [segment_name(run_id, "spares")]
    assert list(list_segments(run_id)) == []


def test_a_maker_killed_while_it_makes_a_ring_leaves_nothing_in_the_next_ones_way(
    run_id: str,
) -> None:
    """SIGKILL at points spread over Ring.create (reserve, header, link, map): whatever it
    leaves, the next stager's remove_stale_segments clears and its Ring.create of the
    same name succeeds at once. Before segments were linked into place whole, a kill
    while reserving left a headerless segment young enough to be spared, and the
    restarted stager failed on it (tests/process/test_transport_e2e.py, in CI)."""
    name, fields, n_slots = segment_name(run_id, "spares"), Config().sample_fields(), 128
    started = time.perf_counter()
    with Ring.create(name, fields, n_slots, run_id, "spares"):
        made_s = time.perf_counter() - started
    code = (
        "import sys\n"
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.shared.memory.ring import Ring\n"
        "sys.stdin.readline()\n"
        f"Ring.create('{name}', Config().sample_fields(), {n_slots}, '{run_id}', 'spares')\n"
        "print('made', flush=True)\n"
        "sys.stdin.readline()\n"  # holds its ring until killed
    )
    for k in range(10):
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        wait_for(lambda p=proc: b"numpy" in Path(f"/proc/{p.pid}/maps").read_bytes(), 60, "imports")
        time.sleep(0.2)  # the rest of the imports
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        time.sleep(made_s * k / 8)
        proc.kill()
        proc.wait(10)
        remove_stale_segments(run_id)
        with Ring.create(name, fields, n_slots, run_id, "spares"):
            pass
        assert list(list_segments(run_id)) == [], k


def test_a_live_owner_keeps_its_segment_whatever_its_pid_looks_like_here(run_id: str) -> None:
    """Containers sharing one /dev/shm (--ipc=host) each see the others' pids as dead.
    The owner's flock says it runs: a live owner's segment whose header names a pid
    that runs nothing here is kept, and removed once that owner is killed."""
    name = segment_name(run_id, "spares")
    code = (
        "import sys\n"
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.shared.memory.ring import Ring\n"
        f"Ring.create('{name}', Config().sample_fields(), 2, '{run_id}', 'spares')\n"
        "print('up', flush=True)\n"
        "sys.stdin.readline()\n"  # holds its ring until killed
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "up"
        # As another pid namespace's owner reads here: a pid past any pid_max.
        rewrite_header(name, owner_pid=2**31 - 1)
        assert remove_stale_segments(run_id) == []
    finally:
        proc.kill()
        proc.wait(10)
    assert remove_stale_segments(run_id) == [name]


def test_a_segment_whose_owner_pid_now_names_a_later_process_is_stale(run_id: str) -> None:
    """Pids are reused, and a restarted container numbers its processes from 1 again:
    a segment nobody holds whose owner pid runs a process that started after the
    segment was made is stale. Here a killed owner's segment is made to name this
    process's pid: kept while it says it was made after this process started, removed
    once it says it was made before."""
    name = segment_name(run_id, "spares")
    code = (
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.shared.memory.ring import Ring\n"
        f"ring = Ring.create('{name}', Config().sample_fields(), 2, '{run_id}', 'spares')\n"
        "import os; os._exit(0)\n"  # as a SIGKILL: its segment stays, its lock goes
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    # Made by this live process, as far as /proc can tell; then a day before it started.
    rewrite_header(name, owner_pid=os.getpid(), created_s=time.time())
    assert remove_stale_segments(run_id) == []
    rewrite_header(name, created_s=time.time() - 86400)
    assert remove_stale_segments(run_id) == [name]


def rewrite_header(name: str, **values: float) -> None:
    """Set fields of segment `name`'s header in place, as a test's stand-in for an owner
    that reads differently here (another pid namespace's, a reused pid's)."""
    with open(SHM_DIR / name, "r+b") as f:
        header = np.frombuffer(bytearray(f.read(HEADER_DTYPE.itemsize)), HEADER_DTYPE)
        for field, value in values.items():
            header[0][field] = value
        f.seek(0)
        f.write(header.tobytes())


def test_a_zombie_is_not_alive() -> None:
    """An exited child its parent has not reaped yet writes nothing more: dead."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert pid_alive(os.getpid())
    wait_for(lambda: not pid_alive(proc.pid), 30, "the child's exit")
    assert os.path.exists(f"/proc/{proc.pid}")  # not reaped: /proc still lists it, a zombie
    proc.wait(5)


def test_rings_that_do_not_fit_are_refused_when_reserved(run_id: str) -> None:
    """RLIMIT_FSIZE (1 MiB) makes the reservation fail for real, root or not: a clear
    error naming the key to change, and no segment left behind."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))\n"
    proc = subprocess.run(
        [sys.executable, "-c", limit + TWO_RINGS, run_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("refused: ring.spares: cannot reserve") == 1, proc.stdout
    assert "ring.lookahead: cannot reserve" in proc.stdout
    assert "features.max_frames, or enlarge /dev/shm" in proc.stdout
    assert list(list_segments(run_id)) == []


def test_a_small_dev_shm_refuses_the_second_ring_at_creation(run_id: str) -> None:
    """A real 4 MiB tmpfs on /dev/shm, seen only by the child: the first ring is made and
    written in full, the second is refused and leaves nothing; sparse rings died of
    SIGBUS here (rc -7)."""
    proc = run_on_small_tmpfs("/dev/shm", "4m", [sys.executable, "-c", TWO_RINGS, run_id])
    assert proc.returncode == 0, f"rc {proc.returncode} (-7 is SIGBUS): {proc.stderr}"
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 1 and "refused: ring.lookahead:" in refusals[0], proc.stdout
    assert "enlarge /dev/shm" in refusals[0]
    assert "left: spares\n" in proc.stdout  # by kind: a user namespace has its own uid


# Two rings of ~2.9 MiB in a /dev/shm with fewer bytes free than both need; every page of
# each ring made is then written, which kills this process with SIGBUS if not reserved.
TWO_RINGS = """
import os, sys
import numpy as np
from ringfeed.shared.config import ConfigError
from ringfeed.shared.memory.ring import Ring, segment_name
rid, made = sys.argv[1], []
for kind in ("spares", "batches"):
    try:
        made.append(Ring.create(segment_name(rid, kind), {"x": ((950_000,), np.uint8)}, 3,
                                rid, kind))
    except ConfigError as exc:
        print("refused:", exc)
for ring in made:
    ring.view("x")[:] = 1
print("left:", *sorted(n.rsplit("-", 1)[1] for n in os.listdir("/dev/shm") if rid in n))
"""
