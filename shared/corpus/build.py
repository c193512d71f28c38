"""Builds the corpus index (shared/corpus/index.py) once: `ringfeed index CONFIG`.

One pass over the corpus through its format (shared/corpus/registry.py): a
format of lines streams its metadata file in blocks (shared/corpus/lines.py),
so the build's memory is its arrays (~40 bytes an item), not the corpus as
Python objects; a format found by scanning hands over its entries, which the
index keeps as lines of its own. Per item the builder keeps the line's byte
offset and length, a 64-bit hash of the item id (duplicates, lookups by id), the
speaker and language as ids of tables sorted by name, and it hashes ids, texts
and relative audio paths into the corpus digest. Nothing is statted: a missing
audio file is found when a producer reads it (quarantined with "audio file not
found"), or by `ringfeed validate`.

Run by the index step of preparation (producer/prepare/prepare.py, through
shared/corpus/open.py open_corpus) in a subprocess, so the preparing process keeps none
of its memory: ``python -m ringfeed.shared.corpus.build`` with the config YAML on stdin.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import sys
import time
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.shared.config import Config, config_from_yaml
from ringfeed.shared.corpus.block import Block, summarize
from ringfeed.shared.corpus.entry import (
    BadLine,
    CorpusError,
    Entry,
    digest_line,
    digest_tables,
    store,
)
from ringfeed.shared.corpus.format import Context, CorpusFormat, Scan, StoredFormat
from ringfeed.shared.corpus.index import (
    INDEX_VERSION,
    BuiltIndex,
    MemoryStore,
    index_key,
    index_path,
)
from ringfeed.shared.corpus.index_file import IndexFileError, write_index
from ringfeed.shared.corpus.lengths import NOT_MEASURED
from ringfeed.shared.corpus.lines import BLOCK_BYTES
from ringfeed.shared.corpus.memory_copies import places, write_kept
from ringfeed.shared.corpus.registry import format_of
from ringfeed.shared.language.codes import language_code
from ringfeed.shared.memory.disk import disk_error, is_full

log = logging.getLogger(__name__)

DETECT_BATCH = 50_000
DIGEST_BYTES = 16
# The build's exit code when neither the index's disk nor /dev/shm can hold it: the parent
# reads the corpus in memory.
DISK_FULL_EXIT = 3


class Builder:
    """Accumulates items in corpus order (a format's scan feeds it); finish() gives the
    header and arrays of the index."""

    def __init__(
        self,
        cfg: Config,
        fmt: CorpusFormat,
        root: str,
        workers: int = 1,
        block_bytes: int = BLOCK_BYTES,
    ) -> None:
        self.cfg, self.format, self.root = cfg, fmt, root
        self.auto = cfg.data.language == "auto"
        self.default_language = "" if self.auto else language_code(cfg.data.language)
        # array.array: 8 bytes an item, where lists of ints cost ~36 (10**7 items: 1.4 GB)
        self.offset, self.length, self.line = array("Q"), array("Q"), array("Q")
        self.id_hash, self.speaker, self.language = array("Q"), array("q"), array("q")
        self.speakers: dict[str, int] = {}
        self.languages: dict[str, int] = {}
        self.bad: list[BadLine] = []
        self.pending: list[tuple[int, str]] = []  # (item, text) awaiting detection
        self.digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
        # The plan fingerprint's index part (shared/run/fingerprint.py).
        self.plan = hashlib.blake2b(digest_size=8)
        # What the format adds to the header (the shards' item counts).
        self.header: dict[str, Any] = {"lines_file": "", "setting": 0}
        self._blob: list[bytes] | None = None  # a scanned corpus's stored lines
        # Where a scanned corpus's entries are, and the ids an earlier rule gave them.
        self._where: Callable[[int], tuple[str, int]] | None = None
        self._before: list[str] | None = None
        self._plan_before_all = ""
        # Clips whose audio lies outside the root ('../...'): ids that depend on the mount.
        self.outside, self.outside_example = 0, ""
        self.lines_before = 0  # lines of the blocks merged so far (numbers count on)
        # How the lines are read: processes (1: this one; 0: one per core where the file
        # is large enough) and bytes a block (shared/corpus/lines.py).
        self.workers, self.block_bytes = workers, block_bytes

    def progress(self, what: str) -> None:
        log.info("corpus index: %s", what)

    def start_lines(self, path: str, setting: int) -> None:
        """The items are lines of `path`, parsed with `setting`."""
        self.header.update(lines_file=path, setting=setting)

    def merge(self, block: Block) -> None:
        """A block's items after every item before them (shared/corpus/block.py): the
        same index whichever process summed the block up."""
        first, lines_file = len(self.offset), self.header["lines_file"]
        self.bad.extend(
            BadLine(lines_file, self.lines_before + n, reason, item_id)
            for n, reason, item_id in block.bad
        )
        if block.outside:
            self.outside += block.outside
            self.outside_example = self.outside_example or block.outside_example
        self.offset.frombytes(block.offsets.tobytes())
        self.length.frombytes(block.lengths.tobytes())
        self.line.frombytes((block.numbers + np.uint64(self.lines_before)).tobytes())
        self.lines_before += block.lines
        self.id_hash.frombytes(block.id_hash.tobytes())
        speakers, languages = self.speakers, self.languages
        ids = [speakers.setdefault(name, len(speakers)) for name in block.speakers]
        self.speaker.frombytes(np.array(ids, np.int64)[block.speaker].tobytes())
        ids = [languages.setdefault(code, len(languages)) for code in block.languages] + [-1]
        self.language.frombytes(np.array(ids, np.int64)[block.language].tobytes())  # -1 stays
        self.pending.extend((first + k, text) for k, text in block.pending)
        self.digest.update(block.digest)
        self.plan.update(block.plan)
        if len(self.pending) >= DETECT_BATCH:
            self._detect()

    def add_stored(self, scan: Scan) -> None:
        """A scanned corpus: its entries (audio relative to the root) become lines the
        index keeps, and its unusable files bad lines."""
        entries = scan.entries
        self.bad.extend(scan.bad)
        self._where, self._before = scan.place, scan.before
        if scan.before is not None:  # the plan hash under the earlier ids, in one pass
            audio = [e[1] for e in entries]
            self._plan_before_all = _plan_hash(zip(scan.before, audio, strict=True))
        self._blob = [store(e) for e in entries]
        lengths = [len(raw) for raw in self._blob]
        offsets = list(itertools.accumulate(lengths, initial=0))[:-1]
        numbers = list(range(1, len(entries) + 1))
        self.merge(summarize(offsets, lengths, numbers, entries, self.default_language))

    def _detect(self) -> None:
        if not self.pending:
            return
        from ringfeed.shared.language.detect import detect_languages  # loads its model

        d, f = self.cfg.data, self.cfg.features
        candidates = [language_code(c) for c in d.detect_languages]
        codes = detect_languages(
            [t for _, t in self.pending], candidates, f.cache_dir if f.cache else None
        )
        for (item, _), code in zip(self.pending, codes, strict=True):
            self.language[item] = self.languages.setdefault(code, len(self.languages))
        self.pending.clear()

    def _raw(self, item: int) -> bytes:
        if self._blob is not None:
            return self._blob[item]
        with open(self.header["lines_file"], "rb") as f:
            f.seek(self.offset[item])
            return f.read(self.length[item])

    def context(self) -> Context:
        """How its lines are read back (by its own duplicate check, and by the index)."""
        return Context(self.header["setting"], self.root, self.header["lines_file"])

    def _reparse(self, item: int) -> tuple:
        return self.format.parse([self._raw(item)], self.context())[0]

    def finish(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        self._detect()
        arrays = {
            "offset": np.frombuffer(self.offset, np.uint64),
            "length": np.frombuffer(self.length, np.uint64).astype(np.uint32),
            "line": np.frombuffer(self.line, np.uint64),
            "id_hash": np.frombuffer(self.id_hash, np.uint64),
            "speaker": _sorted_ids(self.speakers, self.speaker),
            "language": _sorted_ids(self.languages, self.language),
        }
        order = np.argsort(arrays["id_hash"], kind="stable")  # 3 s at 10**7 items here: once
        keep = self._duplicates(arrays, order)
        before = self._plan_before(keep)
        if keep is not None:  # duplicates drop out: the digests are taken again
            arrays = {k: a[keep] for k, a in arrays.items()}
            order = np.argsort(arrays["id_hash"], kind="stable")
            if self.header.pop("shards", None) is not None:
                log.warning(
                    "corpus index: duplicate ids across shards; data.shard_window cannot be used"
                )
        self._warn_outside()
        header = {
            **self.header,
            "outside_root": self.outside,
            "format": self.format.name,
            "root": self.root,
            "n_items": len(arrays["offset"]),
            "speakers": sorted(self.speakers),
            "languages": sorted(self.languages),
            "bad_lines": [[b.file, b.line, b.reason, b.item_id] for b in self.bad],
            "digest": digest_tables(
                self.digest,
                sorted(self.speakers),
                sorted(self.languages),
                arrays["speaker"],
                arrays["language"],
            ),
            "plan_hash": self.plan.hexdigest(),
        }
        if before:
            header["plan_hash_before"] = before
        small = np.uint32 if len(order) < 2**32 else np.uint64
        arrays["id_order"] = order.astype(small)
        arrays["id_hash"] = arrays["id_hash"][order]
        arrays["frames"] = np.full(len(order), NOT_MEASURED, np.int32)
        arrays["text"] = np.zeros(len(order), np.int32)
        arrays["line"] = arrays["line"].astype(small)  # where a person finds the item
        if self._blob is not None:
            arrays["lines"] = np.frombuffer(b"".join(self._blob), np.uint8)
        return header, arrays

    def _warn_outside(self) -> None:
        if self.outside:
            log.warning(
                "corpus index: %d clips lie outside the corpus root %s (e.g. %s): their ids "
                "and the corpus digest change where the corpus is mounted elsewhere; set "
                "data.root to a folder that holds every clip",
                self.outside,
                self.root,
                self.outside_example,
            )

    def _plan_before(self, keep: np.ndarray | None) -> str:
        """The plan hash of the items kept under the ids the format's earlier rule gave
        them ("" where the ids are what they were): a cursor saved under those ids names
        the same plan, so its run resumes (shared/run/fingerprint.py plan_changes)."""
        if self._before is None or self._blob is None:
            return ""
        if keep is None:
            return self._plan_before_all
        before = self._before  # duplicate ids dropped (rare): the items kept, parsed again
        return _plan_hash((before[k], self._reparse(int(k))[1]) for k in np.flatnonzero(keep))

    def _place(self, arrays: dict[str, np.ndarray], item: int) -> tuple[str, int]:
        """(file, 1-based line or row) where a person finds the item."""
        if self._where is not None:
            return self._where(item)
        return self.header["lines_file"] or self.root, int(arrays["line"][item])

    def _duplicates(self, arrays: dict[str, np.ndarray], order: np.ndarray) -> np.ndarray | None:
        """None when every id is unique, else the mask of items to keep (the first of each
        id, in corpus order); the others become bad lines naming both places."""
        hashes = arrays["id_hash"]  # order: their stable argsort
        ranked = hashes[order]
        same = np.flatnonzero(ranked[1:] == ranked[:-1])
        if not len(same):
            return None
        groups: dict[int, set[int]] = {}
        for k in same:  # equal hashes: compare the ids themselves (64-bit collisions are rare)
            groups.setdefault(int(hashes[order[k]]), set()).update(
                (int(order[k]), int(order[k + 1]))
            )
        keep = np.ones(len(hashes), bool)
        for group in groups.values():
            seen: dict[str, int] = {}
            for item in sorted(group):  # corpus order: the first of an id is kept
                item_id = self._reparse(item)[0]
                if item_id in seen:
                    keep[item] = False
                    (file, line), (first_file, first) = (
                        self._place(arrays, k) for k in (item, seen[item_id])
                    )
                    at = f"on line {first}" if first_file == file else f"at {first_file}:{first}"
                    reason = f"duplicate item id {item_id!r} (first {at})"
                    self.bad.append(BadLine(file, line, reason, item_id))
                else:
                    seen[item_id] = item
        if keep.all():
            return None
        self._redigest(keep)
        return keep

    def _redigest(self, keep: np.ndarray) -> None:
        """The digests over the items kept (rare: a corpus with duplicate ids)."""
        self.digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
        self.plan = hashlib.blake2b(digest_size=8)
        for item in np.flatnonzero(keep):
            f = self._reparse(int(item))
            line = digest_line(f[0], f[2], f[1], f[5], f[6])
            self.digest.update(line.encode("utf-8", "surrogatepass"))
            self.plan.update(f"{f[0]}|{f[1]}\n".encode("utf-8", "surrogatepass"))


def _plan_hash(items: Iterable[tuple[str, str]]) -> str:
    """The plan hash (shared/corpus/block.py summarize's) of (id, audio path) pairs."""
    plan = hashlib.blake2b(digest_size=8)
    plan.update("".join([f"{i}|{a}\n" for i, a in items]).encode("utf-8", "surrogatepass"))
    return plan.hexdigest()


def _sorted_ids(table: dict[str, int], ids: array) -> np.ndarray:
    """Ids in first-seen order -> ids of the table sorted by name (the same corpus gives
    the same ids whatever its order)."""
    remap = np.zeros(max(len(table), 1), np.int32)
    for rank, name in enumerate(sorted(table)):
        remap[table[name]] = rank
    return remap[np.frombuffer(ids, np.int64)] if len(ids) else np.zeros(0, np.int32)


def build(
    cfg: Config,
    workers: int = 1,
    block_bytes: int = BLOCK_BYTES,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header and arrays of cfg.data's index (not yet written); workers and
    block_bytes: how a metadata file's lines are read (Builder), the same index
    whatever they are. A pool (workers != 1) is started by spawn, which imports the
    caller's main module again: only from an entry with a main guard (write_built's)."""
    t0 = time.monotonic()
    fmt = format_of(cfg)
    builder = Builder(cfg, fmt, fmt.root(cfg), workers, block_bytes)
    fmt.scan(cfg, builder)
    header, arrays = builder.finish()
    header.update(version=INDEX_VERSION, build_s=round(time.monotonic() - t0, 3))
    return header, arrays


def build_entries(cfg: Config, entries: list[Entry], bad: list[BadLine] = ()) -> BuiltIndex:
    """An index held in memory of these entries (audio paths as they are), made as the
    builder makes a scanned corpus's: for tests and tools that make a corpus up."""
    fmt = StoredFormat()
    builder = Builder(cfg, fmt, "")
    builder.add_stored(Scan(list(entries), list(bad)))
    header, arrays = builder.finish()
    header.update(version=INDEX_VERSION)
    return BuiltIndex(MemoryStore(header, arrays), fmt)


def write_built(cfg: Config) -> Path:
    """Build cfg.data's index, by a process per core where its metadata file is large,
    and write it (lengths measured before are kept for the items whose id they were
    measured for); returns where it is: beside the feature cache, or in memory when that
    disk is full (shared/corpus/memory_copies.py). Called by the build's entry (main) and
    by the index step of preparation."""
    stamp = format_of(cfg).stamp(cfg)
    header, arrays = build(cfg, workers=0)
    path = index_path(cfg)
    old = _old(path)
    _keep_lengths(old, arrays)
    header.update(
        source=stamp,
        key=index_key(cfg),
        home=str(path),
        lengths_key=old.store.header.get("lengths_key", "") if old else "",
    )
    where = write_kept(path, lambda there: write_index(there, header, arrays))
    log.info(
        "corpus index: %d items, %d unusable lines, %.1f s -> %s",
        header["n_items"],
        len(header["bad_lines"]),
        header["build_s"],
        where,
    )
    return where


def _old(path: Path) -> BuiltIndex | None:
    """The index written last for these settings (its memory copy first), whatever
    corpus it was built from: the lengths it holds are kept by id."""
    for place in places(path):
        try:
            return BuiltIndex.mapped(place)
        except (OSError, IndexFileError, KeyError, ValueError):
            continue
    return None


def _keep_lengths(old: BuiltIndex | None, arrays: dict[str, np.ndarray]) -> None:
    """Lengths of the old index's items, by id hash, into the new arrays (a line appended
    to the metadata costs one item's measuring, not the corpus's)."""
    if old is None or not old.store.header.get("lengths_key") or not old.n_items:
        return
    old_hash, old_order = old.store.array("id_hash"), old.store.array("id_order")
    new_hash = arrays["id_hash"]
    at = np.minimum(np.searchsorted(old_hash, new_hash), len(old_hash) - 1)
    found = old_hash[at] == new_hash
    old_items = old_order[at[found]].astype(np.int64)
    new_items = arrays["id_order"][found].astype(np.int64)
    arrays["frames"][new_items] = old.store.array("frames")[old_items]
    arrays["text"][new_items] = old.store.array("text")[old_items]


def main() -> int:
    """``python -m ringfeed.shared.corpus.build`` < config YAML: build and write the index."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = config_from_yaml(sys.stdin.read())
    try:
        write_built(cfg)
    except CorpusError as exc:
        log.error("%s", exc)
        return 2
    except OSError as exc:  # a full disk, a folder that cannot be written: say which
        exc = disk_error(exc, index_path(cfg).parent)
        log.error("data.path: the corpus index could not be written (%s)", exc)
        return DISK_FULL_EXIT if is_full(exc) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
