"""What a corpus format is: the small face every format module implements.

A format knows where its corpus is (:meth:`CorpusFormat.locate`), how to tell
cheaply that it changed (:meth:`~CorpusFormat.stamp`), how to read all of it
once into the index builder (:meth:`~CorpusFormat.scan`) and how to turn the
lines the index kept back into entries (:meth:`~CorpusFormat.parse`). The
formats are registered by name in shared/corpus/registry.py; nothing outside the
registry and the format modules depends on which format a corpus is in.

Two kinds share most of their work, so each has a base class here:

- :class:`LineFormat`: every clip is one line of one metadata file (LJSpeech,
  csv, JSON lines). The index keeps each line's byte offset and length, and a
  producer parses only the lines of the items it is granted.
- :class:`StoredFormat`: the clips are found by scanning folders or tar shards
  (LibriTTS, VCTK, shards). The scan runs once, at the index build, and the
  index keeps each entry as a line of its own (shared/corpus/entry.py store).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry, stored
from ringfeed.shared.corpus.lines import decode_block, scan_lines

if TYPE_CHECKING:
    from ringfeed.shared.corpus.build import Builder
    from ringfeed.shared.corpus.index import CorpusIndex
    from ringfeed.shared.corpus.splits import Splits

# Where a corpus error sends the user for what each format expects.
FORMATS_DOC = "every format: docs/corpora.md#bring-your-own-data"


class Context(NamedTuple):
    """How the lines of one corpus are read back: the format's setting (scan decides it:
    LJSpeech's text column, csv's column count), the corpus root audio paths and ids are
    relative to, and the metadata file the lines are in ("" for lines the index keeps)."""

    setting: int
    root: str
    source: str


class CorpusFormat(Protocol):
    """The face of one format (module docstring). name is data.format's value."""

    name: str
    # False for a corpus with no audio files (synthetic): producers make its samples.
    has_audio: bool
    # The index may be built in memory in each process when it cannot be written.
    in_memory_ok: bool
    # On object storage, its clips are read by ranged reads (shared/corpus/members.py).
    ranged_reads: bool

    def check(self, cfg: Config) -> None:
        """ConfigError for a setting this format cannot serve (called at every open)."""
        ...

    def locate(self, cfg: Config) -> str:
        """Where the corpus is (its metadata file, its folder or its URL), checked:
        CorpusError naming data.path and what this format expects."""
        ...

    def root(self, cfg: Config) -> str:
        """The folder (or object-store prefix) that item audio paths are relative to."""
        ...

    def stamp(self, cfg: Config) -> Any:
        """What says the corpus changed, cheaply: one stat a file or folder, none a clip."""
        ...

    def scan(self, cfg: Config, builder: Builder) -> None:
        """Every item, in the corpus's own order, and every unusable line, into builder."""
        ...

    def parse(self, lines: list[bytes], context: Context) -> list[tuple | str]:
        """Lines as the index kept them -> Entry-shaped tuples (audio relative to the root)
        or the reason each is unusable."""
        ...

    def computed_index(self, cfg: Config) -> CorpusIndex | None:
        """An index that needs no build (synthetic items are computed), or None."""
        ...

    def splits(self, cfg: Config) -> Splits | None:
        """The splits its folder holds and the one read (shared/corpus/splits.py), or
        None for a format whose corpus has none to choose."""
        ...


def data_path(cfg: Config) -> Path:
    """data.path, relative to the working directory when it is relative."""
    return Path(cfg.data.path).absolute()


class BaseFormat:
    """What every format shares: the checks of the settings only some formats serve."""

    name: ClassVar[str] = ""
    has_audio: ClassVar[bool] = True
    # data.path may be an object-store URL (s3://, gs://, https://).
    remote: ClassVar[bool] = False
    # Its clips come in tar shards that data.shard_window can deal in windows.
    shards: ClassVar[bool] = False
    # Each process may build the index in memory when the cache folder cannot be written
    # (not where that means a scan of a whole store in every process).
    in_memory_ok: ClassVar[bool] = True
    # Its lines name audio files freely (absolute or relative), so data.root may say what
    # ids and paths count from.
    free_paths: ClassVar[bool] = False
    # Its files have named columns (data.columns says which holds what).
    columns: ClassVar[bool] = False
    # On object storage its clips are read by one ranged read each, not by copying the
    # file into the shard cache (shared/corpus/object_store.py).
    ranged_reads: ClassVar[bool] = False
    # Its corpus is a folder of files that may name splits (data.split chooses one).
    has_splits: ClassVar[bool] = False

    def check(self, cfg: Config) -> None:
        d = cfg.data
        if d.columns != type(d.columns)() and not self.columns:
            raise ConfigError(
                f"data.columns: only data.format: parquet has columns to name, "
                f"not {self.name}: remove it"
            )
        if d.shard_window and not self.shards:
            raise ConfigError(
                "data.shard_window: only tar shards have shards to deal: set "
                "data.format: shards, or 0 here"
            )
        if d.root and not self.free_paths:
            raise ConfigError(
                f"data.root: only data.format jsonl and csv name audio paths "
                f"that a root applies to, not {self.name}: remove it"
            )
        if d.split and not self.has_splits:
            raise ConfigError(
                f"data.split: only data.format parquet and shards read a folder "
                f"of splits, not {self.name}: remove it (a {self.name} corpus is "
                "the split data.path names)"
            )
        if "://" in d.path and not self.remote:
            raise ConfigError(
                f"data.path: {d.path!r} is an object-store URL: only data.format "
                "shards and parquet read one (pack the corpus into tar shards, "
                "or copy it to a local folder)"
            )

    def computed_index(self, cfg: Config) -> CorpusIndex | None:
        return None

    def splits(self, cfg: Config) -> Splits | None:
        return None


class LineFormat(BaseFormat):
    """A corpus of one metadata file, a clip a line (module docstring)."""

    # The metadata file inside data.path when data.path is a folder ("": data.path must be
    # the file itself), and what the error says data.path must be.
    file_name: ClassVar[str] = ""
    expects: ClassVar[str] = "the metadata file"
    # An unusable line that looks like JSON says to set data.format: jsonl (not in jsonl).
    json_hint: ClassVar[bool] = True

    def locate(self, cfg: Config) -> str:
        path = data_path(cfg)
        if path.is_dir() and self.file_name:
            path = path / self.file_name
        if not path.is_file():
            raise CorpusError(
                f"data.path: no metadata file at {path} (data.format: {self.name} "
                f"expects {self.expects}; {FORMATS_DOC})"
            )
        return str(path)

    def root(self, cfg: Config) -> str:
        """The metadata file's folder, or data.root for a format whose paths are free."""
        if cfg.data.root and self.free_paths:
            return str(Path(cfg.data.root).absolute())
        return str(Path(self.locate(cfg)).parent)

    def stamp(self, cfg: Config) -> Any:
        path = self.locate(cfg)
        st = os.stat(path)
        return [path, st.st_size, st.st_mtime_ns]

    def setting(self, cfg: Config, path: str, first: bytes | None) -> tuple[int, bool]:
        """(the setting parse needs, whether the first line is a header to skip)."""
        return cfg.data.text_column, False

    def rows(self, texts: list[str], context: Context) -> list[tuple | str]:
        """Decoded lines -> Entry-shaped tuples or reasons: the format's parser."""
        raise NotImplementedError

    def guess_id(self, raw: bytes) -> str:
        """The item id a bad line seems to name, for its quarantine entry ("" if none)."""
        first = raw.split(b"|", 1)[0]
        return first.decode("utf-8", errors="ignore").strip() if first.isascii() else ""

    def scan(self, cfg: Config, builder: Builder) -> None:
        scan_lines(self, cfg, builder, self.locate(cfg))

    def parse(self, lines: list[bytes], context: Context) -> list[tuple | str]:
        texts, bad = decode_block(lines)
        out = self.rows(texts, context)
        for k, reason in bad.items():
            out[k] = reason
        for k, row in enumerate(out if self.json_hint else []):  # JSON read as another format
            if row.__class__ is str and k not in bad and texts[k].lstrip().startswith("{"):
                out[k] = f"{row} (the line looks like JSON: set data.format: jsonl)"
        return out


class Scan(NamedTuple):
    """What a scanned corpus hands the index builder: its entries (audio relative to the
    root) in a stable order and its unusable lines; place(k): where a person finds entry
    k (file, 1-based line or row: a duplicate id names both places; asked only of
    duplicates, so nothing a row is kept for it); and the ids the rule before this one
    gave the entries (docs/corpora.md#item-ids: a checkpoint taken under them resumes),
    None where every id is what it was."""

    entries: list[Entry]
    bad: list[BadLine]
    place: Callable[[int], tuple[str, int]] | None = None
    before: list[str] | None = None


class StoredFormat(BaseFormat):
    """A corpus found by scanning (module docstring): the index keeps its entries, as
    lines it parses itself."""

    def parse(self, lines: list[bytes], context: Context) -> list[tuple | str]:
        return [stored(line.decode("utf-8")) for line in lines]

    def scan(self, cfg: Config, builder: Builder) -> None:
        builder.add_stored(self.read(cfg, self.root(cfg)))

    def read(self, cfg: Config, root: str) -> Scan:
        """The corpus under root, scanned (Scan)."""
        raise NotImplementedError
