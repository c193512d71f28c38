"""Opening the corpus: the index that is current, mapped; built only by preparation.

Current or stale: the index file's header keeps the format's stamp of the corpus
(a metadata file's size and mtime; a hash of every folder's or shard's stamp),
and its file name hashes every setting that decides the items (path, format,
text column, language).

- :func:`open_prepared`: what the processes of a run call (the stager, producers):
  the current index, mapped, from the cache folder or its memory copy
  (shared/corpus/memory_copies.py); a missing or stale one is a ConfigError that says
  what to run. No process of a run builds it.
- :func:`open_corpus`: the index step of preparation (`ringfeed prepare`,
  `ringfeed index`; tools and tests): the current index, built first when it is
  missing or stale, by one process at a time (a lock file beside it), in a subprocess
  (``python -m ringfeed.shared.corpus.build``) unless asked otherwise, so no process
  keeps the build's memory. On a full disk the index is kept in memory, in /dev/shm,
  for every process of the host (memory_copies.py); where even that fails, or the
  cache folder cannot be written at all, this process reads the corpus in memory, with
  a warning naming the folder and the space left, where the format allows it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
from pathlib import Path

from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.config.environment import child_environment
from ringfeed.shared.corpus.build import DISK_FULL_EXIT, build, write_built
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry
from ringfeed.shared.corpus.format import CorpusFormat
from ringfeed.shared.corpus.index import BuiltIndex, CorpusIndex, MemoryStore, index_path
from ringfeed.shared.corpus.index_file import IndexFileError
from ringfeed.shared.corpus.memory_copies import places
from ringfeed.shared.corpus.registry import format_of
from ringfeed.shared.memory.disk import DiskFull, disk_error, is_full

log = logging.getLogger(__name__)


class NotPrepared(ConfigError):
    """The corpus has no current index (never prepared, or changed since): the message
    says what to run."""


def _ready(cfg: Config) -> tuple[CorpusFormat, Path, CorpusIndex | None]:
    """cfg.data's format (its settings checked), its index's path, and the index when
    there is one to use as it is: computed (synthetic), or current on disk."""
    fmt = format_of(cfg)
    fmt.check(cfg)
    computed = fmt.computed_index(cfg)
    if computed is not None:  # it has no file: no path is asked of it
        return fmt, Path(), computed
    path = index_path(cfg)
    return fmt, path, _current(cfg, fmt, path)


def open_prepared(cfg: Config) -> CorpusIndex:
    """cfg.data's index as preparation left it: computed (synthetic), or the current one
    mapped. NotPrepared when there is none (never prepared, or the corpus or a setting
    that decides its items changed since): nothing is built here."""
    fmt, path, index = _ready(cfg)
    if index is not None:
        return index
    stale = any(p.exists() for p in places(path))
    why = "changed since it was prepared" if stale else "not prepared"
    raise NotPrepared(
        f"data.path: the corpus {cfg.data.path} is {why} (no current index in "
        f"{path.parent}): run `ringfeed prepare CONFIG` first (`ringfeed run` "
        "and `ringfeed validate` do)"
    )


def open_corpus(cfg: Config, in_subprocess: bool = True) -> CorpusIndex:
    """cfg.data's index: computed (synthetic), mapped (built first if missing or stale:
    one builder at a time, in a subprocess unless in_subprocess is False), or read in
    memory when neither the cache folder nor /dev/shm can hold it. ConfigError for a
    setting the format cannot serve, CorpusError for a corpus that cannot be read."""
    fmt, path, index = _ready(cfg)
    if index is not None:
        return index
    fmt.stamp(cfg)  # a missing corpus is its own error, before any lock
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - held across the build
    except OSError as exc:
        return _in_memory_instead(cfg, fmt, path.parent, disk_error(exc, path.parent))
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait
        index = _current(cfg, fmt, path)
        if index is None:
            log.info("corpus index: building %s", path)
            try:
                if in_subprocess:
                    _build_in_subprocess(cfg, path)
                else:
                    write_built(cfg)
            except OSError as exc:
                if not is_full(exc):
                    raise
                return _in_memory_instead(cfg, fmt, path.parent, disk_error(exc, path.parent))
            index = _current(cfg, fmt, path)
    if index is None:
        raise CorpusError(f"{path}: the corpus changed while it was indexed: start again")
    return index


def build_in_memory(cfg: Config) -> BuiltIndex:
    """cfg.data's index built in this process and held in memory (nothing written)."""
    return BuiltIndex(MemoryStore(*build(cfg)))


def read_corpus(cfg: Config) -> tuple[list[Entry], list[BadLine]]:
    """The whole corpus in memory: (its entries whose audio file exists, in corpus order;
    its unusable lines and a line for each entry whose local audio file is missing, in
    file and line order).
    For tests and tools: a run maps the index instead (open_prepared)."""
    index = build_in_memory(cfg)
    entries, bad = [], list(index.bad_lines)
    for item, entry in enumerate(index.entries):
        remote = "://" in entry.audio_path
        if remote or os.path.isfile(entry.audio_path):
            entries.append(entry)
        else:
            file, line = index.source(item)
            bad.append(
                BadLine(file, line, f"audio file not found: {entry.audio_path}", entry.item_id)
            )
    return entries, sorted(bad, key=lambda b: (b.file, b.line))


def _current(cfg: Config, fmt: CorpusFormat, path: Path) -> BuiltIndex | None:
    """The current index at path's memory copy or at path (shared/corpus/memory_copies.py),
    or None."""
    try:
        stamp = fmt.stamp(cfg)
    except OSError:
        return None
    for place in places(path):
        try:
            index = BuiltIndex.mapped(place)
        except (OSError, IndexFileError, KeyError, ValueError):
            continue
        if index.store.header.get("source") == stamp:
            return index
    return None


def _in_memory_instead(cfg: Config, fmt: CorpusFormat, folder: Path, exc: OSError) -> BuiltIndex:
    if not fmt.in_memory_ok:
        raise CorpusError(
            f"features.cache_dir: cannot write the corpus index in {folder} "
            f"({exc}): free space there or point it at a writable folder"
        ) from None
    log.warning(
        "features.cache_dir: cannot keep the corpus index in %s (%s): this process "
        "reads the corpus in memory; free space there or point it at a writable "
        "folder",
        folder,
        exc,
    )
    return build_in_memory(cfg)


def _build_in_subprocess(cfg: Config, path: Path) -> None:
    """Build the index at path in a child; DiskFull when neither its disk nor /dev/shm
    can hold it (the child says so by its exit code), CorpusError for anything else."""
    argv = [sys.executable, "-m", "ringfeed.shared.corpus.build"]
    done = subprocess.run(
        argv, input=cfg.to_yaml(), text=True, check=False, env=child_environment()
    )
    if done.returncode == DISK_FULL_EXIT:
        raise DiskFull(path.parent)
    if done.returncode != 0:
        raise CorpusError(
            f"data.path: the corpus index could not be built (exit code "
            f"{done.returncode}; its log says why)"
        )
