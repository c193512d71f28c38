"""Persistent feature cache shared by all producer processes on a host, and the stager.

On-disk layout (``features.cache_dir``)::

    <cache_dir>/<settings-hash>/settings.json        what the hash covers, for humans
    <cache_dir>/<settings-hash>/shard-<pid>-<n>.bin  float32 arrays, 64-byte aligned
    <cache_dir>/<settings-hash>/shard-<pid>-<n>.idx  16-byte header, then 44-byte records

The settings hash covers every setting that changes a cached array (audio.*,
features.* except the cache's own keys, the resampler quality, the STFT dtype and
CACHE_FORMAT_VERSION), so a settings change lands in a fresh directory and
never reads a stale array. Keys are a hash of the audio file's absolute path,
size and mtime_ns, so an edited file misses too.

A clip's entry is its log-mel, whichever process computed it: features.device is not
in the hash. With features.device: producer the producers compute and keep it; with
stager they keep no waveform, and the stager keeps the mels it computed for its local
producers' rows (consumer/stager/cache_writer.py, a writer of its own), so a warm cache
skips the FFT in either mode and a cache one mode wrote serves the other (the stager's
mels agree with the producers' within gpu_mel.MEL_ATOL: one definition,
shared/sample/mel_definition.py).

Concurrency: each process appends only to its own shard pair (created with
O_EXCL), so writers never contend. A record is appended to the .idx only
after its data is written to the .bin, and records carry a CRC-32 and data a
check of their own (xxh3: data_check), so a reader that sees a half-written or
torn entry (a crash, a power loss without fsync) treats it as a miss and the
sample is recomputed. Readers map shards with mmap and hand out read-only
views: no open() per sample and no copy. Entries other processes wrote after
this one started are found by re-reading the .idx files on a miss, at most
once per ``rescan_interval_s``.

A full or failing cache filesystem costs the cache, never the run: after
MAX_WRITE_FAILURES failed writes in a row this process stops writing for the
rest of its life (logged once, counted in ``CacheStats``) and reads go on.
Before that back-off each failed write opened a new shard pair found by
scanning names from 0: after 6,000 misses on a full 1 MiB tmpfs one put()
took 46 ms instead of 0.7, with 12,000 empty files in the directory
(issue 18, case 9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import mmap
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from ringfeed.shared.config import Config
from ringfeed.shared.config.audio import RESAMPLE_QUALITY
from ringfeed.shared.corpus.clips import clip_identity
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.memory.disk import disk_error, is_full
from ringfeed.shared.sample.content import LOG_FLOOR
from ringfeed.shared.sample.marks import ALL as ALL_MARKS
from ringfeed.shared.sample.mel_definition import STFT_DTYPE

log = logging.getLogger(__name__)

# Bump when the meaning of a cached array changes without a config change. 2: a record's
# flags are the clip's marks (shared/sample/marks.py: truncated, near-silent, clipped);
# a version-1 record was never judged, so it must not read as "neither". 3: the data's
# check is xxh3 (data_check), not CRC-32.
CACHE_FORMAT_VERSION = 3
_IDX_HEADER = struct.Struct("<8sII")  # magic, format version, record size
_IDX_MAGIC = b"RFCACHE\x00"
# key, data offset, rows, cols (0 = 1-D), data_check, flags, then the record's own crc32.
_RECORD_BODY = struct.Struct("<16sQIIIB3x")
_RECORD_SIZE = _RECORD_BODY.size + 4
_ALIGN = 64
# A new shard every 2 GiB keeps any one mmap and any one lost file bounded.
MAX_SHARD_BYTES = 2 << 30
RESCAN_INTERVAL_S = 1.0
# Failed writes in a row after which a process stops writing the cache for the run: more
# than one, so one EIO does not end it; few, so a full disk costs a few shards, not 1,000s.
MAX_WRITE_FAILURES = 3


def data_check(data: np.ndarray | memoryview) -> int:
    """An entry's bytes -> their 32-bit check (every hit computes it again): xxh3's low
    half, 0.007 ms for a 5 s clip's mel here where CRC-32 took 0.09, a third of a cached
    sample's work in its producer."""
    return xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF


def settings_hash(cfg: Config) -> str:
    """16 hex digits naming the cache directory for these settings."""
    return hashlib.blake2b(_settings_json(cfg).encode(), digest_size=8).hexdigest()


def _settings_json(cfg: Config) -> str:
    features = dataclasses.asdict(cfg.features)
    del features["cache_dir"], features["cache"]  # where and whether: not what
    # The optional fields are cached under keys of their own (producer/features/extra_fields.py):
    # turning one on or off keeps the mels.
    for key in (
        "pitch",
        "energy",
        "user_function",
        "user_version",
        "user_fields",
        "reference",
        "reference_frames",
        "single_clip",
        "durations_dir",
    ):
        del features[key]
    features["log_floor"] = LOG_FLOOR  # once a key: caches made then keep their name
    # The log-mel whichever process computes it (module docstring), named as the
    # producers' caches always were.
    features["device"] = "producer"
    features["stft_dtype"] = STFT_DTYPE
    settings = {
        "version": CACHE_FORMAT_VERSION,
        "resample_quality": RESAMPLE_QUALITY,
        "audio": dataclasses.asdict(cfg.audio),
        "features": features,
    }
    return json.dumps(settings, sort_keys=True, indent=1)


@dataclass(frozen=True)
class _Entry:
    shard: str
    offset: int
    rows: int
    cols: int
    crc: int
    flags: int

    @property
    def count(self) -> int:
        return self.rows * max(self.cols, 1)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    writes: int = 0
    rescans: int = 0
    write_failures: int = 0
    writes_off: int = 0  # puts not tried: this process stopped writing (MAX_WRITE_FAILURES)


class _ShardWriter:
    """This process's append-only shard pair; only its creator writes it."""

    def __init__(self, directory: Path, first: int) -> None:
        """Open shard-<pid>-<n> for the first free n >= `first` (self.number)."""
        self.pid = os.getpid()
        for n in itertools.count(first):
            stem = directory / f"shard-{self.pid}-{n}"
            try:
                self.bin_fd = os.open(f"{stem}.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:  # an old run's process had this pid
                continue
            break
        self.number, self.stem, self.name = n, stem, f"{stem.name}.bin"
        self.size, self.records, self.idx_fd = 0, 0, -1
        try:
            self.idx_fd = os.open(f"{stem}.idx", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            header = _IDX_HEADER.pack(_IDX_MAGIC, CACHE_FORMAT_VERSION, _RECORD_SIZE)
            _write_all(self.idx_fd, header)
        except OSError:
            self.close()
            raise

    def append(self, key: bytes, array: np.ndarray, flags: int) -> _Entry:
        data = memoryview(array).cast("B")
        pad = -self.size % _ALIGN
        offset = self.size + pad
        _write_all(self.bin_fd, bytes(pad))
        _write_all(self.bin_fd, data)
        self.size = offset + len(data)
        rows, cols = (array.shape[0], array.shape[1]) if array.ndim == 2 else (array.shape[0], 0)
        entry = _Entry(self.name, offset, rows, cols, data_check(data), flags)
        body = _RECORD_BODY.pack(key, offset, rows, cols, entry.crc, flags)
        # The index record goes out only now, after the data write returned.
        _write_all(self.idx_fd, body + struct.pack("<I", zlib.crc32(body)))
        self.records += 1
        return entry

    def close(self) -> None:
        """Close both files; a shard with no record is removed (a failed write leaves
        nothing a reader could use, and a full disk would fill up with such pairs)."""
        os.close(self.bin_fd)
        if self.idx_fd >= 0:
            os.close(self.idx_fd)
        if self.records == 0:
            for suffix in (".bin", ".idx"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.stem}{suffix}")


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FeatureCache:
    """Maps an audio file (+ the settings) to its cached float32 array and its marks
    (shared/sample/marks.py: truncated, near-silent, clipped).

    One per producer process (inside SamplePipeline), and one in the stager's writer
    thread (reads False). Arrays returned by :meth:`get` are read-only views into an
    mmap: copy them into the slot, do not keep them.
    """

    def __init__(
        self, cfg: Config, rescan_interval_s: float = RESCAN_INTERVAL_S, reads: bool = True
    ) -> None:
        """OSError when the folder cannot be made (DiskFull, naming it, on a full disk).
        reads False: a writer only, which reads no index and keeps none (the stager's:
        the index of a large cache is ~100 bytes an entry in memory)."""
        self.directory = Path(cfg.features.cache_dir).absolute() / settings_hash(cfg)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._write_settings(cfg)
        except OSError as exc:
            raise disk_error(exc, self.directory) from None
        self.rescan_interval_s = rescan_interval_s
        self.stats = CacheStats()
        self._index: dict[bytes, _Entry] = {}
        self._idx_read: dict[str, int] = {}  # .idx name -> bytes already parsed
        self._maps: dict[str, mmap.mmap] = {}
        self._bad: set[tuple[str, int]] = set()
        self._writer: _ShardWriter | None = None
        self._next_shard = 0  # shard names below this one are taken: no scan from 0
        self._failures_in_row = 0
        self._last_scan_s = float("-inf")
        self.reads = reads
        if reads:
            self.rescan()

    def _write_settings(self, cfg: Config) -> None:
        path = self.directory / "settings.json"
        if not path.exists():
            tmp = path.with_name(f".settings.json.{os.getpid()}")
            tmp.write_text(_settings_json(cfg))
            os.replace(tmp, path)

    def __len__(self) -> int:
        return len(self._index)

    @staticmethod
    def key(entry: Entry) -> bytes:
        """16-byte key of the entry's clip: a hash of shared/corpus/clips.py clip_identity
        (a file's absolute path, size and mtime_ns by one stat; a store's URL, never
        statted; the member's place in a tar shard or Parquet file; the segment).
        FileNotFoundError when the file is gone."""
        return hashlib.blake2b(clip_identity(entry), digest_size=16).digest()

    def get(self, key: bytes) -> tuple[np.ndarray, int] | None:
        """-> (read-only float32 array, its marks) or None on a miss or a corrupt entry."""
        entry = self._index.get(key)
        if entry is None and time.monotonic() - self._last_scan_s >= self.rescan_interval_s:
            self.rescan()
            entry = self._index.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        array = self._load(entry)
        if array is None:
            log.warning(
                "feature cache: corrupt entry in %s at %d, recomputing", entry.shard, entry.offset
            )
            self._bad.add((entry.shard, entry.offset))
            del self._index[key]
            self.stats.corrupt += 1
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        return array, entry.flags & ALL_MARKS

    def put(self, key: bytes, array: np.ndarray, marks: int) -> bool:
        """Append a float32 [n] or [n, m] array and its marks (shared/sample/marks.py; a
        bool says truncated) to this process's shard; False (and no
        file touched) once this process has stopped writing (:meth:`writing`). OSError
        from a failed write, after which the next put opens a fresh shard; DiskFull
        (one line naming the folder and its free space) on a full disk, after which this
        process writes no more."""
        if not self.writing:
            self.stats.writes_off += 1
            return False
        array = np.ascontiguousarray(array, dtype=np.float32)
        try:
            writer = self._open_writer()
            entry = writer.append(key, array, int(marks) & ALL_MARKS)
            if self.reads:
                self._index[key] = entry
        except OSError as exc:
            self._write_failed(exc)
            raise disk_error(exc, self.directory) from None
        self._failures_in_row = 0
        self.stats.writes += 1
        return True

    @property
    def writing(self) -> bool:
        """False once MAX_WRITE_FAILURES writes in a row failed: off for the run."""
        return self._failures_in_row < MAX_WRITE_FAILURES

    def _open_writer(self) -> _ShardWriter:
        writer = self._writer
        if writer is None or writer.pid != os.getpid() or writer.size >= MAX_SHARD_BYTES:
            # A forked child must not share its parent's file offsets: it opens its own.
            if writer is not None and writer.pid == os.getpid():
                writer.close()
            if writer is not None and writer.pid != os.getpid():
                self._next_shard = 0  # a forked child: its own pid, its own names
            self._writer = None
            writer = self._writer = _ShardWriter(self.directory, self._next_shard)
            self._next_shard = writer.number + 1
        return writer

    def _write_failed(self, exc: OSError) -> None:
        # A half-written record (ENOSPC, EIO) would put the next one at a wrong offset:
        # this shard is done; the next put opens a fresh one. Readers skip the torn tail.
        if self._writer is not None and self._writer.pid == os.getpid():
            self._writer.close()
        self._writer = None
        self.stats.write_failures += 1
        self._failures_in_row += 1
        if is_full(exc):  # no retry finds room on a full disk: off at once, one line said
            self._failures_in_row = MAX_WRITE_FAILURES
            log.warning(
                "feature cache: %s: this process writes no more features there for"
                " the run, reads go on; free space there, or set features.cache_dir"
                " elsewhere or features.cache: false",
                disk_error(exc, self.directory),
            )
        elif not self.writing:
            log.warning(
                "feature cache: %d writes in a row failed (last: %s); this process stops "
                "writing to %s for the rest of the run, reads go on: free space there, or "
                "set features.cache_dir elsewhere or features.cache: false",
                self._failures_in_row,
                exc,
                self.directory,
            )

    def rescan(self) -> int:
        """Read records other processes appended since the last scan -> number of new keys."""
        self._last_scan_s = time.monotonic()
        self.stats.rescans += 1
        before = len(self._index)
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".idx"):
                self._read_idx(name)
        return len(self._index) - before

    def _read_idx(self, name: str) -> None:
        done = self._idx_read.get(name, 0)
        try:
            with open(self.directory / name, "rb") as f:
                f.seek(done)
                raw = f.read()
        except FileNotFoundError:  # removed by a user clearing the cache: nothing to read
            return
        if done == 0:
            if len(raw) < _IDX_HEADER.size:
                return  # the writer has not finished its header yet
            magic, version, size = _IDX_HEADER.unpack_from(raw)
            if (magic, version, size) != (_IDX_MAGIC, CACHE_FORMAT_VERSION, _RECORD_SIZE):
                log.warning("feature cache: %s has a foreign header, ignored", name)
                self._idx_read[name] = 1 << 62
                return
            raw, done = raw[_IDX_HEADER.size :], _IDX_HEADER.size
        n_records = len(raw) // _RECORD_SIZE  # a torn last record is read next time
        shard = name.removesuffix(".idx") + ".bin"
        for i in range(n_records):
            record = raw[i * _RECORD_SIZE : (i + 1) * _RECORD_SIZE]
            body, (crc,) = record[:-4], struct.unpack("<I", record[-4:])
            if zlib.crc32(body) != crc:
                self.stats.corrupt += 1
                continue
            key, offset, rows, cols, data_crc, flags = _RECORD_BODY.unpack(body)
            if (shard, offset) not in self._bad:
                self._index[key] = _Entry(shard, offset, rows, cols, data_crc, flags)
        self._idx_read[name] = done + n_records * _RECORD_SIZE

    def _load(self, entry: _Entry) -> np.ndarray | None:
        end = entry.offset + entry.count * 4
        mm = self._maps.get(entry.shard)
        if mm is None or len(mm) < end:
            # The shard grew (or is new to us): map it again. Old maps stay alive while
            # views into them exist, so they are dropped, never closed.
            try:
                with open(self.directory / entry.shard, "rb") as f:
                    if os.fstat(f.fileno()).st_size < end:
                        return None
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except FileNotFoundError:
                return None
            self._maps[entry.shard] = mm
        array = np.frombuffer(mm, dtype=np.float32, count=entry.count, offset=entry.offset)
        if data_check(array) != entry.crc:
            return None
        return array.reshape((entry.rows, entry.cols) if entry.cols else (entry.rows,))

    def close(self) -> None:
        """Close this process's shard files; the maps go when their views go."""
        if self._writer is not None and self._writer.pid == os.getpid():
            self._writer.close()
        self._writer = None
        self._maps.clear()
