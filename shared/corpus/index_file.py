"""The corpus index's file: one JSON header and named numpy arrays, memory-mapped.

Layout (little-endian)::

    MAGIC (8 bytes) | header length (uint64) | header (UTF-8 JSON) | arrays, each
    starting on a 64-byte boundary, at the offsets the header's "arrays" names

Written to a temporary file and renamed over the old one (os.replace), so a
reader sees the old file or the new one, never half of one; a process that
mapped the old file keeps its pages until it closes it. Read with one mmap: the
arrays are read-only views, their pages shared through the page cache by every
process that maps the same file (nothing is copied into a process's heap).

One item's value is read with pread (:meth:`IndexFile.item`), not through the
map: a page fault on a mapped file maps its cached neighbours too (fault-around,
64 KiB) and reads ahead, so 250 scattered items put ~190 MB of the index into a
process's RSS (measured at 10**7 items), shared but counted; pread puts nothing
there, for ~1 us a value.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import weakref
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"RFINDEX1"
_PREFIX = struct.Struct("<8sQ")
ALIGN = 64


class IndexFileError(ValueError):
    """The file is not an index this code can read (another version, truncated)."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def write_index(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write header and arrays to path atomically; header gains "arrays" (name ->
    [offset, dtype, shape])."""
    layout: dict[str, list[Any]] = {}
    header = dict(header, arrays=layout)
    # The offsets depend on the header's length, which depends on the offsets: two passes
    # with a fixed-width guess, then the real one (offsets only grow when the header does).
    start = 0
    for _ in range(3):
        offset = start
        for name, array in arrays.items():
            layout[name] = [offset, array.dtype.str, list(array.shape)]
            offset = _aligned(offset + array.nbytes)
        raw = json.dumps(header, ensure_ascii=False).encode()
        first = _aligned(_PREFIX.size + len(raw) + 32)  # room for the offsets to grow
        if first == start:
            break
        start = first
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, len(raw)) + raw)
            for name, array in arrays.items():
                f.seek(layout[name][0])
                f.write(np.ascontiguousarray(array).tobytes())
            f.truncate(max([start] + [layout[n][0] + a.nbytes for n, a in arrays.items()]))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class IndexFile:
    """A mapped index file: .header (dict) and .array(name) (read-only views)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _PREFIX.size:
                raise IndexFileError(f"{path}: {size} bytes, too short for an index")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._map.madvise(mmap.MADV_RANDOM)  # binary searches: no read-ahead
        # This file's inode for good (a rebuilt index replaces the path, not this file);
        # pread keeps no file offset, so a forked child may share it.
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self._fd)
        magic, length = _PREFIX.unpack_from(self._map, 0)
        if magic != MAGIC or _PREFIX.size + length > size:
            raise IndexFileError(f"{path}: not an index of this version ({magic!r})")
        try:
            self.header: dict[str, Any] = json.loads(
                self._map[_PREFIX.size : _PREFIX.size + length]
            )
        except ValueError as exc:
            raise IndexFileError(f"{path}: unreadable header ({exc})") from None
        self._size = size
        # name -> (offset, length, value's struct) of a 1-D integer array, for item()
        self._items: dict[str, tuple[int, int, struct.Struct]] = {}

    def array(self, name: str) -> np.ndarray:
        offset, dtype, shape = self.header["arrays"][name]
        count = int(np.prod(shape))
        if offset + count * np.dtype(dtype).itemsize > self._size:
            raise IndexFileError(f"{self.path}: array {name} runs past the end of the file")
        return np.frombuffer(self._map, dtype, count, offset).reshape(shape)

    def item(self, name: str, k: int) -> int:
        """Element k of a 1-D integer array, read with pread (see the module docstring)."""
        found = self._items.get(name)
        if found is None:
            offset, dtype, shape = self.header["arrays"][name]
            kind = np.dtype(dtype)
            if kind.kind not in "iu" or len(shape) != 1:
                raise TypeError(f"{name}: {dtype} {shape}, not a 1-D integer array")
            code = "bhiq"[kind.itemsize.bit_length() - 1]  # struct's standard sizes
            fmt = (">" if kind.str[0] == ">" else "<") + (
                code.upper() if kind.kind == "u" else code
            )
            found = self._items[name] = (offset, shape[0], struct.Struct(fmt))
        offset, n, value = found
        if not 0 <= k < n:  # never another array's bytes
            raise IndexError(f"{name}[{k}] of an index array of {n}")
        return int(value.unpack(os.pread(self._fd, value.size, offset + k * value.size))[0])

    def has(self, name: str) -> bool:
        return name in self.header["arrays"]
