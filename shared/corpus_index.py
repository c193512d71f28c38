"""The corpus index: built once, memory-mapped by the stager and every producer.

A corpus of millions of clips read into Python objects costs every process
hundreds of MB and tens of seconds (README, "Corpora of millions of clips"). The
index is a file beside the feature cache (``index-<key>.rfi``, shared/index_file.py)
holding per item: where its line is (byte offset and length in the metadata file,
or in the index itself for folder layouts and shards), its speaker and language ids,
the hash of its id, and the length manifest of the bucket planner (mel frames and
tokens; shared/manifest.py). Its header holds the speaker and language tables, the
unusable lines with their reasons, and the dataset digest. Every process maps it
read-only: the pages are shared through the page cache, and a producer parses only
the lines of the items it is granted (:meth:`MappedIndex.entry`).

Current or stale: the header keeps the metadata file's size and mtime (for folder
layouts and shards, a hash of their folders' and shards' stamps); the key in the
file name hashes every setting that decides the items (path, format, text column,
language). A stale or missing index is built by one process at a time (a lock
file beside it), in a subprocess (``python -m ringfeed.shared.index_build``), so no
process keeps the build's memory; the others wait for it and map the result. A
cache folder that cannot be written falls back to reading the corpus in memory,
with a warning.
"""

from __future__ import annotations

import bisect
import fcntl
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ringfeed.shared import entry_lines
from ringfeed.shared.config import Config
from ringfeed.shared.dataset import (
    FOLDER_FORMATS,
    BadLine,
    DatasetEntry,
    DatasetError,
    DatasetIndex,
    _data_path,
    _metadata_path,
)
from ringfeed.shared.index_file import IndexFile, IndexFileError, write_index

log = logging.getLogger(__name__)

INDEX_VERSION = 2  # 2: the digest covers speakers, languages and segments


def index_key(cfg: Config) -> str:
    """A hash of every setting that decides the index's items."""
    d = cfg.data
    where = d.path if "://" in d.path else str(Path(d.path).absolute())
    settings = [where, d.format, d.text_column, d.language,
                list(d.detect_languages), INDEX_VERSION]  # fmt: skip
    return hashlib.blake2b(json.dumps(settings).encode(), digest_size=8).hexdigest()


def index_path(cfg: Config) -> Path:
    return Path(cfg.features.cache_dir).absolute() / f"index-{index_key(cfg)}.rfi"


def source_stamp(cfg: Config) -> list[Any]:
    """What says the corpus changed, cheaply: the metadata file's (path, size, mtime_ns);
    for folder layouts and shards a hash of every folder's and shard's stamp (one stat a
    folder or shard, never one a clip)."""
    if cfg.data.format == "shards":
        from ringfeed.shared.shards import shards_stamp

        return ["shards", shards_stamp(cfg)]
    if cfg.data.format in FOLDER_FORMATS:
        return ["tree", tree_stamp(_data_path(cfg, None).absolute())]
    path = _metadata_path(cfg, None)
    st = os.stat(path)
    return [str(path.absolute()), st.st_size, st.st_mtime_ns]


def tree_stamp(root: Path) -> str:
    """A hash of (path, mtime_ns) of every folder under root (links followed, each real
    folder once) and of every file directly in root: adding or removing a clip or a
    shard changes its folder's mtime. One stat a folder, never one a clip."""
    h = hashlib.blake2b(digest_size=16)
    if not root.is_dir():
        raise DatasetError(f"data.path: {root} is not a folder")
    seen = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        h.update(f"{folder}|{os.stat(folder).st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        if folder == str(root):
            for name in sorted(files):
                st = os.stat(os.path.join(folder, name))
                h.update(
                    f"{name}|{st.st_size}|{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape")
                )
    return h.hexdigest()


class Entries(Sequence[DatasetEntry]):
    """index.entries of a mapped index: each entry parsed when asked for, never all kept."""

    def __init__(self, index: MappedIndex) -> None:
        self._index = index

    def __len__(self) -> int:
        return self._index.n_items

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, slice):
            return [self._index.entry(k) for k in range(*item.indices(self._index.n_items))]
        if not -self._index.n_items <= item < self._index.n_items:
            raise IndexError(item)
        return self._index.entry(item % self._index.n_items)

    def __iter__(self) -> Iterator[DatasetEntry]:
        return (self._index.entry(k) for k in range(self._index.n_items))


class ItemArray:
    """A mapped 1-D array read one element at a time with pread (arr[k] -> int), or whole
    through the map (np.asarray(arr)); what the stager's batch builder indexes by item."""

    def __init__(self, file: IndexFile, name: str) -> None:
        self._file, self._name = file, name
        self._array = file.array(name)

    def __getitem__(self, k: Any) -> Any:
        """One element (an int) by pread; a slice or an index array through the map (the
        balanced plan's whole-corpus pass, consumer/stager/balance.py)."""
        if isinstance(k, int | np.integer):
            return self._file.item(self._name, int(k))
        return self._array[k]

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    def __len__(self) -> int:
        return len(self._array)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)


class MappedIndex:
    """What DatasetIndex gives (n_items, item_id, path, find, entries, bad_lines), from a
    mapped index file; entry(k) reads and parses item k's line only."""

    synthetic_items = 0

    def __init__(self, path: Path) -> None:
        self.file = IndexFile(path)
        h = self.file.header
        if h.get("version") != INDEX_VERSION:
            raise IndexFileError(f"{path}: index version {h.get('version')}, not {INDEX_VERSION}")
        self.n_items: int = h["n_items"]
        self.root: str = h["root"]
        self.digest: str = h["digest"]
        self.plan_hash: str = h["plan_hash"]
        self.speakers: tuple[str, ...] = tuple(h["speakers"])
        self.languages: tuple[str, ...] = tuple(h["languages"])
        self._kind, self._setting = h["kind"], h["setting"]
        self.speaker_ids = ItemArray(self.file, "speaker")
        self.language_ids = ItemArray(self.file, "language")
        self.frames, self.text = self.file.array("frames"), self.file.array("text")
        self._id_hash, self._id_order = self.file.array("id_hash"), self.file.array("id_order")
        self._lines = self.file.array("lines") if self.file.has("lines") else None
        # The lines this index was built from, opened now (pread: shared safely by a fork).
        lines_file = h["lines_file"]
        self._fd = os.open(lines_file, os.O_RDONLY | os.O_CLOEXEC) if lines_file else -1
        if self._fd >= 0:
            weakref.finalize(self, os.close, self._fd)

    @functools.cached_property
    def shard_starts(self) -> np.ndarray | None:
        """int64 [n_shards + 1]: the first item of each tar shard, and n_items; None for
        a corpus of files (items of a shard are consecutive, shared/shards.py)."""
        shards = self.file.header.get("shards")
        if shards is None:
            return None
        return np.concatenate([[0], np.cumsum([n for _, n in shards])]).astype(np.int64)

    @property
    def lengths_key(self) -> str:
        return self.file.header.get("lengths_key", "")

    @functools.cached_property
    def bad_lines(self) -> tuple[BadLine, ...]:
        return tuple(BadLine(*b) for b in self.file.header["bad_lines"])

    @property
    def entries(self) -> Entries:
        return Entries(self)

    def _line(self, item: int) -> bytes:
        offset, length = self.file.item("offset", item), self.file.item("length", item)
        if self._lines is not None:
            return self._lines[offset : offset + length].tobytes()
        return os.pread(self._fd, length, offset)

    def fields(self, item: int) -> entry_lines.Fields:
        """Item k's line, parsed; DatasetError if it no longer parses (the metadata file
        changed under a running run)."""
        result = entry_lines.parse(self._kind, self._line(item), self._setting, self.root)
        if isinstance(result, str):
            raise DatasetError(
                f"item {item}: its metadata line changed since the index was built ({result}):"
                " restart the run to index the corpus again"
            )
        return result

    def entry(self, item: int) -> DatasetEntry:
        f = self.fields(item)
        return DatasetEntry(
            f.item_id, entry_lines.absolute(self.root, f.audio), f.text,
            self.speakers[self.speaker_ids[item]], self.languages[self.language_ids[item]],
            f.offset_s, f.duration_s, *f[7:],
        )  # fmt: skip

    def item_id(self, item: int) -> str:
        return self.fields(item).item_id

    def path(self, item: int) -> str:
        return entry_lines.absolute(self.root, self.fields(item).audio)

    def find(self, item_id: str) -> int | None:
        """The item whose id this is, or None: a binary search of the id hashes."""
        h = xxhash.xxh3_64_intdigest(item_id.encode("utf-8", "surrogatepass"))
        hashes = ItemArray(self.file, "id_hash")  # ~24 preads: no page of it in the RSS
        for k in range(bisect.bisect_left(hashes, h), bisect.bisect_right(hashes, h)):
            item = self.file.item("id_order", k)
            if self.item_id(item) == item_id:
                return item
        return None

    def name_tables(self) -> tuple[tuple[str, ...], tuple[str, ...], Any, Any]:
        return self.speakers, self.languages, self.speaker_ids, self.language_ids


def write_built(cfg: Config) -> Path:
    """Build cfg.data's index and write it (lengths measured before are kept for the
    items whose id they were measured for); returns its path."""
    from ringfeed.shared.index_build import build_index

    stamp = source_stamp(cfg)
    header, arrays = build_index(cfg)
    path = index_path(cfg)
    _keep_lengths(path, arrays)
    header.update(version=INDEX_VERSION, source=stamp, key=index_key(cfg),
                  lengths_key=_old_lengths_key(path))  # fmt: skip
    write_index(path, header, arrays)
    log.info("corpus index: %d items, %d unusable lines, %.1f s -> %s", header["n_items"],
             len(header["bad_lines"]), header["build_s"], path)  # fmt: skip
    return path


def _old(path: Path) -> MappedIndex | None:
    try:
        return MappedIndex(path)
    except (OSError, IndexFileError, KeyError):
        return None


def _old_lengths_key(path: Path) -> str:
    old = _old(path)
    return old.lengths_key if old is not None else ""


def _keep_lengths(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Lengths of the old index's items, by id hash, into the new arrays (a line appended
    to the metadata costs one item's measuring, not the corpus's)."""
    old = _old(path)
    if old is None or not old.lengths_key or not len(old._id_hash):
        return
    new_hash = arrays["id_hash"]
    at = np.minimum(np.searchsorted(old._id_hash, new_hash), len(old._id_hash) - 1)
    found = old._id_hash[at] == new_hash
    old_items = old._id_order[at[found]].astype(np.int64)
    new_items = arrays["id_order"][found].astype(np.int64)
    arrays["frames"][new_items] = old.frames[old_items]
    arrays["text"][new_items] = old.text[old_items]


def save_lengths(
    index: MappedIndex, frames: np.ndarray, text: np.ndarray, lengths_key: str
) -> None:
    """Write the index again with these lengths (the length manifest, shared/manifest.py)."""
    file = index.file
    arrays = {name: file.array(name) for name in file.header["arrays"]}
    arrays["frames"], arrays["text"] = frames.astype(np.int32), text.astype(np.int32)
    header = {k: v for k, v in file.header.items() if k != "arrays"}
    header["lengths_key"] = lengths_key
    write_index(file.path, header, arrays)


def _current(cfg: Config, path: Path) -> MappedIndex | None:
    index = _old(path)
    if index is None:
        return None
    try:
        stamp = source_stamp(cfg)
    except OSError:
        return None
    return index if index.file.header.get("source") == stamp else None


def _build_in_subprocess(cfg: Config) -> None:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "-m", "ringfeed.shared.index_build"]
    done = subprocess.run(argv, input=cfg.to_yaml(),
                          text=True, env=env, check=False)  # fmt: skip
    if done.returncode != 0:
        raise DatasetError(f"data.path: the corpus index could not be built (exit code "
                           f"{done.returncode}; its log says why)")  # fmt: skip


def open_index(cfg: Config, in_subprocess: bool = True) -> MappedIndex | DatasetIndex:
    """cfg.data's index, mapped; built first if missing or stale (one builder at a time;
    in a subprocess, so that this process never holds the build's memory). A cache
    folder that cannot be written: the corpus read in memory (shared/dataset.py)."""
    path = index_path(cfg)
    index = _current(cfg, path)
    if index is not None:
        return index
    source_stamp(cfg)  # a missing metadata file is its own error, before any lock
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - held across the build
    except OSError as exc:
        if cfg.data.format == "shards":
            raise DatasetError(
                f"features.cache_dir: cannot write the shards' index in "
                f"{path.parent} ({exc}): point it at a writable folder"
            ) from None
        log.warning("features.cache_dir: cannot keep the corpus index in %s (%s): every "
                    "process reads the corpus in memory; point it at a writable folder",
                    path.parent, exc)  # fmt: skip
        from ringfeed.shared.dataset import read_index_in_memory

        return read_index_in_memory(cfg)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait
        index = _current(cfg, path)
        if index is None:
            log.info("corpus index: building %s", path)
            if in_subprocess:
                _build_in_subprocess(cfg)
            else:
                write_built(cfg)
            index = _current(cfg, path)
    if index is None:
        raise DatasetError(f"{path}: the corpus changed while it was indexed: start again")
    return index
