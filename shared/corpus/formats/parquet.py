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
bytes or text is one unusable line. The files are dealt as shards by
data.shard_window. A folder laid out as the Hub lays out splits is read a split at a
time (data.split, shared/corpus/splits.py).

Item ids (docs/corpora.md#item-ids) are ``<file>/<name>``: the file's path under
data.path without ``.parquet``, and the row's name in it: its id column, else the
audio's file name without its extension, whichever names every row of the file once,
else the row (``000003``). datasets embeds only an audio file's base name (``0001.wav``
of ``spk_b/0001.wav``), which repeats across shards; the file makes it unique by
construction, and ids do not depend on where data.path lives. The same row twice (the
same name, text, speaker, language and audio bytes) is used once
(shared/corpus/repeats.py).

data.path may be an object-store prefix (s3://bucket/dataset, shared/corpus/object_store.py):
the build reads footers, page headers and length prefixes by ranged reads, and a
producer reads each clip by one ranged read, with the store's retries; never a copy of
the file. Each file's rows are kept beside the feature cache under a hash of its name,
size and version (``parquet/<hash>.json``), so an index rebuilt after a file was added
reads that file only.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.config.data import ColumnsConfig
from ringfeed.shared.config.extras import MissingExtra, need_extra
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry
from ringfeed.shared.corpus.folders import walk
from ringfeed.shared.corpus.format import FORMATS_DOC, Scan, StoredFormat, data_path
from ringfeed.shared.corpus.object_store import StoreError, is_remote, list_shards, scan_remote
from ringfeed.shared.corpus.parquet_pages import NotAddressable, ReadAt, value_ranges
from ringfeed.shared.corpus.repeats import range_reader, repeats
from ringfeed.shared.corpus.splits import Splits, choose_split
from ringfeed.shared.language.codes import code_or_name

log = logging.getLogger(__name__)

SUFFIX = ".parquet"
# A corpus has a few languages and a million rows: each value's code found once.
_code = functools.lru_cache(maxsize=1024)(code_or_name)
# The cached rows of a file are read again when this changes (what a scan keeps).
ROWS_VERSION = 3
# The optional columns' names when data.columns leaves them "" (datasets' usual names).
DEFAULT_NAMES = {"speaker": "speaker_id", "language": "language", "id": "id"}
REWRITE = (
    "rewrite it with the audio column uncompressed, as datasets >= 3 writes it "
    "(pyarrow.parquet.write_table(..., compression={'<audio>.bytes': 'none'}, "
    "use_dictionary=False))"
)


def files(cfg: Config) -> tuple[str, list[tuple[str, int, str]]]:
    """(the folder or prefix ids count from, [(file relative to it, size, version)] in
    sorted order, of data.split's split): one stat (or one listing) a file, never a read."""
    root, found = every_file(cfg)
    return root, choose_split(found, cfg.data.split, root)[0]


def every_file(cfg: Config) -> tuple[str, list[tuple[str, int, str]]]:
    """files(), of every split."""
    if is_remote(cfg.data.path):
        return list_shards(cfg, SUFFIX, recursive=True)
    path = data_path(cfg)
    if path.is_file():
        st = path.stat()
        return str(path.parent), [(path.name, st.st_size, str(st.st_mtime_ns))]
    if not path.is_dir():
        raise CorpusError(
            f"data.path: no Parquet file or folder at {path} (data.format: parquet; {FORMATS_DOC})"
        )
    found = [p for p in walk(path) if p.name.endswith(SUFFIX)]
    if not found:
        raise CorpusError(f"data.path: no *{SUFFIX} files under {path} (data.format: parquet)")
    return str(path), [
        (p.relative_to(path).as_posix(), p.stat().st_size, str(p.stat().st_mtime_ns)) for p in found
    ]


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
        raise CorpusError(
            f"{where}: no column {', '.join(missing)}; the file has "
            f"{', '.join(names)}: name the right one in data.columns"
        )
    return chosen


def _audio_leaf(pf: Any, audio: str, where: str) -> int:
    """The index of the audio bytes' leaf column in the file's schema."""
    schema = pf.schema
    for k in range(len(schema)):
        if schema.column(k).path in (f"{audio}.bytes", audio):
            return k
    raise CorpusError(
        f"{where}: the column data.columns.audio: {audio!r} holds no audio bytes "
        "(expected datasets' Audio feature: a struct of bytes and path)"
    )


def _strings(table: Any, name: str | None) -> list[Any]:
    if name is None:
        return []
    return table.column(name).to_pylist()


def scan_file(source: Any, read_at: ReadAt, where: str, columns: ColumnsConfig) -> dict[str, Any]:
    """One Parquet file's rows: {"rows": [[row, id, name, text, speaker, language, offset,
    size]], "bad": [[row, reason, id, name]], "names_once": whether no two rows share an
    audio file name}, id the id column's ("" without one) and name the audio's file name
    without its extension (""); source: its path or an open file, read_at its bytes;
    CorpusError when a column is not there."""
    # Deferred: only a parquet corpus's build needs it, and it is an extra.
    why = "data.format: parquet reads a file's schema and row groups with pyarrow"
    try:
        pq = need_extra("pyarrow.parquet", "parquet", why)
    except MissingExtra as exc:
        raise CorpusError(str(exc)) from None

    pf = pq.ParquetFile(source)
    chosen = columns_of(columns, pf.schema_arrow.names, where)
    leaf = _audio_leaf(pf, chosen["audio"], where)
    column = pf.schema.column(leaf)
    if column.max_repetition_level:
        raise CorpusError(f"{where}: the audio column is a list: one clip a row is read")
    named = column.path.endswith(".bytes")  # a struct of bytes and path, or bytes alone
    small = [chosen[r] for r in ("text", "speaker", "language", "id") if r in chosen]
    table = pf.read(columns=[*small, f"{chosen['audio']}.path"] if named else small)
    texts, speakers, languages, ids = (
        _strings(table, chosen.get(r)) for r in ("text", "speaker", "language", "id")
    )
    paths = (
        table.column(chosen["audio"]).combine_chunks().field("path").to_pylist() if named else []
    )
    names = [_stem(p) for p in paths] or [""] * pf.metadata.num_rows
    given = [n for n in names if n]
    once = len(set(given)) == len(given)
    try:
        ranges = _ranges(pf, read_at, leaf, column.max_definition_level)
    except (NotAddressable, IndexError, KeyError, ValueError, struct.error) as exc:
        why = f"its audio column cannot be read a clip at a time ({exc}): {REWRITE}"
        return {"rows": [], "bad": [[0, why, "", ""]], "names_once": once}
    rows, bad = [], []
    for row, place in enumerate(ranges):
        declared = "" if not ids or ids[row] is None else str(ids[row]).strip()
        fields = _row(
            texts[row],
            speakers[row] if speakers else "",
            languages[row] if languages else "",
            place,
        )
        if isinstance(fields, str):
            bad.append([row, fields, declared, names[row]])
        else:
            rows.append([row, declared, names[row], *fields, *place])
    return {"rows": rows, "bad": bad, "names_once": once}


def _ranges(pf: Any, read_at: ReadAt, leaf: int, max_def: int) -> list[tuple[int, int] | None]:
    out: list[tuple[int, int] | None] = []
    for g in range(pf.metadata.num_row_groups):
        group = pf.metadata.row_group(g)
        chunk = group.column(leaf)
        if chunk.compression != "UNCOMPRESSED":
            raise NotAddressable(f"compressed with {chunk.compression}")
        if chunk.has_dictionary_page:
            raise NotAddressable("dictionary-encoded")
        out.extend(value_ranges(read_at, chunk.data_page_offset, group.num_rows, max_def))
    return out


def rows_of(cfg: Config, root: str, rel: str, size: int, stamp: str) -> dict[str, Any]:
    """One file's rows (scan_file), from its cache file or scanned (then cached)."""
    ident = json.dumps([ROWS_VERSION, root, rel, size, stamp, list(vars(cfg.data.columns).items())])
    digest = hashlib.blake2b(ident.encode(), digest_size=12).hexdigest()
    cache = Path(cfg.features.cache_dir) / "parquet" / f"{digest}.json"
    try:
        return json.loads(cache.read_text("utf-8"))
    except (OSError, ValueError):
        pass
    where = f"{root}/{rel}"
    if is_remote(root):
        found = _scan_remote(cfg, where)
    else:
        fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
        try:
            found = scan_file(where, lambda at, n: os.pread(fd, n, at), where, cfg.data.columns)
        finally:
            os.close(fd)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(found, ensure_ascii=False), "utf-8")
        os.replace(tmp, cache)
    except OSError as exc:  # a cache that cannot be written costs a scan next time only
        log.warning("parquet rows not cached (%s): %s", cache, exc)
    return found


def _scan_remote(cfg: Config, url: str) -> dict[str, Any]:
    """scan_file over ranged reads of the store, retried on a transient error; a file
    that lacks a column is the user's to fix, never retried."""

    def scan(f: Any) -> dict[str, Any] | CorpusError:
        try:
            return scan_file(f, _file_reader(f), url, cfg.data.columns)
        except CorpusError as exc:
            return exc

    try:
        found = scan_remote(cfg, url, scan)
    except StoreError as exc:
        raise CorpusError(str(exc)) from None
    if isinstance(found, CorpusError):
        raise found
    return found


def _file_reader(f: Any) -> Callable[[int, int], bytes]:
    def read_at(offset: int, n: int) -> bytes:
        f.seek(offset)
        return f.read(n)

    return read_at


def _stem(path: Any) -> str:
    """An audio file's name without its extension ("" for none): datasets keeps the base
    name a clip was given, which may be "audio.wav" for every clip of a corpus laid out
    a folder a clip."""
    base = os.path.basename(path) if path else ""
    return base.rpartition(".")[0] or base


def item_ids(rel: str, rows: list[list]) -> list[str]:
    """The ids of a file's rows as scan_file gives them (module docstring): its id
    column's, else its audio names, whichever names every one of these rows once, else
    the rows' numbers; each after the file's path without .parquet."""
    stem = rel.removesuffix(SUFFIX)
    for names in ([r[1] for r in rows], [r[2] for r in rows]):
        if all(names) and len(set(names)) == len(names):
            return [f"{stem}/{name}" for name in names]
    return [f"{stem}/{r[0]:06d}" for r in rows]


def ids_before(rel: str, found: dict[str, Any]) -> list[str]:
    """The ids a ringfeed before docs/corpora.md#item-ids gave a file's usable rows: the
    id column's, else the audio name where no two rows of the file share one, else
    <file>-<row>; never unique across files."""
    stem = rel.removesuffix(SUFFIX)
    once = found["names_once"]
    return [
        declared or (name if once else "") or f"{stem}-{row:06d}"
        for row, declared, name, *_ in found["rows"]
    ]


def _row(text: Any, speaker: Any, language: Any, place: Any) -> tuple[str, str, str] | str:
    """(text, speaker, language) of one row, or why it is unusable."""
    if place is None or not place[1]:
        return "no audio bytes in this row (datasets keeps only a path for audio it did not embed)"
    if not isinstance(text, str) or not text.strip():
        return "empty text"
    code = _code(str(language)) if language else ""
    if language and not code:
        return f"language must be a code such as de or pt-br, got {language!r}"
    return text.strip(), "" if speaker is None else str(speaker).strip(), code


class Parquet(StoredFormat):
    name: ClassVar[str] = "parquet"
    shards: ClassVar[bool] = True
    columns: ClassVar[bool] = True
    remote: ClassVar[bool] = True
    ranged_reads: ClassVar[bool] = True
    has_splits: ClassVar[bool] = True
    # Every process building it in memory would scan a whole store.
    in_memory_ok: ClassVar[bool] = False

    def locate(self, cfg: Config) -> str:
        return files(cfg)[0]

    def root(self, cfg: Config) -> str:
        return self.locate(cfg)

    def stamp(self, cfg: Config) -> list:
        """Every file's name, size and version: one stat (or one listing) a file."""
        root, found = files(cfg)
        return [root, [list(f) for f in found]]  # as the index header keeps it: JSON lists

    def splits(self, cfg: Config) -> Splits:
        root, found = every_file(cfg)
        return choose_split(found, cfg.data.split, root)[1]

    def scan(self, cfg: Config, builder: Any) -> None:
        """Every file's rows into builder, and each file's row count into its header (a
        file's items are consecutive: data.shard_window deals them)."""
        root, found = files(cfg)
        got = []
        for rel, size, stamp in found:
            got.append((rel, rows_of(cfg, root, rel, size, stamp)))
            builder.progress(f"{rel}: {len(got[-1][1]['rows'])} rows")
        usable = [r for _, g in got for r in g["rows"]]  # every file's, in file order
        file_of = np.repeat(np.arange(len(got)), [len(g["rows"]) for _, g in got])
        read = range_reader(cfg, root)
        twice = repeats(
            np.fromiter((hash(_same(r)) for r in usable), np.int64, len(usable)),
            lambda k: _same(usable[k]),
            lambda k: read(got[file_of[k]][0], *usable[k][6:8]),
        )
        scan, places, counts, ids = Scan([], [], None, []), _Places(root), [], {}
        k = 0  # the file's first row in usable
        for rel, g in got:
            rows, old, kept = g["rows"], ids_before(rel, g), range(len(g["rows"]))
            if twice:
                kept = [j for j in kept if k + j not in twice]
                rows, old = [rows[j] for j in kept], [old[j] for j in kept]
            made = item_ids(rel, rows)
            ids |= {k + j: i for j, i in zip(kept, made, strict=True)} if twice else {}
            places.add(rel, len(scan.entries), rows)
            scan.entries.extend(
                Entry(i, rel, r[3], r[4], r[5], 0.0, 0.0, (r[6], r[7]))
                for i, r in zip(made, rows, strict=True)
            )
            scan.before.extend(old)
            stem = rel.removesuffix(SUFFIX)
            scan.bad.extend(
                BadLine(f"{root}/{rel}", row + 1, why, f"{stem}/{declared or name or f'{row:06d}'}")
                for row, why, declared, name in g["bad"]
            )
            counts.append([rel, len(rows)])
            k += len(g["rows"])
        for k, first in twice.items():  # the same row twice: both places
            rel, first_rel = got[file_of[k]][0], got[file_of[first]][0]
            why = (
                f"duplicate row: the same as {root}/{first_rel}:{usable[first][0] + 1} (its "
                "name, text, speaker, language and audio bytes): used once"
            )
            scan.bad.append(BadLine(f"{root}/{rel}", usable[k][0] + 1, why, ids[first]))
        builder.add_stored(scan._replace(place=places))
        builder.header["shards"] = counts  # dropped by the builder if duplicates break them


class _Places:
    """Where a person finds each item (Scan.place): its file and row, kept as a file's
    first item and its rows' numbers (not the rows: they go once scanned)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.files: list[str] = []
        self.starts: list[int] = []
        self.rows: list[np.ndarray] = []

    def add(self, rel: str, first: int, rows: list[list]) -> None:
        self.files.append(rel)
        self.starts.append(first)
        self.rows.append(np.fromiter((r[0] for r in rows), np.int64, len(rows)))

    def __call__(self, item: int) -> tuple[str, int]:
        n = bisect.bisect_right(self.starts, item) - 1
        return f"{self.root}/{self.files[n]}", int(self.rows[n][item - self.starts[n]]) + 1


def _same(row: list) -> tuple:
    """What makes two rows the same row (shared/corpus/repeats.py): id, name, text,
    speaker, language and audio size; then their audio bytes."""
    return row[1], row[2], row[3], row[4], row[5], row[7]
