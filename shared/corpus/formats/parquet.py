"""parquet: a corpus as Hugging Face ``datasets`` publishes it, Parquet files of row groups::

    data/train-00000-of-00004.parquet   audio: struct<bytes: binary, path: string>,
    data/train-00001-of-00004.parquet   text: string, speaker_id, language, ...

data.path is a folder (every ``*.parquet`` under it, in sorted path order, linked
folders followed) or one file. data.columns names the columns (defaults as datasets
names them: shared/config/data.py ColumnsConfig); a column the files lack is an
error that lists the columns they have. The audio column is datasets' Audio feature
with its bytes embedded, which datasets writes uncompressed and PLAIN-encoded: the
index keeps each clip's byte range in its file (shared/corpus/parquet_pages.py), and a
producer reads that range alone, as it reads a tar member (shared/corpus/members.py):
never the file, nor the row group. The build reads the small columns and a few bytes
a clip. A file whose audio column is compressed (an older writer) or has no
embedded bytes is one unusable line naming how to rewrite it; a row without audio
bytes or text is one unusable line. Item ids are the id column, else the audio's file
name without its extension (datasets keeps the name it was given), else
``<file>-<row>``; files count from data.path, so ids do not depend on where it lives.
The files are dealt as shards by data.shard_window.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.config.data import ColumnsConfig
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry
from ringfeed.shared.corpus.folders import walk
from ringfeed.shared.corpus.format import FORMATS_DOC, StoredFormat, data_path
from ringfeed.shared.corpus.parquet_pages import NotAddressable, value_ranges
from ringfeed.shared.language.codes import code_or_name

log = logging.getLogger(__name__)

SUFFIX = ".parquet"
# The optional columns' names when data.columns leaves them "" (datasets' usual names).
DEFAULT_NAMES = {"speaker": "speaker_id", "language": "language", "id": "id"}
REWRITE = ("rewrite it with the audio column uncompressed, as datasets >= 3 writes it "
           "(pyarrow.parquet.write_table(..., compression={'<audio>.bytes': 'none'}, "
           "use_dictionary=False))")  # fmt: skip


def files(cfg: Config) -> tuple[Path, list[Path]]:
    """(the folder ids count from, the Parquet files in sorted order)."""
    path = data_path(cfg)
    if path.is_file():
        return path.parent, [path]
    if not path.is_dir():
        raise CorpusError(f"data.path: no Parquet file or folder at {path} (data.format: parquet; "
                          f"{FORMATS_DOC})")  # fmt: skip
    found = [p for p in walk(path) if p.name.endswith(SUFFIX)]
    if not found:
        raise CorpusError(f"data.path: no *{SUFFIX} files under {path} (data.format: parquet)")
    return path, found


def columns_of(columns: ColumnsConfig, names: list[str], where: str) -> dict[str, str]:
    """{role: column} of one file; CorpusError naming the columns it has when a column
    data.columns names (or audio, text) is not there."""
    chosen = {"audio": columns.audio, "text": columns.text}
    for role, default in DEFAULT_NAMES.items():
        named = getattr(columns, role)
        if named or default in names:
            chosen[role] = named or default
    missing = [
        f"data.columns.{role}: {name!r}" for role, name in chosen.items() if name not in names
    ]
    if missing:
        raise CorpusError(f"{where}: no column {', '.join(missing)}; the file has "
                          f"{', '.join(names)}: name the right one in data.columns")  # fmt: skip
    return chosen


def _audio_leaf(pf: Any, audio: str, where: str) -> int:
    """The index of the audio bytes' leaf column in the file's schema."""
    schema = pf.schema
    for k in range(len(schema)):
        if schema.column(k).path in (f"{audio}.bytes", audio):
            return k
    raise CorpusError(f"{where}: the column data.columns.audio: {audio!r} holds no audio bytes "
                      "(expected datasets' Audio feature: a struct of bytes and path)")  # fmt: skip


def _strings(table: Any, name: str | None) -> list[Any]:
    if name is None:
        return []
    return table.column(name).to_pylist()


def read_file(path: Path, rel: str, columns: ColumnsConfig) -> tuple[list[Entry], list[BadLine]]:
    """The entries of one Parquet file (audio: rel, member: the clip's byte range) and
    its unusable rows; CorpusError when a column is not there."""
    import pyarrow.parquet as pq  # deferred: only a parquet corpus's build needs it

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    chosen = columns_of(columns, names, str(path))
    leaf = _audio_leaf(pf, chosen["audio"], str(path))
    column = pf.schema.column(leaf)
    if column.max_repetition_level:
        raise CorpusError(f"{path}: the audio column is a list: one clip a row is read")
    small = [chosen[r] for r in ("text", "speaker", "language", "id") if r in chosen]
    table = pf.read(columns=[*small, f"{chosen['audio']}.path"] if column.path.endswith(
        ".bytes") else small)  # fmt: skip
    texts = _strings(table, chosen["text"])
    speakers, languages = (
        _strings(table, chosen.get("speaker")),
        _strings(table, chosen.get("language")),
    )
    ids = _strings(table, chosen.get("id"))
    paths = table.column(chosen["audio"]).combine_chunks().field("path").to_pylist() if (
        column.path.endswith(".bytes")) else []  # fmt: skip
    try:
        ranges = _ranges(pf, path, leaf, column.max_definition_level)
    except NotAddressable as exc:
        return [], [BadLine(str(path), 1, f"its audio column cannot be read a clip at a "
                                           f"time ({exc}): {REWRITE}")]  # fmt: skip
    entries, bad = [], []
    for row, place in enumerate(ranges):
        item_id = _item_id(ids, paths, row, rel)
        fields = _row(texts[row], speakers[row] if speakers else "",
                      languages[row] if languages else "", place)  # fmt: skip
        if isinstance(fields, str):
            bad.append(BadLine(str(path), row + 1, fields, item_id))
        else:
            entries.append(Entry(item_id, rel, *fields, 0.0, 0.0, place))
    return entries, bad


def _ranges(pf: Any, path: Path, leaf: int, max_def: int) -> list[tuple[int, int] | None]:
    out: list[tuple[int, int] | None] = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for g in range(pf.metadata.num_row_groups):
            group = pf.metadata.row_group(g)
            chunk = group.column(leaf)
            if chunk.compression != "UNCOMPRESSED":
                raise NotAddressable(f"compressed with {chunk.compression}")
            if chunk.has_dictionary_page:
                raise NotAddressable("dictionary-encoded")
            out.extend(value_ranges(fd, chunk.data_page_offset, group.num_rows, max_def))
    finally:
        os.close(fd)
    return out


def _item_id(ids: list[Any], paths: list[Any], row: int, rel: str) -> str:
    if ids and ids[row] is not None and str(ids[row]).strip():
        return str(ids[row]).strip()
    name = os.path.basename(paths[row]) if paths and paths[row] else ""
    if name:
        return name.rpartition(".")[0] or name
    return f"{rel.removesuffix(SUFFIX)}-{row:06d}"


def _row(text: Any, speaker: Any, language: Any, place: Any) -> tuple[str, str, str] | str:
    """(text, speaker, language) of one row, or why it is unusable."""
    if place is None or not place[1]:
        return "no audio bytes in this row (datasets keeps only a path for audio it did not embed)"
    if not isinstance(text, str) or not text.strip():
        return "empty text"
    code = code_or_name(str(language)) if language else ""
    if language and not code:
        return f"language must be a code such as de or pt-br, got {language!r}"
    return text.strip(), "" if speaker is None else str(speaker).strip(), code


class Parquet(StoredFormat):
    name: ClassVar[str] = "parquet"
    shards: ClassVar[bool] = True
    columns: ClassVar[bool] = True

    def locate(self, cfg: Config) -> str:
        return str(files(cfg)[0])

    def root(self, cfg: Config) -> str:
        return self.locate(cfg)

    def stamp(self, cfg: Config) -> list:
        """Every file's path, size and mtime: one stat a file (a corpus has hundreds)."""
        root, found = files(cfg)
        return [str(root), *([p.relative_to(root).as_posix(), p.stat().st_size,
                              p.stat().st_mtime_ns] for p in found)]  # fmt: skip

    def scan(self, cfg: Config, builder: Any) -> None:
        """Every file's rows into builder, and each file's row count into its header (a
        file's items are consecutive: data.shard_window deals them)."""
        root, found = files(cfg)
        entries: list[Entry] = []
        bad: list[BadLine] = []
        counts = []
        for path in found:
            rel = path.relative_to(root).as_posix()
            got, unusable = read_file(path, rel, cfg.data.columns)
            entries += got
            bad += unusable
            counts.append([rel, len(got)])
            builder.progress(f"{rel}: {len(got)} rows")
        builder.add_stored(entries, bad)
        builder.header["shards"] = counts  # dropped by the builder if duplicates break them
