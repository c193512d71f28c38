"""The same row twice in a corpus of files of many clips (tar shards, Parquet files).

There an item's id is its file and its name in it (shared/corpus/formats/shards.py,
parquet.py; docs/corpora.md#item-ids), unique by construction: a name that repeats in
another file is another clip, and both are used. The same row twice (a shard copied
beside itself, a dataset concatenated with itself) then has two ids as well, so it is
found here instead: rows alike in every field that says what they are (their name,
text, speaker, language and audio size) whose audio is the same bytes. The first is
used; each later one is an unusable line naming both places.

Cost: one hash a row (~0.1 us: Python's own hash of a tuple) and a sort, nothing kept
a row; and the audio of the rows whose fields all match, read and compared (none in a
corpus without repeats).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.object_store import ShardCache, is_remote


def repeats(
    hashes: np.ndarray, key: Callable[[int], tuple[Any, ...]], audio: Callable[[int], bytes]
) -> dict[int, int]:
    """{row: the earlier row it repeats}: hashes holds a hash of each row's key (int64
    [n], Python's hash of the tuple: one process decides); rows of equal hashes are the
    same when their keys (key(row)) are equal and their audio (audio(row): its bytes) is
    too. Each repeat maps to the first such row, in row order."""
    order = np.argsort(hashes, kind="stable")
    ranked = hashes[order]
    same = np.flatnonzero(ranked[1:] == ranked[:-1])
    groups: dict[int, set[int]] = {}
    for k in same:
        groups.setdefault(int(ranked[k]), set()).update((int(order[k]), int(order[k + 1])))
    digests: dict[int, int] = {}

    def digest(row: int) -> int:
        if row not in digests:
            digests[row] = xxhash.xxh3_128_intdigest(audio(row))
        return digests[row]

    found: dict[int, int] = {}
    for group in groups.values():
        firsts: list[int] = []
        for row in sorted(group):
            first = next(
                (f for f in firsts if key(f) == key(row) and digest(f) == digest(row)), None
            )
            if first is None:
                firsts.append(row)
            else:
                found[row] = first
    return found


def range_reader(cfg: Config, root: str) -> Callable[[str, int, int], bytes]:
    """read(file relative to root, offset, size) -> those bytes of the file: a pread, or
    one ranged read of the store (never a copy of the file into the shard cache)."""
    store: list[ShardCache] = []

    def read(rel: str, offset: int, size: int) -> bytes:
        if is_remote(root):
            store[:] = store or [ShardCache(cfg)]
            return store[0].read_range(f"{root}/{rel}", offset, size)
        fd = os.open(f"{root}/{rel}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    return read
