"""Dataset readers: LJSpeech ``metadata.csv``, ``audio_file|text[|speaker_name]`` CSV,
and through shared/corpora.py JSON-lines manifests, LibriTTS and VCTK folders.

Called by the stager (to build the epoch plan) and by every producer (to map
an item index to its entry); both must get the same list, so the order is the
file order and nothing depends on the file system's listing order. A bad line
becomes a :class:`BadLine` with a specific reason and the rest is used: the
file is read as bytes and decoded line by line, so one non-UTF-8 line does not
lose the others. Every entry carries its speaker ("" when the corpus names
none) and language (data.language when the entry names none).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.language_codes import language_code

if TYPE_CHECKING:
    from ringfeed.shared.corpus_index import MappedIndex

log = logging.getLogger(__name__)

METADATA_FILE = "metadata.csv"
CSV_HEADER = ("audio_file", "text")
CSV_HEADER_SPEAKER = ("audio_file", "text", "speaker_name")
AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3")
FOLDER_FORMATS = ("libritts", "vctk")


class DatasetError(ValueError):
    """The dataset as a whole cannot be read (no metadata file, wrong header)."""


@dataclass(frozen=True, slots=True)
class DatasetEntry:
    """One usable clip: audio_path is absolute, text the raw transcription; offset_s and
    duration_s (seconds) cut a segment of the file (duration_s 0: to its end)."""

    item_id: str
    audio_path: str
    text: str
    speaker: str = ""
    language: str = ""
    offset_s: float = 0.0
    duration_s: float = 0.0
    # (byte offset, size) of the clip's audio inside audio_path when that is a tar shard
    # (shared/shards.py); None for a file of its own.
    member: tuple[int, int] | None = None

    @property
    def segment(self) -> tuple[float, float] | None:
        """(offset_s, duration_s) when the clip is part of its file, else None."""
        return (self.offset_s, self.duration_s) if self.offset_s or self.duration_s else None


@dataclass(frozen=True)
class BadLine:
    """A metadata line that was not used; line is 1-based."""

    file: str
    line: int
    reason: str
    item_id: str = ""


def _data_path(cfg: Config, root: str | os.PathLike[str] | None) -> Path:
    path = Path(cfg.data.path)
    return path if path.is_absolute() else Path(root or os.getcwd()) / path


def _metadata_path(cfg: Config, root: str | os.PathLike[str] | None) -> Path:
    path = _data_path(cfg, root)
    if path.is_dir() and cfg.data.format != "jsonl":
        path = path / METADATA_FILE
    if not path.is_file():
        want = f"a directory holding {METADATA_FILE}, or the file itself"
        want = "the manifest file" if cfg.data.format == "jsonl" else want
        raise DatasetError(
            f"data.path: no metadata file at {path} (data.format: {cfg.data.format} expects "
            f"{want}; every format: README, 'Bring your own data')"
        )
    return path


def _split_lines(raw: bytes) -> list[tuple[int, bytes]]:
    """Non-blank lines with their 1-based numbers; a UTF-8 BOM and CR are dropped."""
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    lines = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        line = line.rstrip(b"\r")
        if line.strip():
            lines.append((number, line))
    return lines


def _decode(line: bytes) -> tuple[str | None, str, str]:
    """-> (text or None, reason, item_id guessed from the first field)."""
    try:
        return line.decode("utf-8"), "", ""
    except UnicodeDecodeError as exc:
        first = line.split(b"|", 1)[0]
        item_id = first.decode("utf-8", errors="ignore") if first.isascii() else ""
        return None, f"not valid UTF-8 ({exc.reason} at byte {exc.start})", item_id.strip()


def _ljspeech_entry(fields: list[str], base: Path, column: int) -> DatasetEntry | str:
    if len(fields) not in (2, 3):
        return (f"expected 'id|text|normalized' or 'id|text' ('|'-separated), got "
                f"{len(fields)} columns")  # fmt: skip
    item_id = fields[0].strip()
    # id|text (many corpora drop LJSpeech's second copy of the text): that text.
    text = fields[min(column, len(fields) - 1)].strip()
    if not item_id:
        return "empty item id"
    if not text:
        return f"empty text in column {column + 1} (data.text_column={column})"
    return DatasetEntry(item_id, str(base / "wavs" / f"{item_id}.wav"), text)


def _csv_entry(fields: list[str], base: Path, n_columns: int) -> DatasetEntry | str:
    if len(fields) != n_columns:
        return f"expected {n_columns} '|'-separated columns, got {len(fields)}"
    rel = fields[0].strip()
    text = fields[1].strip()
    speaker = fields[2].strip() if n_columns == 3 else ""
    if not rel:
        return "empty audio_file"
    if not rel.lower().endswith(AUDIO_EXTENSIONS):
        return f"unsupported audio extension in {rel!r} (use one of {AUDIO_EXTENSIONS})"
    if not text:
        return "empty text"
    item_id = Path(rel).with_suffix("").as_posix()
    return DatasetEntry(item_id, str(base / rel), text, speaker)


def _csv_columns(path: Path, lines: list[tuple[int, bytes]]) -> int:
    header = tuple(f.strip() for f in lines[0][1].decode("utf-8", errors="replace").split("|"))
    if header not in (CSV_HEADER, CSV_HEADER_SPEAKER):
        raise DatasetError(
            f"{path}:1: data.format: csv needs the header 'audio_file|text' or "
            f"'audio_file|text|speaker_name', got {'|'.join(header)!r} (every format: README, "
            "'Bring your own data')"
        )
    return len(header)


def _decoded(path: Path, lines: list[tuple[int, bytes]]) -> list[tuple[int, str | None, str]]:
    return [(number, *_decode(raw)[:2]) for number, raw in lines]


def _line_results(cfg: Config, path: Path) -> list[tuple[str, int, DatasetEntry | str, str]]:
    """(file, line, entry or reason, item id) of every line of a one-file corpus."""
    from ringfeed.shared import corpora  # it builds on the types above

    base = path.parent.absolute()
    lines = _split_lines(path.read_bytes())
    if cfg.data.format == "jsonl":
        return [(str(path), *r) for r in corpora.read_jsonl(path, _decoded(path, lines))]
    if cfg.data.format == "csv":
        if not lines:
            raise DatasetError(f"{path}: empty file, expected a header 'audio_file|text'")
        n_columns = _csv_columns(path, lines)
        lines = lines[1:]
    out = []
    for number, raw in lines:
        text, reason, item_id = _decode(raw)
        if text is not None:
            fields = text.split("|")
            if cfg.data.format == "ljspeech":
                result = _ljspeech_entry(fields, base, cfg.data.text_column)
            else:
                result = _csv_entry(fields, base, n_columns)
            item_id = fields[0].strip() if isinstance(result, str) else result.item_id
        out.append((str(path), number, result if text is not None else reason, item_id))
    return out


def _folder_results(cfg: Config, root: Path) -> list[tuple[str, int, DatasetEntry | str, str]]:
    from ringfeed.shared import corpora

    if not root.is_dir():
        raise DatasetError(f"data.path: {root} is not a folder (data.format: {cfg.data.format})")
    if cfg.data.format == "libritts":
        entries, bad = corpora.read_libritts(root, cfg.data.text_column)
    else:
        entries, bad = corpora.read_vctk(root)
    return [(b.file, b.line, b.reason, b.item_id) for b in bad] + [
        (e.audio_path, 1, e, e.item_id) for e in entries
    ]


def read_dataset(
    cfg: Config, root: str | os.PathLike[str] | None = None
) -> tuple[list[DatasetEntry], list[BadLine]]:
    """Read cfg.data.path -> (usable entries in file order, bad lines).

    A relative data.path is resolved against root (default: the current
    directory). Audio paths are made absolute so every process agrees on them
    and the feature cache can key on them.
    """
    if cfg.data.format in FOLDER_FORMATS:
        results = _folder_results(cfg, _data_path(cfg, root))
        where = str(_data_path(cfg, root))
    else:
        path = _metadata_path(cfg, root)
        results, where = _line_results(cfg, path), str(path)
    entries: list[DatasetEntry] = []
    bad: list[BadLine] = []
    seen: dict[str, int] = {}
    for file, number, result, item_id in results:
        reason = result if isinstance(result, str) else _check_entry(result, seen)
        if reason:
            bad.append(BadLine(file, number, reason, item_id))
            continue
        seen[result.item_id] = number
        entries.append(result)
    if bad:
        log.warning("%s: %d of %d entries unusable", where, len(bad), len(results))
    return _with_languages(cfg, entries), bad


def _with_languages(cfg: Config, entries: list[DatasetEntry]) -> list[DatasetEntry]:
    """Every entry with a language: its own, data.language, or (auto) the detected one."""
    missing = [k for k, e in enumerate(entries) if not e.language]
    if cfg.data.language == "auto" and missing:
        from ringfeed.shared.language_id import detect_languages  # loads the detector's model

        texts = [entries[k].text for k in missing]
        candidates = [language_code(c) for c in cfg.data.detect_languages]
        cache_dir = cfg.features.cache_dir if cfg.features.cache else None
        codes = detect_languages(texts, candidates, cache_dir)
    else:
        codes = [language_code(cfg.data.language)] * len(missing)
    for k, code in zip(missing, codes, strict=True):
        entries[k] = dataclasses.replace(entries[k], language=code)
    return entries


def _check_entry(entry: DatasetEntry, seen: dict[str, int]) -> str:
    if entry.item_id in seen:
        return f"duplicate item id {entry.item_id!r} (first on line {seen[entry.item_id]})"
    if not os.path.isfile(entry.audio_path):
        return f"audio file not found: {entry.audio_path}"
    return ""


@dataclass(frozen=True)
class DatasetIndex:
    """What the stager and every producer agree on: item k's id and audio path, in file
    order, and the metadata lines that were not used. Synthetic data has no files and
    no entries: its ids are computed, so 10**7 synthetic items cost nothing to index.

    This one holds the corpus in memory (tests, tools, a cache folder that cannot be
    written); a run maps the corpus index instead (shared/corpus_index.py MappedIndex,
    the same methods), which dataset_index gives."""

    entries: tuple[DatasetEntry, ...] = ()
    bad_lines: tuple[BadLine, ...] = ()
    synthetic_items: int = 0
    root: str = ""  # the corpus root: audio paths in the digest are relative to it

    @property
    def n_items(self) -> int:
        return self.synthetic_items or len(self.entries)

    def entry(self, item: int) -> DatasetEntry:
        return self.entries[item]

    def item_id(self, item: int) -> str:
        return synthetic_item_id(item) if self.synthetic_items else self.entries[item].item_id

    def path(self, item: int) -> str:
        return "" if self.synthetic_items else self.entries[item].audio_path

    def find(self, item_id: str) -> int | None:
        """The item whose id this is, or None."""
        if self.synthetic_items:
            number = item_id.removeprefix(SYNTHETIC_PREFIX)
            found = int(number) if number.isdigit() else -1
            return found if 0 <= found < self.synthetic_items else None
        return self._by_id.get(item_id)

    @functools.cached_property
    def _by_id(self) -> dict[str, int]:
        return {entry.item_id: k for k, entry in enumerate(self.entries)}

    @functools.cached_property
    def digest(self) -> str:
        """Hex digest of ids, texts, audio paths (relative to root), segments, speakers and
        languages, in item order: the value a mapped index keeps in its header
        (shared/index_build.py), the same for the same corpus."""
        from ringfeed.shared.entry_lines import digest_line, digest_tables

        h = hashlib.blake2b(digest_size=16)
        if self.synthetic_items:
            h.update(f"synthetic:{self.synthetic_items}".encode())
            return h.hexdigest()
        prefix = f"{self.root}/" if self.root else ""
        for e in self.entries:
            rel = e.audio_path.removeprefix(prefix)
            h.update(digest_line(e.item_id, e.text, rel, e.offset_s, e.duration_s).encode(
                "utf-8", "surrogatepass"))  # fmt: skip
        return digest_tables(h, *self.name_tables())

    def name_tables(self) -> tuple[tuple[str, ...], tuple[str, ...], np.ndarray, np.ndarray]:
        """(speaker names sorted, language codes sorted, each item's speaker and language
        as int32 ids into them)."""
        speakers = tuple(sorted({e.speaker for e in self.entries}))
        languages = tuple(sorted({e.language for e in self.entries}))
        s = {n: k for k, n in enumerate(speakers)}
        g = {n: k for k, n in enumerate(languages)}
        return (
            speakers,
            languages,
            np.fromiter((s[e.speaker] for e in self.entries), np.int32, len(self.entries)),
            np.fromiter((g[e.language] for e in self.entries), np.int32, len(self.entries)),
        )


SYNTHETIC_PREFIX = "synthetic-"


def synthetic_item_id(item: int) -> str:
    return f"{SYNTHETIC_PREFIX}{item:06d}"


def corpus_root(cfg: Config) -> str:
    """The folder audio paths are relative to: data.path for folders, else its metadata
    file's folder."""
    if cfg.data.format in FOLDER_FORMATS:
        return str(_data_path(cfg, None).absolute())
    return str(_metadata_path(cfg, None).parent.absolute())


def read_index_in_memory(cfg: Config) -> DatasetIndex:
    """The corpus read into memory (every line parsed, every file checked)."""
    entries, bad = read_dataset(cfg)
    return DatasetIndex(tuple(entries), tuple(bad), root=corpus_root(cfg))


def dataset_index(cfg: Config) -> DatasetIndex | MappedIndex:
    """The index of cfg.data, for the stager (plan, quarantine) and each producer: the
    mapped corpus index (shared/corpus_index.py), built first if missing or stale."""
    if cfg.data.format == "synthetic":
        return DatasetIndex(synthetic_items=cfg.data.synthetic_items)
    from ringfeed.shared.corpus_index import open_index

    return open_index(cfg)
