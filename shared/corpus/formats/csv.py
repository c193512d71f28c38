"""csv: a metadata file of ``audio_file|text[|speaker_name]`` lines under that header.

audio_file is relative to the file's folder (or absolute) and ends in a known
audio extension; the item id is its path relative to the corpus root (the file's
folder, or data.root) without the extension, so ids do not depend on where the
corpus lives (shared/corpus/entry.py in_corpus).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import AUDIO_EXTENSIONS, CorpusError, in_corpus
from ringfeed.shared.corpus.format import FORMATS_DOC, Context, LineFormat

HEADERS = (("audio_file", "text"), ("audio_file", "text", "speaker_name"))


def reason(fields: list[str], n_columns: int) -> str:
    """Why a line split into `fields` is not a clip ("" if it is)."""
    if len(fields) != n_columns:
        return f"expected {n_columns} '|'-separated columns, got {len(fields)}"
    audio = fields[0].strip()
    if not audio:
        return "empty audio_file"
    if not audio.lower().endswith(AUDIO_EXTENSIONS):
        return f"unsupported audio extension in {audio!r} (use one of {AUDIO_EXTENSIONS})"
    if not fields[1].strip():
        return "empty text"
    return ""


class Csv(LineFormat):
    name: ClassVar[str] = "csv"
    free_paths: ClassVar[bool] = True
    file_name: ClassVar[str] = "metadata.csv"
    expects: ClassVar[str] = "a directory holding metadata.csv, or the file itself"

    def setting(self, cfg: Config, path: str, first: bytes | None) -> tuple[int, bool]:
        """The column count its header line says (2 or 3); the header is skipped."""
        if first is None:
            raise CorpusError(f"{path}: empty file, expected a header 'audio_file|text'")
        header = tuple(f.strip() for f in first.decode("utf-8", errors="replace").split("|"))
        if header not in HEADERS:
            raise CorpusError(
                f"{path}:1: data.format: csv needs the header 'audio_file|text' or "
                f"'audio_file|text|speaker_name', got {'|'.join(header)!r} ({FORMATS_DOC})"
            )
        return len(header), True

    def rows(self, texts: list[str], context: Context) -> list[tuple | str]:
        """The id is the audio path relative to the corpus root without its extension;
        without pathlib where the path is plain (relative, no empty or dot parts, the
        root the file's folder): the build's hot path."""
        setting, folder = context.setting, os.path.dirname(context.source)
        moved = folder != context.root  # data.root: every path counts from it
        out: list[tuple | str] = []
        append = out.append
        for line in texts:
            fields = line.split("|")
            if len(fields) == setting:
                audio, text = fields[0].strip(), fields[1].strip()
                if audio and text and audio.lower().endswith(AUDIO_EXTENSIONS):
                    if moved or audio[0] == "/":
                        audio = in_corpus(audio, folder, context.root)
                    stem = audio[: audio.rfind(".")]
                    if "//" in audio or "./" in audio or stem[stem.rfind("/") + 1 :][:1] == ".":
                        stem = Path(audio).with_suffix("").as_posix()
                    speaker = fields[2].strip() if setting == 3 else ""
                    append((stem, audio, text, speaker, "", 0.0, 0.0))
                    continue
            append(reason(fields, setting))
        return out
