"""The shared-memory ring: layout, zero-copy views, ownership, stale segments."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest

from ringfeed.shared.config import Config, replace
from ringfeed.shared.memory.ring import (
    SHM_DIR,
    SLOT_DTYPE,
    Ring,
    RingError,
    SlotState,
    segment_name,
)
from ringfeed.shared.memory.segments import list_segments, pid_alive, remove_stale_segments
from ringfeed.shared.memory.shm import write_zeros
from tests.support.polling import wait_for
from tests.support.processes import run_on_small_tmpfs


@pytest.fixture
def run_id() -> str:
    rid = f"test-{uuid.uuid4().hex[:8]}"
    yield rid
    for path in list_segments(rid):
        path.unlink()
        pytest.fail(f"test left {path} behind")


def test_round_trip_of_every_field_shape_and_dtype(run_id: str) -> None:
    cfg = replace(Config(), features={"device": "stager"})
    fields = {**cfg.sample_fields(), **Config().sample_fields()}
    with Ring.create(segment_name(run_id, "samples"), fields, 5, run_id, "samples") as ring:
        reader = Ring.attach(ring.name)
        assert reader.fields == fields and reader.run_id == run_id
        assert reader.owner_pid == os.getpid() and reader.n_slots == 5
        rng = np.random.default_rng(0)
        for name, (shape, dtype) in fields.items():
            view = ring.view(name)
            assert view.shape == (5, *shape) and view.dtype == dtype
            for k in range(5):
                data = rng.integers(-1000, 1000, shape).astype(dtype)
                view[k] = data
                np.testing.assert_array_equal(reader.view(name)[k], data)
        ring.slots[2]["state"], ring.slots[2]["generation"] = SlotState.READY, 9
        assert reader.slots[2]["state"] == SlotState.READY and reader.slots[2]["generation"] == 9
        assert reader.slots.dtype == SLOT_DTYPE
        reader.close()


def test_fields_of_different_slots_do_not_overlap(run_id: str) -> None:
    fields = Config().sample_fields()
    with Ring.create(segment_name(run_id, "samples"), fields, 4, run_id, "samples") as ring:
        for k in range(4):
            ring.view("mel")[k] = k
            ring.view("tokens")[k] = 100 + k
        for k in range(4):
            assert (ring.view("mel")[k] == k).all() and (ring.view("tokens")[k] == 100 + k).all()


def test_read_only_attach_cannot_write(run_id: str) -> None:
    fields = Config().sample_fields()
    with Ring.create(segment_name(run_id, "samples"), fields, 2, run_id, "samples") as ring:
        reader = Ring.attach(ring.name, writable=False)
        with pytest.raises(ValueError, match="read-only"):
            reader.view("mel")[0, 0, 0] = 1.0
        with pytest.raises(ValueError, match="read-only"):
            reader.slots[0]["state"] = 1
        reader.close()


def test_attach_errors_say_what_to_do(run_id: str) -> None:
    with pytest.raises(RingError, match="is the stager of this run running"):
        Ring.attach(segment_name(run_id, "samples"))
    path = SHM_DIR / segment_name(run_id, "junk")
    path.write_bytes(b"\x00" * 4096)
    try:
        with pytest.raises(RingError, match="bad magic"):
            Ring.attach(path.name)
    finally:
        path.unlink()


def test_a_segment_shorter_than_its_header_says_is_refused(run_id: str) -> None:
    """A reader goes by the header; a cut-short copy of a real ring is not mapped."""
    fields = {"mel": ((8, 4), np.dtype(np.float32))}
    with Ring.create(segment_name(run_id, "samples"), fields, 4, run_id, "samples") as ring:
        whole = (SHM_DIR / ring.name).read_bytes()
    path = SHM_DIR / segment_name(run_id, "cut")
    path.write_bytes(whole[: len(whole) - 1])
    try:
        with pytest.raises(RingError, match="shorter than its header says"):
            Ring.attach(path.name)
    finally:
        path.unlink()


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


def test_only_the_owner_unlinks(run_id: str) -> None:
    fields = Config().sample_fields()
    owner = Ring.create(segment_name(run_id, "samples"), fields, 2, run_id, "samples")
    other = Ring.attach(owner.name)
    other.close()
    other.unlink()
    assert (SHM_DIR / owner.name).exists()
    owner.close()
    owner.unlink()
    owner.unlink()  # idempotent
    assert not (SHM_DIR / owner.name).exists()


def test_stale_segment_of_a_killed_owner_is_removed(run_id: str) -> None:
    code = (
        "import sys, time\n"
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.shared.memory.ring import Ring, segment_name\n"
        f"Ring.create(segment_name('{run_id}', 'samples'), Config().sample_fields(), 2, "
        f"'{run_id}', 'samples')\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"  # the owner lives on, holding its segment, until SIGKILLed below
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    assert remove_stale_segments(run_id) == []  # owner alive: kept
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert remove_stale_segments(run_id) == [segment_name(run_id, "samples")]
    assert list(list_segments(run_id)) == []


def test_a_zombie_is_not_alive() -> None:
    """An exited child its parent has not reaped yet writes nothing more: dead."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert pid_alive(os.getpid())
    wait_for(lambda: not pid_alive(proc.pid), 30, "the child's exit")
    assert os.path.exists(f"/proc/{proc.pid}")  # not reaped: /proc still lists it, a zombie
    proc.wait(5)


def test_a_new_ring_owns_every_page_of_its_segment(run_id: str) -> None:
    """tmpfs takes a page only when written unless it is reserved: a sparse ring passed
    the free-space check and a later write died of SIGBUS (issue 18, case 6)."""
    fields = {"mel": ((256, 80), np.dtype(np.float32))}
    with Ring.create(segment_name(run_id, "samples"), fields, 8, run_id, "samples") as ring:
        st = os.stat(SHM_DIR / ring.name)
        assert st.st_size > 8 * 256 * 80 * 4
        assert st.st_blocks * 512 >= st.st_size, "the segment is sparse: pages not reserved"


def test_write_zeros_takes_every_page(run_id: str) -> None:
    """The fallback where posix_fallocate is unsupported reserves as well."""
    path = SHM_DIR / segment_name(run_id, "zeros")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        write_zeros(fd, 3 * 2**20 + 5)
        st = os.fstat(fd)
        assert st.st_size == 3 * 2**20 + 5 and st.st_blocks * 512 >= st.st_size
    finally:
        os.close(fd)
        path.unlink()


# Two rings of ~2.9 MiB in a /dev/shm with fewer bytes free than both need; every page of
# each ring made is then written, which kills this process with SIGBUS if not reserved.
TWO_RINGS = """
import os, sys
import numpy as np
from ringfeed.shared.config import ConfigError
from ringfeed.shared.memory.ring import Ring, segment_name
rid, made = sys.argv[1], []
for kind in ("samples", "batches"):
    try:
        made.append(Ring.create(segment_name(rid, kind), {"x": ((950_000,), np.uint8)}, 3,
                                rid, kind))
    except ConfigError as exc:
        print("refused:", exc)
for ring in made:
    ring.view("x")[:] = 1
print("left:", *sorted(n.rsplit("-", 1)[1] for n in os.listdir("/dev/shm") if rid in n))
"""


def test_rings_that_do_not_fit_are_refused_when_reserved(run_id: str) -> None:
    """RLIMIT_FSIZE (1 MiB) makes the reservation fail for real, root or not: a clear
    error naming the key to change, and no segment left behind."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))\n"
    proc = subprocess.run([sys.executable, "-c", limit + TWO_RINGS, run_id],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("refused: ring.slots: cannot reserve") == 1, proc.stdout
    assert "stager.batch_slots: cannot reserve" in proc.stdout
    assert "features.max_frames, or enlarge /dev/shm" in proc.stdout
    assert list(list_segments(run_id)) == []


def test_a_small_dev_shm_refuses_the_second_ring_at_creation(run_id: str) -> None:
    """A real 4 MiB tmpfs on /dev/shm, seen only by the child: the first ring is made and
    written in full, the second is refused and leaves nothing; sparse rings died of
    SIGBUS here (rc -7)."""
    proc = run_on_small_tmpfs("/dev/shm", "4m", [sys.executable, "-c", TWO_RINGS, run_id])
    assert proc.returncode == 0, f"rc {proc.returncode} (-7 is SIGBUS): {proc.stderr}"
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 1 and "refused: stager.batch_slots:" in refusals[0], proc.stdout
    assert "enlarge /dev/shm" in refusals[0]
    assert "left: samples\n" in proc.stdout  # by kind: a user namespace has its own uid
