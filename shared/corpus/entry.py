"""One clip of a corpus, as every format gives it: :class:`Entry`.

Every corpus format (shared/corpus/formats/) parses its lines or files into
Entries and nothing else; the corpus index (shared/corpus/index.py) keeps them
and gives them out by item. A line or file that cannot be used becomes a
:class:`BadLine` with its reason, and the rest of the corpus is used.

Where the audio is: a format reads an entry's ``audio_path`` relative to the
corpus root (the metadata file's folder, the corpus folder or an object-store
prefix), or absolute when the corpus says so; every Entry an index gives out has
it resolved (:func:`absolute`). The corpus digest hashes the relative form, so
the same corpus has the same digest wherever it lives.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import orjson

AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3")


class CorpusError(ValueError):
    """The corpus as a whole cannot be read (no metadata file, a wrong header, a store
    that cannot be reached): the message names data.path and what to change."""


class Entry(NamedTuple):
    """One clip: item_id; audio_path (see the module docstring); text, the raw
    transcription; speaker ("" when the corpus names none); language (a code; "" until
    the index settles data.language or detection); offset_s and duration_s (seconds) cut
    a segment of the file (0, 0: the whole file); member: (byte offset, size) of the
    clip's audio inside audio_path when that is a tar shard or a Parquet file, None for a
    file of its own.

    A NamedTuple: the index build handles millions of them, and a format's fast path
    builds plain tuples in this order."""

    item_id: str
    audio_path: str
    text: str
    speaker: str = ""
    language: str = ""
    offset_s: float = 0.0
    duration_s: float = 0.0
    member: tuple[int, int] | None = None

    @property
    def segment(self) -> tuple[float, float] | None:
        """(offset_s, duration_s) when the clip is part of its file, else None."""
        return (self.offset_s, self.duration_s) if self.offset_s or self.duration_s else None


@dataclass(frozen=True)
class BadLine:
    """A line (or file) of the corpus that was not used; line is 1-based."""

    file: str
    line: int
    reason: str
    item_id: str = ""


def absolute(root: str, audio: str) -> str:
    """The audio path of an item: root-relative paths joined to the root (a folder, or an
    object-store prefix such as s3://bucket/corpus)."""
    if os.path.isabs(audio) or "://" in audio:
        return audio
    return os.path.normpath(f"{root}/{audio}") if ".." in audio else f"{root}/{audio}"


def in_corpus(audio: str, folder: str, root: str) -> str:
    """An audio path as the corpus keeps it: relative to the root whether the metadata
    names it absolute or relative to its own folder, with '..' where it lies outside the
    root. So the same corpus gives the same paths, ids and digest wherever it lives, as
    long as its files keep their places relative to each other and to the root."""
    return os.path.relpath(audio if os.path.isabs(audio) else os.path.join(folder, audio), root)


def relative(root: str, audio: str) -> str:
    """audio relative to root when it lies under it, else as it is."""
    return audio[len(root) + 1 :] if audio.startswith(root + "/") else audio


def store(entry: Entry) -> bytes:
    """An entry as a line the index keeps itself (formats read by scanning folders or
    shards): a JSON list of its fields, checked when they were read. orjson: ~0.3 us an
    entry against json's ~3, the most of a scanned corpus's build (benchmarks/parquet.py);
    copied, as the bytes orjson returns keep the ~4 KiB it wrote them in (200,000 kept
    entries took 785 MB)."""
    try:
        return memoryview(orjson.dumps(list(entry))).tobytes()
    except orjson.JSONEncodeError:  # a lone surrogate: json says which, as it always did
        return json.dumps(list(entry), ensure_ascii=False).encode()


def stored(line: str) -> Entry:
    """The entry of a line :func:`store` wrote."""
    values = json.loads(line)
    if len(values) > 7 and values[7] is not None:
        values[7] = tuple(values[7])
    return Entry(*values)


def digest_line(item_id: str, text: str, audio: str, offset_s: float, duration_s: float) -> str:
    """One item's part of the corpus digest (audio relative to the corpus root)."""
    return f"{item_id}\0{text}\0{audio}\0{offset_s!r}\0{duration_s!r}\n"


def digest_tables(
    h: Any, speakers: Any, languages: Any, speaker_ids: Any, language_ids: Any
) -> str:
    """The corpus digest: h (the items' lines) with every item's speaker and language
    (sorted tables and int32 ids into them)."""
    h.update(json.dumps([list(speakers), list(languages)], ensure_ascii=False).encode())
    h.update(np.ascontiguousarray(np.asarray(speaker_ids), np.int32).tobytes())
    h.update(np.ascontiguousarray(np.asarray(language_ids), np.int32).tobytes())
    return h.hexdigest()
