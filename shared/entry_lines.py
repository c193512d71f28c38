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
from typing import NamedTuple

from shared import corpora
from shared.dataset import AUDIO_EXTENSIONS


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
    """ljspeech lines (id|text|normalized) -> Fields-shaped tuples or reasons; one loop
    with no call per line (the build's hot path)."""
    out: list[tuple | str] = []
    append = out.append
    for line in lines:
        fields = line.split("|")
        if len(fields) != 3:
            append(f"expected 3 '|'-separated columns (id|text|normalized), got {len(fields)}")
            continue
        item_id, text = fields[0].strip(), fields[text_column].strip()
        if not item_id:
            append("empty item id")
        elif not text:
            append(f"empty text in column {text_column + 1} (data.text_column={text_column})")
        else:
            append((item_id, f"wavs/{item_id}.wav", text, "", "", 0.0, 0.0))
    return out


def csv_rows(lines: list[str], n_columns: int) -> list[tuple | str]:
    """csv lines (audio_file|text[|speaker_name]) -> Fields-shaped tuples or reasons. The
    id is Path(audio_file).with_suffix("").as_posix(), without pathlib where the path is
    plain (no empty or dot parts)."""
    out: list[tuple | str] = []
    append = out.append
    for line in lines:
        fields = line.split("|")
        if len(fields) != n_columns:
            append(f"expected {n_columns} '|'-separated columns, got {len(fields)}")
            continue
        rel, text = fields[0].strip(), fields[1].strip()
        if not rel:
            append("empty audio_file")
        elif not rel.lower().endswith(AUDIO_EXTENSIONS):
            append(f"unsupported audio extension in {rel!r} (use one of {AUDIO_EXTENSIONS})")
        elif not text:
            append("empty text")
        else:
            stem = rel[: rel.rfind(".")]
            if "//" in rel or "./" in rel or stem[stem.rfind("/") + 1 : stem.rfind("/") + 2] == ".":
                stem = Path(rel).with_suffix("").as_posix()
            append((stem, rel, text, fields[2].strip() if n_columns == 3 else "", "", 0.0, 0.0))
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


def absolute(root: str, audio: str) -> str:
    """The audio path of an item: root-relative paths joined to the root (a folder, or an
    object-store prefix such as s3://bucket/corpus)."""
    return audio if os.path.isabs(audio) or "://" in audio else f"{root}/{audio}"
