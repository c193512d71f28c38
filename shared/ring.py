"""A ring of fixed-shape slots in one POSIX shared-memory segment.

Layout (all offsets in bytes, one struct constant each, see HEADER_DTYPE and
SLOT_DTYPE)::

    [ header | field table | slot headers x n_slots | pad | slot 0 | slot 1 | ... ]

Each slot holds every payload field at a fixed offset (64-byte aligned), so
``ring.view("mel")`` is a zero-copy numpy array of shape [n_slots, *shape] and
``ring.view("mel")[k]`` is slot k's field.

Slot states of the sample ring. Each field of a slot header has one writer
(a record for the inspector and for crash forensics; ownership itself travels
in ZeroMQ messages, contract 1). The stager's slot manager
(consumer/stager/slot_manager.py) is the only writer of ``state``,
``generation``, ``item``, ``epoch``, ``producer`` and ``t_granted``; the
grantee writes only its own progress: ``writing_generation`` and ``t_write``
when it starts, then the payload, ``lengths``, ``t_ready`` and last
``sealed_generation``::

            grant (manager: generation += 1)
    FREE ----------------------------------> GRANTED  (WRITING, READY-sealed: shown
     ^  ^                                       |      from the producer's fields)
     |  | lease expired, producer dead          | READY accepted (owner, generation,
     |  +---------------------------------------+  seal all match)
     |        (FENCED while it may live)        v
     +------- stager copied it into a batch -- READY

:func:`shown_state` is what the inspector draws: a GRANTED slot whose
producer wrote ``writing_generation`` equal to its generation is WRITING, and
one it has also sealed is READY, before the manager has read its READY.

A slot whose lease expired while its producer might still be alive (stopped,
not dead) is FENCED: its item is granted again into another slot, and the
fenced slot returns to FREE only once that producer is known dead or says
HELLO again. Speaking is not enough: a woken producer may still hold grants
queued for its old slots, so the stager answers it with REHELLO, and a
producer empties its queue before it says HELLO. This is why a stopped
producer that wakes up never scribbles over a slot that holds another item.

Exactly once, with leases per grant (contract 2 and 3). Every grant names
(slot, generation, item); only a READY that names the slot's current
generation, from its grantee, sealed with that generation, is accepted. A
grant that sees no READY within ring.lease_s is taken back whatever its
producer's heartbeats say (a lost GRANT or READY looks exactly like that), a
GRANT that could not be sent comes back at once, and a READY that must be
dropped for a slot its producer holds (malformed, unsealed, wrong size, bad
checksum) takes that producer's grants back at once. Taking back bumps the
slot's generation, so whatever the old grantee sends later is stale and
counted, never delivered; the item goes back to the plan and is granted again.
A producer whose grants were taken back gets REHELLO and nothing more until it
says HELLO again with an empty queue; until then its local slots stay FENCED,
so it cannot write into a slot that another producer was granted. Each plan
position therefore leaves the stager once, as a sample or as a skip with a
reason (after ring.max_item_attempts charged failures).

The batch ring has its own states (:class:`BatchState`), written by the
stager's batch builder only.

Ownership of the segment (contract 6): the creator (the stager) unlinks it.
Every other process attaches by name without any resource tracker, because
this module maps /dev/shm files directly instead of using
multiprocessing.shared_memory, whose tracker on Python 3.11 unlinks segments
that an attaching process did not create. A segment whose owner pid is dead
is stale and is removed by :func:`remove_stale_segments` at start.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from enum import IntEnum
from pathlib import Path

import numpy as np
import xxhash

from shared.config import USER_PREFIX, Config, ConfigError

log = logging.getLogger(__name__)

MAGIC = b"RINGFEED"
LAYOUT_VERSION = 2
MAX_FIELDS = 8
MAX_DIMS = 4
MAX_LENGTHS = 4
ALIGN = 64
SEGMENT_PREFIX = USER_PREFIX  # ringfeed-<uid>-: each user lists and removes only its own
# Where POSIX shared memory lives on Linux.
SHM_DIR = Path("/dev/shm")

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


def rows_checksum(arrays: Iterable[np.ndarray]) -> int:
    """A 52-bit hash (xxh3) of the bytes of `arrays`, in order: what a producer puts
    in its READY for the used rows of each field, and what the stager checks again
    after copying the rows out. 52 bits: a protocol integer (shared.protocol)."""
    h = 0
    for a in arrays:  # each array's hash seeds the next: one pass, no joined copy
        h = xxhash.xxh3_64_intdigest(a if a.flags.c_contiguous else np.ascontiguousarray(a), h)
    return h >> 12


def batch_views(
    slot: Mapping[str, np.ndarray], rows: int, frames: int, text: int
) -> dict[str, np.ndarray]:
    """One batch of shape (rows, frames, text) inside a batch-ring slot whose fields are
    flat (Config.batch_ring_fields): zero-copy views, row-major from each field's start.
    The one definition of that layout, for the stager's builder and the batch client."""
    mel = slot["mel"]
    return {
        "tokens": slot["tokens"][: rows * text].reshape(rows, text),
        "text_lens": slot["text_lens"][:rows],
        "mel": mel[: rows * frames].reshape(rows, frames, mel.shape[-1]),
        "mel_lens": slot["mel_lens"][:rows],
        "items": slot["items"][:rows],
    }


class SlotState(IntEnum):
    """A sample slot's state; WRITING is shown, never stored (see shown_state)."""

    FREE = 0
    GRANTED = 1
    WRITING = 2
    READY = 3
    FENCED = 4


class BatchState(IntEnum):
    """A batch slot: FREE, FILLING (rows being copied in), or SENT (announced to the
    consumer, waiting for its BATCH_FREE)."""

    FREE = 0
    FILLING = 1
    SENT = 2


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
    """The /dev/shm name of a run's ring; kind is 'samples' or 'batches'."""
    return f"{SEGMENT_PREFIX}{run_id}-{kind}"


def layout(fields: FieldSpec, n_slots: int) -> tuple[dict[str, int], int, int, int]:
    """Field offsets within a slot, slot stride, payload offset and total bytes."""
    offsets, pos = {}, 0
    for name, (shape, dtype) in fields.items():
        offsets[name] = pos
        pos = _align(pos + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    stride = max(pos, ALIGN)
    slot_headers = _align(HEADER_DTYPE.itemsize)
    payload = _align(slot_headers + n_slots * SLOT_DTYPE.itemsize)
    payload = (payload + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    return offsets, stride, payload, payload + n_slots * stride


def free_shm_bytes() -> int:
    """Free bytes in /dev/shm."""
    return shutil.disk_usage(SHM_DIR).free


def segment_bytes(fields: FieldSpec, n_slots: int) -> int:
    """The whole segment's size: headers, slot headers and payload."""
    return layout(fields, n_slots)[3]


def slot_bytes(fields: FieldSpec) -> int:
    """Payload bytes of one slot (its stride: fields 64-byte aligned)."""
    return layout(fields, 1)[1]


def rings_bytes(cfg: Config) -> int:
    """Both rings of a run, as the stager will create them."""
    return segment_bytes(cfg.sample_fields(), cfg.ring.slots) + segment_bytes(
        cfg.batch_ring_fields(), cfg.stager.batch_slots
    )


def check_shm_fits(cfg: Config) -> None:
    """Raise ConfigError before anything starts if the rings cannot fit in /dev/shm."""
    need, free = rings_bytes(cfg), free_shm_bytes()
    if need > free:
        raise ConfigError(
            f"ring.slots: the rings need {need / 2**20:.1f} MiB but /dev/shm has "
            f"{free / 2**20:.1f} MiB free; lower ring.slots (each slot is "
            f"{slot_bytes(cfg.sample_fields()) / 2**20:.2f} MiB) or features.max_frames, or "
            "enlarge /dev/shm (docker: --shm-size)"
        )


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
        hdr = buf[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)
        self.header = hdr[0]
        if bytes(self.header["magic"]) != MAGIC:
            self.close()
            raise RingError(f"/dev/shm/{name} is not a ringfeed ring (bad magic)")
        if int(self.header["layout_version"]) != LAYOUT_VERSION:
            version = int(self.header["layout_version"])
            self.close()
            raise RingError(
                f"/dev/shm/{name} has layout version {version}, this code reads "
                f"{LAYOUT_VERSION}: run producers and stager from the same ringfeed version"
            )
        self.n_slots = int(self.header["n_slots"])
        off = int(self.header["slot_headers_offset"])
        self.slots = buf[off : off + self.n_slots * SLOT_DTYPE.itemsize].view(SLOT_DTYPE)
        self.fields: FieldSpec = {}
        payload, stride = int(self.header["payload_offset"]), int(self.header["slot_stride"])
        for rec in self.header["fields"][: int(self.header["n_fields"])]:
            fname = rec["name"].decode()
            shape = tuple(int(d) for d in rec["shape"][: int(rec["ndim"])])
            dtype = np.dtype(rec["dtype"].decode())
            self.fields[fname] = (shape, dtype)
            start = payload + int(rec["offset"])
            self._views[fname] = np.ndarray(
                (self.n_slots, *shape),
                dtype=dtype,
                buffer=mm,
                offset=start,
                strides=(stride, *np.empty(shape, dtype).strides),
            )
            if not writable:
                self._views[fname].flags.writeable = False
        if not writable:
            self.slots.flags.writeable = False

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
    ) -> Ring:
        """Create and own a new segment (the stager calls this). Fails if it exists."""
        if len(fields) > MAX_FIELDS:
            raise RingError(f"at most {MAX_FIELDS} fields per slot, got {len(fields)}")
        offsets, stride, payload, total = layout(fields, n_slots)
        free = free_shm_bytes()
        if total > free:
            raise ConfigError(
                f"ring.slots: ring {name} needs {total / 2**20:.1f} MiB but /dev/shm has "
                f"{free / 2**20:.1f} MiB free; lower ring.slots or features.max_frames, or "
                "enlarge /dev/shm (docker: --shm-size)"
            )
        path = SHM_DIR / name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        hdr = np.frombuffer(mm, dtype=np.uint8)[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)
        h = hdr[0]
        h["layout_version"] = LAYOUT_VERSION
        h["n_slots"] = n_slots
        h["n_fields"] = len(fields)
        h["owner_pid"] = os.getpid()
        h["run_id"] = run_id.encode()
        h["kind"] = kind.encode()
        h["created_s"] = time.time()
        h["stats_endpoint"] = stats_endpoint.encode()
        h["slot_headers_offset"] = _align(HEADER_DTYPE.itemsize)
        h["payload_offset"] = payload
        h["slot_stride"] = stride
        for i, (fname, (shape, dtype)) in enumerate(fields.items()):
            if len(shape) > MAX_DIMS:
                raise RingError(f"field {fname}: at most {MAX_DIMS} dimensions")
            rec = h["fields"][i]
            rec["name"] = fname.encode()
            rec["dtype"] = np.dtype(dtype).str.encode()
            rec["ndim"] = len(shape)
            rec["shape"][: len(shape)] = shape
            rec["offset"] = offsets[fname]
            rec["nbytes"] = int(np.prod(shape)) * np.dtype(dtype).itemsize
        del hdr, h
        mm[:8] = MAGIC  # written last: a reader never sees a half-made header as valid
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
                "(`ringfeed inspect --list` shows live rings)"
            ) from None
        size = os.fstat(fd).st_size
        if size < HEADER_DTYPE.itemsize:
            os.close(fd)
            raise RingError(f"/dev/shm/{name} is too small to be a ring ({size} bytes)")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
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

    def checksum(self, slot: int, lengths: dict[str, int]) -> int:
        """rows_checksum of the used part of each field (first `lengths[name]` rows)."""
        return rows_checksum(self._views[name][slot][: lengths[name]] for name in self.fields)

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Unmap; idempotent. Outside views must be gone first or the map stays (GC frees it)."""
        if self._mm is None:
            return
        self._views.clear()
        self.slots = None  # type: ignore[assignment]
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
