"""One clip's bytes from inside a tar shard (shared/corpus/formats/shards.py) or a Parquet
file (shared/corpus/formats/parquet.py), by the (offset, size) its entry carries: one
pread, the file kept open for the next; or a whole object of a store.

Used by read_clip (shared/corpus/clips.py), the one way every reader of audio reads a
clip. Remote shards come through the local shard cache (shared/corpus/object_store.py
ShardCache) first.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.object_store import ShardCache, is_remote
from ringfeed.shared.corpus.registry import format_of

# Open shard files a producer keeps (one fd each); the least recently used is closed.
OPEN_SHARDS = 16


class MemberReader:
    """Reads one clip's bytes from its shard (one pread), keeping up to OPEN_SHARDS
    files open; remote shards come through the local shard cache (object_store)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._open: OrderedDict[str, int] = OrderedDict()
        self._pid = os.getpid()
        self._store: Any = None
        # A remote file's clips by one ranged read each, not through the shard cache.
        self._ranged = format_of(cfg).ranged_reads
        self.reads = 0

    def counters(self) -> dict[str, int]:
        """The shard cache's hits, fetches, bytes and retries (remote shards; else {})."""
        return self._store.counters() if self._store else {}

    def read(self, shard: str, offset: int, size: int) -> bytes:
        if os.getpid() != self._pid:  # forked: the fds are the parent's
            self._open.clear()
            self._pid = os.getpid()
        if is_remote(shard):
            if self._store is None:
                self._store = ShardCache(self.cfg)
            local = None if self._ranged else self._store.local(shard)
            if local is None:  # a format read by ranged reads, or the cache's disk is full
                self.reads += 1
                return self._store.read_range(shard, offset, size)
            shard = local
        fd = self._open.pop(shard, None)
        if fd is None:
            fd = os.open(shard, os.O_RDONLY | os.O_CLOEXEC)
            while len(self._open) >= OPEN_SHARDS:
                os.close(self._open.popitem(last=False)[1])
        self._open[shard] = fd
        data = os.pread(fd, size, offset)
        self.reads += 1
        if len(data) != size:
            raise OSError(f"{shard}: {len(data)} of {size} bytes at {offset} (truncated shard)")
        return data

    def read_object(self, url: str) -> bytes:
        """The whole object at url (a clip stored as an object of its own), with the
        store's retries; never copied into the shard cache (one clip, read once)."""
        if self._store is None:
            self._store = ShardCache(self.cfg)
        self.reads += 1
        return self._store.read_object(url)
