"""What preparation writes when the disk under the cache folder is full: the same file,
kept in memory (/dev/shm/ringfeed-prepared-<uid>/<name>).

`ringfeed prepare` (producer/prepare/prepare.py) writes what a run reads about its
corpus beside the feature cache (features.cache_dir): the index with its id tables and
length table, the vocabulary, the prosody statistics. A write that finds that disk full
(ENOSPC, EDQUOT) says so in one line, naming the path and the space left
(shared/memory/disk.py), and writes the file here instead, under the same name: a
tmpfs, so the file lives in memory, and every process of the host maps or reads the
same copy (the index's pages are shared, not built again in each process). The readers
look here first (:func:`places`): a copy exists only while the disk was full, and the
next preparation that can write the disk removes it; so does `ringfeed cleanup`, and a
restart of the host. A /dev/shm too small for the file is a second such line, and the
file is then kept by no one: the run's processes say what to run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ringfeed.shared.memory.disk import disk_error, is_full
from ringfeed.shared.memory.shm import SHM_DIR

log = logging.getLogger(__name__)


def memory_folder() -> Path:
    """This user's folder of memory copies. Not named as a run's segments are
    (ringfeed-<uid>-...: shared/memory/segments.py removes those of dead runs)."""
    return SHM_DIR / f"ringfeed-prepared-{os.getuid()}"


def memory_copy(path: Path) -> Path:
    """Where the file at path is kept when its disk is full: its name, after a hash of
    its folder (two cache folders of one corpus keep two copies)."""
    path = Path(path)
    if path.parent == memory_folder():
        return path
    folder = hashlib.blake2b(str(path.parent.absolute()).encode(), digest_size=6).hexdigest()
    return memory_folder() / f"{folder}-{path.name}"


def places(path: Path) -> tuple[Path, Path]:
    """Where to look for a prepared file, in order: its memory copy, then path."""
    return memory_copy(path), Path(path)


def write_kept(path: Path, write: Callable[[Path], None]) -> Path:
    """write(path), which writes the file (atomically); on a full disk write(memory copy)
    instead, after one line that says so. Returns where the file is; a memory copy left
    by an earlier full disk is removed once path is written. Raises the full-disk error
    (shared/memory/disk.py DiskFull) when /dev/shm cannot hold it either."""
    try:
        write(Path(path))
    except OSError as exc:
        if not is_full(exc):
            raise
        there = memory_copy(path)
        log.warning(
            "%s; kept in memory instead (%s), where every process of this host "
            "reads it: free space there and run `ringfeed prepare CONFIG` again to "
            "keep it on disk",
            disk_error(exc, Path(path).parent),
            there,
        )
        try:
            for attempt in range(3):  # the folder, made, may go with another's last copy
                there.parent.mkdir(mode=0o700, exist_ok=True)
                try:
                    write(there)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
        except OSError as again:
            try:  # a folder made for this copy alone goes with it
                there.parent.rmdir()
            except OSError:
                pass
            if is_full(again):
                raise disk_error(again, there.parent) from None
            raise
        return there
    if Path(path) != memory_copy(path):
        memory_copy(path).unlink(missing_ok=True)
        try:  # the folder goes with its last copy: nothing of ringfeed's stays in /dev/shm
            memory_folder().rmdir()
        except OSError:  # absent, or other copies are still kept there
            pass
    return Path(path)


def remove_memory_copies() -> list[str]:
    """Every memory copy of this user's prepared files, removed (`ringfeed cleanup`)."""
    folder = memory_folder()
    names = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
    shutil.rmtree(folder, ignore_errors=True)
    return names
