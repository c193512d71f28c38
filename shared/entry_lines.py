"""One corpus line -> its fields, for the corpus index (shared/corpus_index.py).

The index build parses every line once; a producer parses again only the lines of
the items it is granted (the index keeps each line's byte offset and length). Both
use these functions, so they agree by construction. They give the same verdicts as
shared/dataset.py's readers (tests/test_corpus_index.py checks it on every shipped
corpus and the broken one) but return plain tuples and build no Path objects: the
build must pass 200,000 lines a second (README, "Corpora of millions of clips").

A parsed line is a :class:`Fields` (audio relative to the corpus root, or absolute)
or a reason string. Speaker and language of the item come from the index (the build
settles data.language and detection once), not from the line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ringfeed.shared import corpora
from ringfeed.shared.dataset import AUDIO_EXTENSIONS, _csv_entry, _ljspeech_entry

# The base a bad line's reason is asked with (a reason names no path).
_NOWHERE = Path("/")


class Fields(NamedTuple):
    """One usable line: audio is relative to the corpus root (or absolute); offset_s and
    duration_s cut a segment (0, 0: the whole file)."""

    item_id: str
    audio: str
    text: str
    speaker: str = ""
    language: str = ""
    offset_s: float = 0.0
    duration_s: float = 0.0
    member: tuple[int, int] | None = None  # (byte offset, size) of the audio in a tar shard


def ljspeech_rows(lines: list[str], text_column: int) -> list[tuple | str]:
    """ljspeech lines (id|text|normalized, or id|text) -> Fields-shaped tuples or reasons; one loop
    with no call per good line (the build's hot path). A bad line's reason is the one
    shared/dataset.py gives (its reader decides it)."""
    out: list[tuple | str] = []
    append = out.append
    for line in lines:
        fields = line.split("|")
        if len(fields) in (2, 3):  # id|text too: that text whatever text_column says
            item_id, text = fields[0].strip(), fields[min(text_column, len(fields) - 1)].strip()
            if item_id and text:
                append((item_id, f"wavs/{item_id}.wav", text, "", "", 0.0, 0.0))
                continue
        append(_ljspeech_entry(fields, _NOWHERE, text_column))
    return out


def csv_rows(lines: list[str], n_columns: int) -> list[tuple | str]:
    """csv lines (audio_file|text[|speaker_name]) -> Fields-shaped tuples or reasons. The
    id is Path(audio_file).with_suffix("").as_posix(), without pathlib where the path is
    plain (no empty or dot parts); a bad line's reason is shared/dataset.py's."""
    out: list[tuple | str] = []
    append = out.append
    for line in lines:
        fields = line.split("|")
        if len(fields) == n_columns:
            rel, text = fields[0].strip(), fields[1].strip()
            if rel and text and rel.lower().endswith(AUDIO_EXTENSIONS):
                stem = rel[: rel.rfind(".")]
                if "//" in rel or "./" in rel or stem[stem.rfind("/") + 1 :][:1] == ".":
                    stem = Path(rel).with_suffix("").as_posix()
                speaker = fields[2].strip() if n_columns == 3 else ""
                append((stem, rel, text, speaker, "", 0.0, 0.0))
                continue
        append(_csv_entry(fields, _NOWHERE, n_columns))
    return out


def jsonl(line: str, root: str) -> Fields | str:
    """A manifest line (shared/corpora.py jsonl_entry: the one parser of that format)."""
    try:
        entry = corpora.jsonl_entry(line, Path(root))
    except Exception as exc:  # noqa: BLE001 - one line costs that line (contract 9)
        return f"unreadable line ({type(exc).__name__}: {str(exc)[:200]})"
    if isinstance(entry, str):
        return entry
    audio = entry.audio_path
    rel = audio[len(root) + 1 :] if audio.startswith(root + "/") else audio
    return Fields(entry.item_id, rel, entry.text, entry.speaker, entry.language,
                  entry.offset_s, entry.duration_s)  # fmt: skip


def stored(line: str) -> Fields | str:
    """A line the index build wrote itself (folder layouts, tar shards): a JSON list of
    the Fields, whose values were checked when they were written."""
    values = json.loads(line)
    if len(values) > 7 and values[7] is not None:
        values[7] = tuple(values[7])
    return Fields(*values)


def store(fields: Fields) -> bytes:
    return json.dumps(list(fields), ensure_ascii=False).encode()


def parse(kind: str, line: bytes, setting: int, root: str) -> Fields | str:
    """One line (no newline) of a corpus whose lines are of `kind` (ljspeech, csv, jsonl,
    stored); setting: ljspeech's text column or csv's column count."""
    result = parse_block(kind, [line], setting, root)[0]
    return result if isinstance(result, str) else Fields(*result)


def parse_block(kind: str, lines: list[bytes], setting: int, root: str) -> list[tuple | str]:
    """Many lines at once: one decode for the block when it is valid UTF-8 (lines hold no
    newline, so joining and splitting again gives them back)."""
    try:
        texts: list[str | None] = b"\n".join(lines).decode("utf-8").split("\n")
        bad: dict[int, str] = {}
    except UnicodeDecodeError:
        texts, bad = [], {}
        for k, raw in enumerate(lines):
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                texts.append("")
                bad[k] = f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if kind == "ljspeech":
        out = ljspeech_rows(texts, setting)
    elif kind == "csv":
        out = csv_rows(texts, setting)
    elif kind == "jsonl":
        out = [jsonl(text, root) for text in texts]
    else:
        out = [stored(text) for text in texts]
    for k, reason in bad.items():
        out[k] = reason
    return out


def digest_line(item_id: str, text: str, audio: str, offset_s: float, duration_s: float) -> str:
    """One item's part of the dataset digest (audio relative to the corpus root)."""
    return f"{item_id}\0{text}\0{audio}\0{offset_s!r}\0{duration_s!r}\n"


def digest_tables(
    h: Any, speakers: Any, languages: Any, speaker_ids: Any, language_ids: Any
) -> str:
    """The dataset digest: h (the items' lines) with every item's speaker and language
    (sorted tables and int32 ids into them); the same for a mapped and an in-memory index."""
    h.update(json.dumps([list(speakers), list(languages)], ensure_ascii=False).encode())
    h.update(np.ascontiguousarray(np.asarray(speaker_ids), np.int32).tobytes())
    h.update(np.ascontiguousarray(np.asarray(language_ids), np.int32).tobytes())
    return h.hexdigest()


def absolute(root: str, audio: str) -> str:
    """The audio path of an item: root-relative paths joined to the root (a folder, or an
    object-store prefix such as s3://bucket/corpus)."""
    return audio if os.path.isabs(audio) or "://" in audio else f"{root}/{audio}"
