"""The shared-memory ring in this process: layout, zero-copy views, ownership, pages
taken at creation (across processes: tests/process/test_ring.py)."""

from __future__ import annotations

import errno
import os
from unittest.mock import patch

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
from ringfeed.shared.memory.segments import list_segments
from ringfeed.shared.memory.shm import write_zeros


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


def mapped_kib(path: str) -> list[tuple[int, int]]:
    """(Size, Rss) in KiB of each of this process's maps of `path` (/proc/self/smaps)."""
    maps, current = [], None
    for line in open("/proc/self/smaps").read().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:  # a map's first line: range, perms, ..., path
            current = head[-1] == path and len(head) == 6
            if current:
                maps.append([0, 0])
        elif current and head[0] in ("Size:", "Rss:"):
            maps[-1][0 if head[0] == "Size:" else 1] = int(head[1])
    return [(size, rss) for size, rss in maps]


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MAP_POPULATE"), reason="Linux only")
def test_the_maps_that_write_or_read_rows_have_every_page_mapped_at_once(run_id: str) -> None:
    """The creator and every writable attach map the whole ring when they map it (no
    fault a page at its first touch); a read-only map (the inspector's) does not."""
    fields = {"mel": ((256, 80), np.dtype(np.float32))}
    with Ring.create(segment_name(run_id, "batches"), fields, 40, run_id, "batches") as ring:
        path = str(SHM_DIR / ring.name)
        (owner,) = mapped_kib(path)
        assert owner[1] == owner[0] > 3000, owner
        reader = Ring.attach(ring.name)
        looker = Ring.attach(ring.name, writable=False)
        maps = sorted(mapped_kib(path), key=lambda m: m[1])
        assert len(maps) == 3 and maps[1][1] == maps[2][1] == owner[0], maps
        assert maps[0][1] < owner[0] // 4, "a read-only map should map pages as touched"
        reader.close()
        looker.close()


def test_a_host_without_nameless_files_or_proc_is_told_what_the_ring_needs(run_id: str) -> None:
    """A ring is made as a nameless file (O_TMPFILE) and named through /proc/self/fd.
    Where either is missing the error says what is needed and leaves nothing behind; any
    other failure of the open (too many files open) is reported as itself."""
    real_open, fields = os.open, Config().sample_fields()

    def opens(errno_: int):
        def fake(path, flags, *args, **kwargs):
            if flags & os.O_TMPFILE == os.O_TMPFILE:
                raise OSError(errno_, os.strerror(errno_))
            return real_open(path, flags, *args, **kwargs)

        return fake

    def create() -> Ring:
        return Ring.create(segment_name(run_id, "samples"), fields, 2, run_id, "samples")

    with patch.object(os, "open", opens(errno.EOPNOTSUPP)):
        with pytest.raises(RingError, match="takes no nameless files .*Linux 3.11"):
            create()
    with patch.object(os, "open", opens(errno.EMFILE)):
        with pytest.raises(OSError, match="Too many open files") as raised:
            create()
        assert not isinstance(raised.value, RingError)
    with patch.object(os, "link", side_effect=FileNotFoundError(errno.ENOENT, "no /proc")):
        with pytest.raises(RingError, match="is /proc mounted"):
            create()
    assert list(list_segments(run_id)) == []
    with create() as ring:  # and the same name is free to make
        assert ring.n_slots == 2
