"""Shards on object storage (s3://, gs://, https://, any fsspec protocol), read through
fsspec with retries and a bounded local shard cache.

- Credentials and endpoints come from each store's usual environment (AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_PROFILE for S3; GOOGLE_APPLICATION_CREDENTIALS
  for GCS), read by the store's own client, never from the config file.
- A read that fails on a transient error (a broken pipe mid-body, a reset, a 5xx, a
  timeout; webdataset#473, #432) is tried data.store_retries times in all, waiting
  0.5 s, 1 s, 2 s ... in between; a missing object or a refused credential is not
  transient and fails at once. The store client's own retries are turned off where it
  has them (S3), so that this is the one place that retries, and counts.
- Each shard a producer reads is copied whole, once, into the shard cache
  (data.shard_cache_dir, default <features.cache_dir>/shard-cache), shared by the
  producers of a host, the least recently used shards evicted past data.shard_cache_mb.
  A clip is then one local ranged read (shared/corpus/members.py MemberReader). A
  format whose files are too big to copy for one clip (Parquet: up to 500 MB a file)
  reads each clip by one ranged read of the store instead (ShardCache.read_range), with
  the same retries. On a full disk the cache says so once (the folder and its free
  space, shared/memory/disk.py) and stops: each clip is then a ranged read too, and the
  run goes on.
- A store that cannot be reached at all is one error naming data.path and the
  environment to check, from the first listing (the index build, before any grant).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ringfeed.shared.config import Config
from ringfeed.shared.config.extras import MissingExtra, need_extra
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.memory.disk import disk_error, is_full

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_S = 0.5
# Seconds to connect to the store and to wait for a read before calling it transient.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
SHARD_SUFFIX = ".tar"
ENVIRONMENT_HINT = {
    "s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL or AWS_PROFILE",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS",
}


def is_remote(path: str) -> bool:
    """Is path an object-store URL (s3://..., gs://..., https://...)?"""
    return "://" in path


class StoreError(OSError):
    """The store failed past its retries, or refused: the message names what to check."""


def _filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for url, its client's own retries off."""
    import fsspec

    protocol = url.split("://", 1)[0]
    if protocol in ("s3", "s3a"):
        try:
            need_extra("s3fs", "s3", f"data.path {url} is on S3, which fsspec reads with s3fs")
        except MissingExtra as exc:
            raise CorpusError(str(exc)) from None
    # A listing decides whether the index is current: never from fsspec's listings cache;
    # and a new client each time, so an endpoint or credentials changed in the environment
    # are the ones used (fsspec's instance cache keys on arguments only). One client a
    # shard fetched or scanned, or a listing: rare beside the reads they make.
    options: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
    if protocol in ("s3", "s3a"):
        options |= {
            "config_kwargs": {
                "retries": {"max_attempts": 1, "mode": "standard"},
                "connect_timeout": CONNECT_TIMEOUT_S,
                "read_timeout": READ_TIMEOUT_S,
            },
        }
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise CorpusError(
            f"data.path: no reader for {protocol}:// ({exc}): install the "
            "fsspec package of that store (s3fs, gcsfs)"
        ) from None
    if hasattr(fs, "retries"):  # s3fs retries a broken read itself, uncounted: ours do
        fs.retries = 1
    return fs, path


# Errors that another try cannot mend: a missing object, a refused credential, a bug.
PERMANENT = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    TypeError,
    AttributeError,
    NotImplementedError,
)


def _transient(exc: BaseException) -> bool:
    return not isinstance(exc, PERMANENT)


def with_retries(cfg: Config, what: str, fn: Callable[[], T], on_retry: Callable[[], None]) -> T:
    """fn(), tried data.store_retries times in all on transient errors, with backoff."""
    tries = cfg.data.store_retries
    for attempt in range(tries):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - store clients raise many types; sorted below
            if not _transient(exc) or attempt == tries - 1:
                protocol = cfg.data.path.split("://", 1)[0]
                hint = ENVIRONMENT_HINT.get(protocol, "the store's credentials")
                raise StoreError(
                    f"data.path: {what} failed after {attempt + 1} tries "
                    f"({type(exc).__name__}: {str(exc)[:200]}): check that {cfg.data.path} "
                    f"exists and can be reached, and the environment ({hint})"
                ) from exc
            wait_s = BACKOFF_S * 2**attempt
            log.warning(
                "%s: %s (%s); trying again in %.1f s",
                what,
                type(exc).__name__,
                str(exc)[:200],
                wait_s,
            )
            on_retry()
            time.sleep(wait_s)
    raise AssertionError("unreachable")  # pragma: no cover


def list_shards(
    cfg: Config, suffix: str = SHARD_SUFFIX, recursive: bool = False
) -> tuple[str, list[tuple[str, int, str]]]:
    """(root URL, [(file name relative to the root, size, version stamp)]) of the files
    ending in suffix under data.path (in its sub-folders too when recursive)."""
    root = cfg.data.path.rstrip("/")
    fs, path = _filesystem(root)
    path = path.rstrip("/")

    def listing() -> list[dict[str, Any]]:
        if recursive:
            return list(fs.find(path, detail=True).values())
        return fs.ls(path, detail=True)

    try:
        entries = with_retries(cfg, f"listing {root}", listing, lambda: None)
    except StoreError as exc:
        raise CorpusError(str(exc)) from None
    found = []
    for entry in entries:
        name = entry["name"].rstrip("/").removeprefix(path + "/")
        if name.endswith(suffix) and entry.get("type", "file") == "file":
            stamp = entry.get("ETag") or entry.get("LastModified") or entry.get("mtime") or ""
            found.append((name, int(entry.get("size") or 0), str(stamp)))
    if not found:
        raise CorpusError(
            f"data.path: no *{suffix} files under {root} (data.format: {cfg.data.format})"
        )
    return root, sorted(found)


class ShardCache:
    """Local copies of remote shards, least recently used evicted past shard_cache_mb.
    Counters (this process): hits, fetched shards and bytes, retries."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        folder = cfg.data.shard_cache_dir or os.path.join(cfg.features.cache_dir, "shard-cache")
        self.folder = Path(folder)
        self.capacity_bytes = cfg.data.shard_cache_mb * 2**20
        self.hits = self.fetched = self.fetched_bytes = self.retries = 0
        self._client: Any = None  # the store client of read_range
        self.full = False  # its disk was full: no more copies, ranged reads instead
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._off_or_raise(exc)

    def _off_or_raise(self, exc: OSError) -> None:
        """A full disk turns the cache off, said once; any other error is raised."""
        if not is_full(exc):
            raise exc
        self.full = True
        log.warning(
            "shard cache: %s: this process reads each clip from the store instead;"
            " free space there, or set data.shard_cache_dir elsewhere",
            disk_error(exc, self.folder),
        )

    def local(self, url: str) -> str | None:
        """A local path holding the shard at url, fetched (with retries) if not cached;
        None once the cache's disk was full (read_range then). One process of the host
        fetches a shard: the others that miss it meanwhile wait for that fetch (two
        workers' producers reading one window fetched each shard twice)."""
        if self.full:
            return None
        path = self.folder / (hashlib.blake2b(url.encode(), digest_size=12).hexdigest() + ".tar")
        if self._hit(path):
            return str(path)
        with self._fetching(path):
            if self._hit(path):  # fetched by another producer while this one waited
                return str(path)
            fs, remote = _filesystem(url)
            data = with_retries(
                self.cfg, f"reading {url}", lambda: fs.cat_file(remote), self._retried
            )
            self._make_room(len(data))
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            try:
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                self._off_or_raise(exc)
                return None
        self.fetched += 1
        self.fetched_bytes += len(data)
        return str(path)

    def _hit(self, path: Path) -> bool:
        try:
            os.utime(path)  # its mtime is its last use: the eviction order
        except FileNotFoundError:
            return False
        self.hits += 1
        return True

    @contextlib.contextmanager
    def _fetching(self, path: Path) -> Iterator[None]:
        """Held while this process fetches the shard at path: an flock on a lock file
        beside it (released by the kernel if the process dies), removed with the shard."""
        try:
            lock = os.open(_lock_of(path), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except OSError as exc:  # a full disk: fetched unlocked, and the write says so
            if not is_full(exc):
                raise
            yield
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)

    def read_range(self, url: str, offset: int, size: int) -> bytes:
        """size bytes at offset of the object at url: one ranged read, with retries (a
        client kept per process: one a clip would cost more than the read)."""
        if self._client is None:
            self._client = _filesystem(url)[0]
        remote = url.split("://", 1)[1] if "://" in url else url
        data = with_retries(
            self.cfg,
            f"reading {url}",
            lambda: self._client.cat_file(remote, start=offset, end=offset + size),
            self._retried,
        )
        if len(data) != size:
            raise OSError(f"{url}: {len(data)} of {size} bytes at {offset} (truncated file)")
        self.fetched_bytes += size
        return data

    def read_object(self, url: str) -> bytes:
        """The whole object at url: one read, with retries (read_range's client)."""
        if self._client is None:
            self._client = _filesystem(url)[0]
        remote = url.split("://", 1)[1]
        data = with_retries(
            self.cfg, f"reading {url}", lambda: self._client.cat_file(remote), self._retried
        )
        self.fetched_bytes += len(data)
        return data

    def _retried(self) -> None:
        self.retries += 1

    def _make_room(self, incoming: int) -> None:
        """Evict the least recently used shards until `incoming` more bytes fit."""
        files = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".tar") and not entry.name.startswith("."):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # another producer evicted it meanwhile
                files.append((st.st_mtime_ns, st.st_size, entry.path))
        total = sum(size for _, size, _ in files) + incoming
        for _, size, name in sorted(files):
            if total <= self.capacity_bytes:
                break
            with_missing_ok(name)
            with_missing_ok(_lock_of(Path(name)))
            total -= size

    def counters(self) -> dict[str, int]:
        return {
            "shard_hits": self.hits,
            "shards_fetched": self.fetched,
            "shard_bytes_fetched": self.fetched_bytes,
            "store_retries": self.retries,
        }


def _lock_of(path: Path) -> str:
    """The lock file of the shard at path: a dot name, which eviction never counts."""
    return str(path.with_name(f".{path.name}.lock"))


def with_missing_ok(path: str) -> None:
    """Unlink path; gone already is fine (another producer evicted it). A reader that has
    it open keeps reading its bytes (POSIX unlink)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# Bytes a ranged read of the index build fetches at least: a tar header and a text member
# are 512 bytes each, and the scan seeks over the audio in between.
SCAN_BLOCK_BYTES = 1 << 16


def scan_remote(cfg: Config, url: str, scan: Callable[[Any], T]) -> T:
    """scan(file object) over the shard at url read by ranged reads (headers and text
    members, never the audio as a whole), the whole scan tried again on a transient error."""
    fs, remote = _filesystem(url)

    def attempt() -> T:
        with fs.open(remote, "rb", block_size=SCAN_BLOCK_BYTES, cache_type="readahead") as f:
            return scan(f)

    return with_retries(cfg, f"scanning {url}", attempt, lambda: None)
