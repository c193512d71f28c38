"""The corpus index: every process's view of the corpus, built once.

A corpus of millions of clips read into Python objects costs every process
hundreds of MB and tens of seconds (docs/scale.md#the-corpus-index). The
index (shared/corpus/build.py builds it) holds per item: where its line is (byte
offset and length in the metadata file, or in the index itself for the formats
found by scanning), its speaker and language as ids into tables sorted by name,
the hash of its id, and the length table of the bucket planner (mel frames and
tokens; shared/corpus/lengths.py). Its header holds the tables, the unusable
lines with their reasons, the corpus digest and the plan hash.

:class:`CorpusIndex` is the face every caller uses (the stager's plan and
quarantine, each producer, the tools). :class:`BuiltIndex` implements it over
what the builder made, either mapped from the index file (shared/corpus/index_file.py:
every process maps it read-only, its pages shared through the page cache, and a
producer parses only the lines of the items it is granted) or held in memory
(:class:`MemoryStore`: tests, tools, a cache folder that cannot be written).
Synthetic corpora compute theirs (shared/corpus/formats/synthetic.py).
shared/corpus/open.py decides which.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry, absolute
from ringfeed.shared.corpus.format import Context, CorpusFormat
from ringfeed.shared.corpus.index_file import IndexFile, IndexFileError, write_index
from ringfeed.shared.corpus.memory_copies import places, write_kept
from ringfeed.shared.corpus.registry import format_named

# 3: the header names the format; one builder for every format. 4: item ids unique by
# construction (docs/corpora.md#item-ids), data.split.
INDEX_VERSION = 4


class CorpusIndex(Protocol):
    """What every process knows of the corpus (module docstring). Items are 0..n_items-1
    in the corpus's own order; speaker_ids and language_ids are int32 [n_items] that
    index the speakers and languages tables (an element by [k], the whole by
    np.asarray)."""

    n_items: int
    root: str  # the folder or object-store prefix audio paths are relative to
    digest: str  # ids, texts, relative audio paths, segments, speakers, languages
    plan_hash: str  # ids and relative audio paths in item order (the plan's part)
    # plan_hash under the ids an earlier rule gave the same items ("": the same ids;
    # docs/corpora.md#item-ids), so a checkpoint taken under them resumes
    plan_hash_before: str
    bad_lines: tuple[BadLine, ...]
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    speaker_ids: Any
    language_ids: Any
    shard_starts: np.ndarray | None  # tar shards: each shard's first item, and n_items
    location: str  # where the index is kept, for a person to read
    has_audio: bool  # False: items are computed (synthetic)

    def entry(self, item: int) -> Entry: ...

    def item_id(self, item: int) -> str: ...

    def path(self, item: int) -> str: ...

    def find(self, item_id: str) -> int | None: ...

    @property
    def entries(self) -> Sequence[Entry]: ...

    def stored_lengths(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(frames int32 [n], tokens int32 [n]) measured under the length key `key`
        (shared/corpus/lengths.py), or None; NOT_MEASURED frames for items not yet."""
        ...

    def save_lengths(self, frames: np.ndarray, text: np.ndarray, key: str) -> None: ...


def index_key(cfg: Config) -> str:
    """A hash of every setting that decides the index's items."""
    d = cfg.data
    where = d.path if "://" in d.path else str(Path(d.path).absolute())
    settings = [
        where,
        d.format,
        d.text_column,
        d.language,
        list(d.detect_languages),
        INDEX_VERSION,
        d.split,
        sorted(vars(d.columns).items()),
    ]
    return hashlib.blake2b(json.dumps(settings).encode(), digest_size=8).hexdigest()


def index_path(cfg: Config) -> Path:
    return Path(cfg.features.cache_dir).absolute() / f"index-{index_key(cfg)}.rfi"


class MemoryStore:
    """The builder's header and arrays held in memory, with IndexFile's methods."""

    path = None

    def __init__(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.header, self.arrays = header, arrays

    def array(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def item(self, name: str, k: int) -> int:
        return int(self.arrays[name][k])

    def has(self, name: str) -> bool:
        return name in self.arrays


class ItemArray:
    """An index array read one element at a time (arr[k] -> int: with pread from a mapped
    file), or whole (np.asarray(arr)); what the stager's batch builder indexes by item."""

    def __init__(self, store: IndexFile | MemoryStore, name: str) -> None:
        self._store, self._name = store, name
        self._array = store.array(name)

    def __getitem__(self, k: Any) -> Any:
        """One element (an int) by pread; a slice or an index array through the map (the
        balanced plan's whole-corpus pass, consumer/stager/plan/balance.py)."""
        if isinstance(k, int | np.integer):
            return self._store.item(self._name, int(k))
        return self._array[k]

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    def __len__(self) -> int:
        return len(self._array)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)


class Entries(Sequence[Entry]):
    """index.entries: each entry parsed when asked for, never all kept."""

    def __init__(self, index: CorpusIndex) -> None:
        self._index = index

    def __len__(self) -> int:
        return self._index.n_items

    def __getitem__(self, item: Any) -> Any:
        n = self._index.n_items
        if isinstance(item, slice):
            return [self._index.entry(k) for k in range(*item.indices(n))]
        if not -n <= item < n:
            raise IndexError(item)
        return self._index.entry(item % n)

    def __iter__(self) -> Iterator[Entry]:
        return (self._index.entry(k) for k in range(self._index.n_items))


class BuiltIndex:
    """The CorpusIndex of what shared/corpus/build.py made (module docstring)."""

    has_audio = True

    def __init__(self, store: IndexFile | MemoryStore, fmt: CorpusFormat | None = None) -> None:
        """fmt: the format whose parse reads the kept lines (default: the one the header
        names)."""
        self.store = store
        h = store.header
        if h.get("version") != INDEX_VERSION:
            raise IndexFileError(f"index version {h.get('version')}, not {INDEX_VERSION}")
        self.n_items: int = h["n_items"]
        self.root: str = h["root"]
        self.digest: str = h["digest"]
        self.plan_hash: str = h["plan_hash"]
        self.plan_hash_before: str = h.get("plan_hash_before", "")
        self.speakers: tuple[str, ...] = tuple(h["speakers"])
        self.languages: tuple[str, ...] = tuple(h["languages"])
        self.format = fmt or format_named(h["format"])
        self._context = Context(h["setting"], self.root, h["lines_file"])
        self.speaker_ids = ItemArray(store, "speaker")
        self.language_ids = ItemArray(store, "language")
        self._lines = store.array("lines") if store.has("lines") else None
        # The lines this index was built from, opened now (pread: shared safely by a fork).
        lines_file = h["lines_file"]
        self._fd = os.open(lines_file, os.O_RDONLY | os.O_CLOEXEC) if lines_file else -1
        if self._fd >= 0:
            weakref.finalize(self, os.close, self._fd)

    @classmethod
    def mapped(cls, path: Path) -> BuiltIndex:
        return cls(IndexFile(path))

    @property
    def location(self) -> str:
        return str(self.store.path) if self.store.path else "(in memory)"

    @functools.cached_property
    def shard_starts(self) -> np.ndarray | None:
        shards = self.store.header.get("shards")
        if shards is None:
            return None
        return np.concatenate([[0], np.cumsum([n for _, n in shards])]).astype(np.int64)

    @functools.cached_property
    def bad_lines(self) -> tuple[BadLine, ...]:
        return tuple(BadLine(*b) for b in self.store.header["bad_lines"])

    @property
    def entries(self) -> Entries:
        return Entries(self)

    def _line(self, item: int) -> bytes:
        offset, length = self.store.item("offset", item), self.store.item("length", item)
        if self._lines is not None:
            return self._lines[offset : offset + length].tobytes()
        return os.pread(self._fd, length, offset)

    def _row(self, item: int) -> tuple:
        """Item k's line, parsed; CorpusError if it no longer parses (the metadata file
        changed under a running run)."""
        row = self.format.parse([self._line(item)], self._context)[0]
        if isinstance(row, str):
            raise CorpusError(
                f"item {item}: its metadata line changed since the index was built ({row}): "
                "restart the run to index the corpus again"
            )
        return row

    def entry(self, item: int) -> Entry:
        row = self._row(item)
        return Entry(
            row[0],
            absolute(self.root, row[1]),
            row[2],
            self.speakers[self.speaker_ids[item]],
            self.languages[self.language_ids[item]],
            *row[5:],
        )

    def item_id(self, item: int) -> str:
        return self._row(item)[0]

    def path(self, item: int) -> str:
        return absolute(self.root, self._row(item)[1])

    def source(self, item: int) -> tuple[str, int]:
        """(file, 1-based line) where a person finds the item: its metadata line, or the
        file its entry was read from."""
        lines_file = self.store.header["lines_file"]
        if lines_file:
            return lines_file, self.store.item("line", item)
        return self.path(item), 1

    def find(self, item_id: str) -> int | None:
        """The item whose id this is, or None: a binary search of the id hashes."""
        h = xxhash.xxh3_64_intdigest(item_id.encode("utf-8", "surrogatepass"))
        hashes = ItemArray(self.store, "id_hash")  # ~24 preads: no page of it in the RSS
        for k in range(bisect.bisect_left(hashes, h), bisect.bisect_right(hashes, h)):
            item = self.store.item("id_order", k)
            if self.item_id(item) == item_id:
                return item
        return None

    def newest(self) -> BuiltIndex:
        """This index as its file holds it now: preparation writes the file again with
        the lengths it measured (or, on a full disk, its memory copy:
        shared/corpus/memory_copies.py), beside the one this process mapped."""
        if self.store.path is None:
            return self
        for place in places(self.store.path):
            try:
                again = BuiltIndex.mapped(place)
            except (OSError, ValueError, KeyError):
                continue
            if again.digest == self.digest:
                return again
        return self

    def stored_lengths(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        store = self.newest().store
        if store.header.get("lengths_key", "") != key:
            return None
        return np.array(store.array("frames"), np.int32), np.array(store.array("text"), np.int32)

    def save_lengths(self, frames: np.ndarray, text: np.ndarray, key: str) -> None:
        """Keep these lengths: the index file written again with them (atomically), or
        the arrays replaced in memory."""
        store = self.store
        names = store.header["arrays"] if store.path is not None else store.arrays
        arrays = {name: store.array(name) for name in names}
        arrays["frames"], arrays["text"] = frames.astype(np.int32), text.astype(np.int32)
        header = {k: v for k, v in store.header.items() if k != "arrays"}
        header["lengths_key"] = key
        if store.path is None:
            self.store = MemoryStore(header, arrays)
            self.speaker_ids = ItemArray(self.store, "speaker")
            self.language_ids = ItemArray(self.store, "language")
        else:  # its home beside the cache; on a full disk its memory copy (memory_copies.py)
            home = Path(header.get("home") or store.path)
            write_kept(home, lambda there: write_index(there, header, arrays))
