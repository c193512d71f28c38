"""A ring of fixed-shape slots in one POSIX shared-memory segment.

Layout (all offsets in bytes, one struct constant each, see HEADER_DTYPE and
SLOT_DTYPE)::

    [ header | field table | slot headers x n_slots | row headers x n_slots x rows
      | pad | slot 0 | slot 1 | ... ]

Each slot holds every payload field at a fixed offset (64-byte aligned), so
``ring.view("mel")`` is a zero-copy numpy array of shape [n_slots, *shape] and
``ring.view("mel")[k]`` is slot k's field. A ring whose slots hold several rows (the
batch ring: a batch of up to ``rows_per_slot`` samples per slot) has a record of the
same SLOT_DTYPE per row, ``ring.rows`` [n_slots * rows_per_slot]: row r of slot k is
``ring.rows[k * rows_per_slot + r]``, the place a producer writes one sample into
(docs/design.md#rows-written-once).

Place states. A place is where one sample is written: a row of a batch slot, or a
slot of the spare ring (shared/memory/places.py). Each field of its record has one
writer (a record for the inspector and for crash forensics; ownership itself travels
in ZeroMQ messages, docs/design.md#contract-1). The stager's slot ledger
(consumer/stager/ledger.py) is the only writer of ``state``, ``generation``, ``item``,
``epoch``, ``producer`` and ``t_granted``; the grantee writes only its own progress:
``writing_generation`` and ``t_write`` when it starts, then the payload, ``lengths``,
``t_ready`` and last ``sealed_generation``::

            grant (ledger: its run's generation)
    FREE ----------------------------------> GRANTED  (WRITING, READY-sealed: shown
     ^  ^                                       |      from the producer's fields)
     |  | lease expired, producer dead          | READY accepted (owner, generation,
     |  +---------------------------------------+  seal all match)
     |        (FENCED while it may write)       v
     +------ its batch was sent, or copied ---- READY

:func:`shown_state` is what the inspector draws: a GRANTED place whose
producer wrote ``writing_generation`` equal to its generation is WRITING, and
one it has also sealed is READY, before the ledger has read its READY.

FENCED: a place taken back from a producer that may still write it; why and
for how long: consumer/stager/ledger.py. Exactly once, with leases per
grant: docs/design.md#contract-2 and docs/design.md#contract-3.

The batch slots have their own states (shared/memory/batch_ring.py), written by the
stager's ledger only.

Ownership of the segment (docs/design.md#contract-6): the creator (the stager) unlinks it.
Every other process attaches by name without any resource tracker, because
this module maps /dev/shm files directly instead of using
multiprocessing.shared_memory, whose tracker on Python 3.11 unlinks segments
that an attaching process did not create. The creator holds the segment's flock
for its life; a segment nobody holds whose owner pid is dead is stale and is
removed by :func:`remove_stale_segments` at start. The creator
reserves every byte of the segment before anyone maps it (shared/memory/shm.py): a
/dev/shm too small is an error at creation, never a SIGBUS at a later write.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import time
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import USER_PREFIX
from ringfeed.shared.memory.shm import SHM_DIR, check_shm_fits, reserve
from ringfeed.shared.sample.schema import MAX_SAMPLE_FIELDS

log = logging.getLogger(__name__)

# The processes that write or read rows (the stager, producers, a consumer) map every
# page of a ring when they map it (MAP_POPULATE, Linux): the first touch of each 4 KiB
# page in each process was otherwise a fault of its own: a producer's first write of half
# a 256 KB row took 224-229 us on this host, the map included, against 47 us populated
# (benchmarks/row_pass.py), and a short run is mostly first laps
# (docs/benchmarks.md#against-tfdata). A read-only map (the
# inspector) reads headers and records only, so it maps pages as it touches them.
ROWS_MAP = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)

MAGIC = b"RINGFEED"
# 3: up to 24 fields a slot and 16 lengths (the declared sample schema, issue 20).
# 4: a record per row of a slot (the batch ring's rows are written in place, issue 41).
LAYOUT_VERSION = 4
# A batch holds each sample field, its lens, items and the ids: 7 by default; a sample
# holds at most MAX_LENGTHS fields (shared/config/fields.py says so at load).
MAX_FIELDS, MAX_DIMS, MAX_LENGTHS, ALIGN = 24, 4, MAX_SAMPLE_FIELDS, 64
SEGMENT_PREFIX = USER_PREFIX  # ringfeed-<uid>-: each user lists and removes only its own

FIELD_DTYPE = np.dtype(
    [
        ("name", "S16"),
        ("dtype", "S8"),
        ("ndim", "<u4"),
        ("shape", "<u4", (MAX_DIMS,)),
        ("offset", "<u8"),
        ("nbytes", "<u8"),
    ]
)

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("layout_version", "<u4"),
        ("n_slots", "<u4"),
        ("n_fields", "<u4"),
        ("owner_pid", "<u4"),
        ("run_id", "S32"),
        ("kind", "S16"),
        ("created_s", "<f8"),
        ("stats_endpoint", "S128"),
        ("slot_headers_offset", "<u8"),
        ("rows_per_slot", "<u4"),
        ("row_headers_offset", "<u8"),
        ("payload_offset", "<u8"),
        ("slot_stride", "<u8"),
        ("fields", FIELD_DTYPE, (MAX_FIELDS,)),
    ]
)

SLOT_DTYPE = np.dtype(
    [
        ("state", "<u4"),
        ("generation", "<u4"),
        ("item", "<i8"),
        ("epoch", "<u4"),
        ("producer", "<i4"),
        ("lengths", "<i4", (MAX_LENGTHS,)),
        ("t_granted", "<f8"),
        ("t_write", "<f8"),
        ("t_ready", "<f8"),
        # Written by the producer before the payload: the generation it writes under.
        ("writing_generation", "<u4"),
        # Written by the producer after the payload: the generation it wrote under.
        ("sealed_generation", "<u4"),
        ("checksum", "<u4"),
    ]
)


class SlotState(IntEnum):
    """A sample slot's state; WRITING is shown, never stored (see shown_state)."""

    FREE = 0
    GRANTED = 1
    WRITING = 2
    READY = 3
    FENCED = 4


def shown_state(rec: np.void) -> SlotState:
    """The state of one SLOT_DTYPE record as the inspector shows it: the manager's
    state, refined by the producer's progress fields for a GRANTED slot."""
    state = SlotState(int(rec["state"]))
    if state is SlotState.GRANTED:
        if int(rec["sealed_generation"]) == int(rec["generation"]):
            return SlotState.READY
        if int(rec["writing_generation"]) == int(rec["generation"]):
            return SlotState.WRITING
    return state


class RingError(RuntimeError):
    """The segment is missing, foreign, of another layout, or does not fit."""


FieldSpec = dict[str, tuple[tuple[int, ...], np.dtype]]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def segment_name(run_id: str, kind: str) -> str:
    """The /dev/shm name of a run's ring; kind is 'spares' or 'batches'."""
    return f"{SEGMENT_PREFIX}{run_id}-{kind}"


class Layout(NamedTuple):
    """In bytes: each field's offset in a slot, the slot stride, the row records' offset,
    the first slot's offset (page-aligned), the segment's size. Written into the header,
    which readers go by."""

    offsets: dict[str, int]
    stride: int
    row_headers: int
    payload: int
    total: int


def layout(fields: FieldSpec, n_slots: int, rows: int = 0) -> Layout:
    """Where a segment of `n_slots` slots of `fields`, with a record for each of `rows`
    rows per slot (0: none), keeps everything (Layout)."""
    offsets, pos = {}, 0
    for name, (shape, dtype) in fields.items():
        offsets[name] = pos
        pos = _align(pos + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    stride = max(pos, ALIGN)
    slot_headers = _align(HEADER_DTYPE.itemsize)
    row_headers = _align(slot_headers + n_slots * SLOT_DTYPE.itemsize)
    payload = _align(row_headers + n_slots * rows * SLOT_DTYPE.itemsize)
    payload = (payload + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    return Layout(offsets, stride, row_headers, payload, payload + n_slots * stride)


def parse_header(buf: bytes | mmap.mmap) -> np.void | None:
    """The HEADER_DTYPE record at the start of `buf` (a view of it, for a mapping), or
    None if `buf` does not start like a ring (too short, or no MAGIC). The one reader of
    a ring header, for Ring and for shared/memory/segments.py's read_header(path)."""
    if len(buf) < HEADER_DTYPE.itemsize or bytes(buf[: len(MAGIC)]) != MAGIC:
        return None
    return np.frombuffer(buf, dtype=HEADER_DTYPE, count=1)[0]


def slot_bytes(fields: FieldSpec) -> int:
    """Payload bytes of one slot (its stride: fields 64-byte aligned)."""
    return layout(fields, 1).stride


def rings_bytes(cfg: Config) -> int:
    """Both rings of a run, as the stager will create them: the spare ring's places and
    the batch ring's slots with a record per row."""
    spares = layout(cfg.sample_fields(), cfg.spare_slots).total
    rows = cfg.max_batch_rows
    return spares + layout(cfg.batch_ring_fields(), cfg.batch_ring_slots, rows).total


def check_rings_fit(cfg: Config) -> None:
    """Before anything starts: can both rings of this config fit in /dev/shm?"""
    what = "the rings (ring.spares, and ring.lookahead with stager.batch_size)"
    check_shm_fits(rings_bytes(cfg), what, "ring.lookahead", slot_bytes(cfg.batch_ring_fields()))


class Ring:
    """A mapped ring segment. Use :meth:`create` (owner) or :meth:`attach` (others).

    Attributes: ``header`` (a HEADER_DTYPE record view), ``slots`` (SLOT_DTYPE
    array [n_slots]), ``fields`` (name -> (shape, dtype)) and :meth:`view`.
    """

    def __init__(self, name: str, fd: int, mm: mmap.mmap, owner: bool, writable: bool) -> None:
        self.name = name
        self.owner = owner
        self.writable = writable
        self._fd = fd
        self._mm = mm
        self._unlinked = False
        self._views: dict[str, np.ndarray] = {}
        buf = np.frombuffer(mm, dtype=np.uint8)
        self._buf = buf
        header = parse_header(mm)
        if header is None:
            self.close()
            raise RingError(f"/dev/shm/{name} is not a ringfeed ring (too small, or bad magic)")
        self.header = header
        version = int(self.header["layout_version"])
        if version != LAYOUT_VERSION:
            self.close()
            raise RingError(
                f"/dev/shm/{name} has layout version {version}, this code reads "
                f"{LAYOUT_VERSION}: run producers and stager from the same ringfeed version"
            )
        self.n_slots = int(self.header["n_slots"])
        off = int(self.header["slot_headers_offset"])
        self.slots = buf[off : off + self.n_slots * SLOT_DTYPE.itemsize].view(SLOT_DTYPE)
        self.rows_per_slot = int(self.header["rows_per_slot"])
        off, n_rows = int(self.header["row_headers_offset"]), self.n_slots * self.rows_per_slot
        self.rows = buf[off : off + n_rows * SLOT_DTYPE.itemsize].view(SLOT_DTYPE)
        self.fields: FieldSpec = {}
        payload, stride = int(self.header["payload_offset"]), int(self.header["slot_stride"])
        if payload + self.n_slots * stride > len(mm):  # the header is all we go by
            self.close()
            raise RingError(f"/dev/shm/{name} is shorter than its header says: not a whole ring")
        for rec in self.header["fields"][: int(self.header["n_fields"])]:
            shape = tuple(int(d) for d in rec["shape"][: int(rec["ndim"])])
            fname, dtype = rec["name"].decode(), np.dtype(rec["dtype"].decode())
            self.fields[fname] = (shape, dtype)
            # buffer=buf, never mm: numpy keeps no export of a buffer it is handed, only a
            # reference, so mm.close() would unmap under a live view (a segfault when it
            # is read); buf (np.frombuffer) holds mm's export for as long as any view lives.
            self._views[fname] = np.ndarray(
                (self.n_slots, *shape),
                dtype,
                buf,
                payload + int(rec["offset"]),
                (stride, *np.empty(shape, dtype).strides),
            )
            self._views[fname].flags.writeable = writable
        self.slots.flags.writeable = self.rows.flags.writeable = writable

    # ------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        name: str,
        fields: FieldSpec,
        n_slots: int,
        run_id: str,
        kind: str,
        stats_endpoint: str = "",
        rows: int = 0,
    ) -> Ring:
        """Create and own a new segment (the stager calls this). Fails if it exists.
        rows: records per slot for its rows (the batch ring's), 0 for none."""
        if len(fields) > MAX_FIELDS:
            raise RingError(f"at most {MAX_FIELDS} fields per slot, got {len(fields)}")
        if any(len(shape) > MAX_DIMS for shape, _ in fields.values()):
            raise RingError(f"at most {MAX_DIMS} dimensions per field: {fields}")
        where = layout(fields, n_slots, rows)
        key = "ring.lookahead" if kind == "batches" else "ring.spares"
        what = f"ring {name} and its headers"
        check_shm_fits(where.total, what, key, where.stride)
        path = SHM_DIR / name
        if path.exists():  # fail before reserving a second ring's worth of /dev/shm
            raise FileExistsError(errno.EEXIST, "a segment of that name exists", str(path))
        # Made as a nameless file and linked into place whole: under its name a segment
        # always has its header, and a creator killed while it reserves (1 GiB takes
        # tenths of a second) leaves nothing at all, not a headerless segment that a
        # restarted stager must wait out. Its lock is taken first and held for the
        # ring's life: whoever finds it held knows the owner runs, in any pid namespace.
        header = np.zeros(1, HEADER_DTYPE)
        _write_header(header[0], fields, where, n_slots, rows, run_id, kind, stats_endpoint)
        header[0]["magic"] = MAGIC
        fd, linked = _nameless(what), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            reserve(fd, where.total, what, key, where.stride)  # no SIGBUS later (shm.py)
            os.pwrite(fd, header.tobytes(), 0)
            _link(fd, name)  # FileExistsError if another made it meanwhile: O_EXCL's
            linked = True
            mm = _map_by_name(path, where.total)
        except BaseException:
            os.close(fd)
            if linked:
                path.unlink(missing_ok=True)
            raise
        return cls(name, fd, mm, owner=True, writable=True)

    @classmethod
    def attach(cls, name: str, writable: bool = True) -> Ring:
        """Map an existing segment without owning it (producers, trainer, inspector)."""
        path = SHM_DIR / name
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise RingError(
                f"no ring /dev/shm/{name}: is the stager of this run running? "
                "(`ringfeed inspect` finds the newest live run)"
            ) from None
        size = os.fstat(fd).st_size
        if size < HEADER_DTYPE.itemsize:  # mmap cannot map an empty file
            os.close(fd)
            raise RingError(f"/dev/shm/{name} is too small to be a ring ({size} bytes)")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = mmap.mmap(fd, size, ROWS_MAP if writable else mmap.MAP_SHARED, prot)
        return cls(name, fd, mm, owner=False, writable=writable)

    # ------------------------------------------------------------ access
    def view(self, field: str) -> np.ndarray:
        """Zero-copy array [n_slots, *shape] of one payload field."""
        return self._views[field]

    @property
    def run_id(self) -> str:
        return self.header["run_id"].decode()

    @property
    def owner_pid(self) -> int:
        return int(self.header["owner_pid"])

    @property
    def stats_endpoint(self) -> str:
        return self.header["stats_endpoint"].decode()

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Unmap; idempotent. A view still held outside (a batch kept after free or close)
        keeps the mapping, and stays readable, until it is collected: every view holds
        the map's buffer export, so close never unmaps under one."""
        if self._mm is None:
            return
        self._views.clear()
        self.slots = self.rows = None  # type: ignore[assignment]
        self.header = None
        self._buf = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            # A caller still holds a view; the mapping is released when it is collected.
            log.debug("ring %s: views still alive at close", self.name)
        self._mm = None  # type: ignore[assignment]
        os.close(self._fd)

    def unlink(self) -> None:
        """Remove the segment name (owner only); idempotent."""
        if not self.owner or self._unlinked:
            return
        self._unlinked = True
        (SHM_DIR / self.name).unlink(missing_ok=True)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.unlink()


# How open(2) with O_TMPFILE says the kernel or filesystem has none (an older kernel
# reads the flag as O_DIRECTORY: EISDIR); any other error (EMFILE, EACCES) is its own.
NO_TMPFILE = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL}


def _nameless(what: str) -> int:
    """A new file in /dev/shm with no name yet (O_TMPFILE): its memory is freed with its
    last descriptor, so a creator killed before _link leaves nothing behind."""
    try:
        return os.open(SHM_DIR, getattr(os, "O_TMPFILE", 0) | os.O_RDWR, 0o600)
    except OSError as exc:
        if exc.errno not in NO_TMPFILE:
            raise
        raise RingError(
            f"cannot make {what}: {SHM_DIR} takes no nameless files (O_TMPFILE: {exc}); "
            "ringfeed needs Linux 3.11 or later with a tmpfs on /dev/shm"
        ) from None


def _map_by_name(path: Path, size: int) -> mmap.mmap:
    """The segment mapped through its name, which /proc/PID/maps and lsof then show (a
    map of the nameless descriptor shows "/dev/shm/#inode (deleted)")."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size, ROWS_MAP, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the map holds the file


def _link(fd: int, name: str) -> None:
    """Give the nameless file `fd` its name in /dev/shm (linkat through /proc/self/fd,
    as open(2) describes for O_TMPFILE); FileExistsError if the name is taken."""
    directory = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=directory, follow_symlinks=True)
    except FileNotFoundError:
        raise RingError(
            f"cannot name /dev/shm/{name}: no /proc/self/fd (is /proc mounted?)"
        ) from None
    finally:
        os.close(directory)


def _write_header(
    h: np.void,
    fields: FieldSpec,
    where: Layout,
    n_slots: int,
    rows: int,
    run_id: str,
    kind: str,
    stats_endpoint: str,
) -> None:
    """Fill a new segment's header (all but MAGIC, which :meth:`Ring.create` adds)."""
    h["layout_version"], h["n_slots"], h["n_fields"] = LAYOUT_VERSION, n_slots, len(fields)
    h["rows_per_slot"], h["row_headers_offset"] = rows, where.row_headers
    h["owner_pid"], h["created_s"] = os.getpid(), time.time()
    h["run_id"], h["kind"] = run_id.encode(), kind.encode()
    h["stats_endpoint"] = stats_endpoint.encode()
    h["slot_headers_offset"] = _align(HEADER_DTYPE.itemsize)
    h["payload_offset"], h["slot_stride"] = where.payload, where.stride
    for rec, (fname, (shape, dtype)) in zip(h["fields"], fields.items(), strict=False):
        rec["name"], rec["dtype"] = fname.encode(), np.dtype(dtype).str.encode()
        rec["ndim"], rec["shape"][: len(shape)] = len(shape), shape
        rec["offset"] = where.offsets[fname]
        rec["nbytes"] = int(np.prod(shape)) * np.dtype(dtype).itemsize
