"""What the formats read from folders share: a sorted walk, a cheap stamp, text files.

Never the file system's listing order (folders are walked sorted), so every host
reads the same corpus in the same order; linked folders are followed (corpora are
often assembled from linked subsets), each real folder once.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry, relative
from ringfeed.shared.corpus.format import Scan, StoredFormat, data_path

log = logging.getLogger(__name__)


def walk(root: Path) -> list[Path]:
    """Every file under root, in sorted order. A link back up the tree, or a second link
    to a subset, is read no more."""
    found = []
    seen = {os.path.realpath(root)}
    for folder, dirs, files in os.walk(root, followlinks=True):
        kept = []
        for name in sorted(dirs):
            real = os.path.realpath(os.path.join(folder, name))
            if real in seen:
                log.warning(
                    "%s: a link to a folder already read (%s), not read again",
                    os.path.join(folder, name),
                    real,
                )
                continue
            seen.add(real)
            kept.append(name)
        dirs[:] = kept
        found.extend(Path(folder) / name for name in sorted(files))
    return found


def tree_stamp(root: Path) -> str:
    """A hash of (path, mtime_ns) of every folder under root (links followed, each real
    folder once) and of every file directly in root: adding or removing a clip changes
    its folder's mtime. One stat a folder, never one a clip."""
    h = hashlib.blake2b(digest_size=16)
    seen = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        h.update(f"{folder}|{os.stat(folder).st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        if folder == str(root):
            for name in sorted(files):
                st = os.stat(os.path.join(folder, name))
                h.update(
                    f"{name}|{st.st_size}|{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape")
                )
    return h.hexdigest()


def warn_layout(mismatched: list[Path], expected: str) -> None:
    if mismatched:
        log.warning(
            "%d files are not laid out as %s, e.g. %s: check data.path and data.format",
            len(mismatched),
            expected,
            mismatched[0],
        )


def text_entry(txt: Path, audio: Path, item_id: str, speaker: str, root: str) -> Entry | BadLine:
    """The entry of a clip whose text is the file txt (audio relative to root), or why
    not."""
    try:
        str(audio).encode("utf-8")  # names the id, the speaker and the audio path
    except UnicodeEncodeError:
        name = str(txt).encode("utf-8", "replace").decode()
        return BadLine(name, 1, "file or folder name is not valid UTF-8: rename it")
    try:
        text = txt.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        return BadLine(str(txt), 1, "not valid UTF-8", item_id)
    if not text:
        return BadLine(str(txt), 1, "empty text", item_id)
    return Entry(item_id, relative(root, str(audio)), text, speaker)


def scanned(results: list[tuple[Entry | BadLine, Path, str]]) -> Scan:
    """The Scan of a folder corpus: results are (the clip or why not, its text file, the
    id the rule before this one gave it)."""
    entries = [(r, txt, old) for r, txt, old in results if isinstance(r, Entry)]
    before = [old for _, _, old in entries]
    changed = any(e.item_id != old for e, _, old in entries)
    return Scan(
        [e for e, _, _ in entries],
        [r for r, _, _ in results if isinstance(r, BadLine)],
        lambda k: (str(entries[k][1]), 1),
        before if changed else None,
    )


class FolderFormat(StoredFormat):
    """A corpus that is a folder of clips with their texts beside them."""

    layout: ClassVar[str] = ""  # what the folder must hold, for the error

    def locate(self, cfg: Config) -> str:
        root = data_path(cfg)
        if not root.is_dir():
            raise CorpusError(
                f"data.path: {root} is not a folder (data.format: {self.name}{self.layout})"
            )
        return str(root)

    def root(self, cfg: Config) -> str:
        return self.locate(cfg)

    def stamp(self, cfg: Config) -> list:
        return ["tree", tree_stamp(Path(self.locate(cfg)))]
