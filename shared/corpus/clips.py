"""One way to read a clip's audio, wherever it lives: :meth:`ClipReader.read_clip`.

Every reader of audio goes through it: the producers' decode (producer/audio/decode.py),
the length table's header reads and the prosody pass (producer/prepare/), the checks
of `ringfeed validate` (scripts/preflight.py, scripts/corpus_report.py,
scripts/outlier_report.py). Nothing else branches on where audio lives. An entry
(shared/corpus/entry.py) says where:

- a file of its own: a local ``audio_path``, ``member`` None; read through one
  descriptor;
- a tar shard member (WebDataset): ``member`` (offset, size) inside the shard; one
  pread (shared/corpus/members.py), a remote shard through the local shard cache;
- a byte range of a Parquet page (Hugging Face datasets): ``member`` (offset, size)
  inside the file; one pread, or one ranged read of the store;
- an object-store object: ``audio_path`` a URL, ``member`` None; the object read whole,
  with retries (shared/corpus/object_store.py);
- an offset segment (Lhotse, manifests): ``segment`` (offset_s, duration_s) of any of
  the above; the decoder seeks to it (``Clip.segment``).

A :class:`Clip` holds the bytes (or the descriptor) and says how long it is; what
the audio says is the decoder's business. A clip that cannot be read raises
:class:`ClipError` (:class:`ClipMissing` when it is not there), whose ``reason`` is the
quarantine's sentence. :func:`clip_identity` names a clip's bytes for the feature
cache without reading them (one stat for a file, none for a store).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from types import TracebackType

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.members import MemberReader
from ringfeed.shared.corpus.object_store import is_remote

# A clip that is part of its file: (offset_s, duration_s; 0 = to the end), or None.
Segment = tuple[float, float] | None


class ClipError(OSError):
    """A clip whose bytes cannot be read; reason: one sentence for the quarantine."""

    def __init__(self, reason: str, path: str) -> None:
        super().__init__(reason)
        self.reason, self.path = reason, path


class ClipMissing(ClipError, FileNotFoundError):
    """A clip that is not there (its file, its shard or its object)."""


class Clip:
    """One clip's audio, opened: ``path`` names where it lives (for messages), ``size``
    its bytes, ``segment`` the part of it that is the clip (None: all of it). A file of
    its own is read through its descriptor (``fd``: decoders read it as it is, and a
    fallback decoder may open ``path`` again); any other clip is bytes: ``data``, all of
    them or the head that was asked for, and ``more`` reads on past them. Close it (or
    use ``with``): a file's descriptor is released."""

    def __init__(
        self,
        path: str,
        segment: Segment,
        size: int,
        fd: int | None = None,
        data: bytes = b"",
        more: Callable[[int, int], bytes] | None = None,
    ) -> None:
        self.path, self.segment, self.size = path, segment, size
        self.fd, self.data, self.more = fd, data, more

    @property
    def is_file(self) -> bool:
        """A local file of its own (a decoder may open ``path`` itself)."""
        return self.fd is not None

    def read_at(self, at: int, n: int) -> bytes:
        """Up to n bytes at byte `at` of the clip (fewer at its end)."""
        n = max(0, min(n, self.size - at))
        if self.fd is not None:
            return os.pread(self.fd, n, at)
        if at + n <= len(self.data) or self.more is None:
            return self.data[at : at + n]
        return self.more(at, n) if n else b""

    def source(self) -> int | io.BytesIO:
        """What soundfile opens: the descriptor (open it with closefd=False), or the
        bytes read (the head, when only a head was asked for)."""
        if self.fd is not None:
            os.lseek(self.fd, 0, os.SEEK_SET)  # libsndfile reads on from where a reader left
            return self.fd
        return io.BytesIO(self.data)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Clip:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ClipReader:
    """read_clip for one process: its open shards and its shard cache (members.py), made
    once; counters() says what the shard cache did."""

    def __init__(self, cfg: Config) -> None:
        self.members = MemberReader(cfg)

    def read_clip(self, entry: Entry, head: int = 0) -> Clip:
        """The clip of `entry`, opened. head > 0: only its first `head` bytes are needed
        (a header read), so a member or an object may be read no further. Raises
        ClipMissing or ClipError."""
        path, member = entry.audio_path, entry.member
        if member is not None:
            offset, size = member

            def more(at: int, n: int) -> bytes:
                return self._member(path, offset + at, n)

            data = more(0, min(size, head) if head else size)
            return Clip(path, entry.segment, size, data=data, more=more)
        if is_remote(path):
            data = self._object(path)
            return Clip(path, entry.segment, len(data), data=data)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ClipMissing("audio file not found", path) from None
        return Clip(path, entry.segment, os.fstat(fd).st_size, fd=fd)

    def _member(self, path: str, offset: int, size: int) -> bytes:
        try:
            return self.members.read(path, offset, size)
        except FileNotFoundError:
            raise ClipMissing("audio file not found (its tar shard)", path) from None
        except OSError as exc:
            raise ClipError(f"unreadable tar shard member ({exc})", path) from None

    def _object(self, url: str) -> bytes:
        try:
            return self.members.read_object(url)
        except OSError as exc:  # the store's error past its retries (object_store.StoreError)
            if isinstance(exc, FileNotFoundError) or isinstance(exc.__cause__, FileNotFoundError):
                raise ClipMissing("audio file not found", url) from None
            raise ClipError(f"unreadable audio object ({exc})", url) from None

    def counters(self) -> dict[str, int]:
        """The shard cache's hits, fetches, bytes and retries (remote clips; else {})."""
        return self.members.counters()


def in_a_store(entry: Entry) -> bool:
    """Does reading the clip fetch it from object storage (its file, shard or object)?
    Tools that read every clip's header ask, so as not to fetch a corpus to look at it."""
    return is_remote(entry.audio_path)


def clip_identity(entry: Entry) -> bytes:
    """What names the clip's bytes, without reading them: a local file's absolute path,
    size and mtime_ns (one stat: an edited file is another clip; FileNotFoundError when
    it is gone), a store's URL (never statted: its version is the index's business),
    then the member's place and the segment. The feature cache hashes it
    (shared/corpus/feature_cache.py): these bytes are its keys, unchanged since before
    read_clip."""
    path = entry.audio_path
    if is_remote(path):
        identity = f"{path}\0remote".encode()
    else:
        path = os.path.abspath(path)
        st = os.stat(path)
        identity = f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    if entry.member is not None:
        identity += f"\0member {entry.member[0]} {entry.member[1]}".encode()
    if entry.segment is not None:
        identity += f"\0{entry.segment[0]!r}\0{entry.segment[1]!r}".encode()
    return identity
