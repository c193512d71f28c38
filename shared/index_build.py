"""Builds the corpus index (shared/corpus_index.py) once: `ringfeed index CONFIG`.

One pass over the corpus's lines (shared/entry_lines.py), streamed in blocks, so
the build's memory is its arrays (~40 bytes an item), not the corpus as Python
objects. Per usable line it keeps the line's byte offset and length, a 64-bit hash
of the item id (duplicates and lookups by id), the speaker and language as ids of
tables sorted by name, and it hashes ids, texts and audio paths into the dataset
digest. Nothing is statted: a missing audio file is found when a producer reads it
(quarantined with "audio file not found"), or by `ringfeed manifest`.

Folder layouts (LibriTTS, VCTK) are read by shared/corpora.py as before, once, and
their entries stored as lines inside the index; tar shards by shared/shards.py.

Run by the stager in a subprocess (its memory stays the run's) when the index is
missing or stale: ``python -m ringfeed.shared.index_build`` with the config YAML on stdin.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
import yaml

from ringfeed.shared import entry_lines
from ringfeed.shared.config import Config, config_from_dict
from ringfeed.shared.dataset import (
    FOLDER_FORMATS,
    BadLine,
    DatasetError,
    _csv_columns,
    _data_path,
    _metadata_path,
)
from ringfeed.shared.language_codes import language_code
from ringfeed.shared.manifest import NOT_MEASURED

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 23
DETECT_BATCH = 50_000
PROGRESS_S = 2.0
DIGEST_BYTES = 16


def read_blocks(path: Path) -> Iterator[tuple[list[int], list[int], list[bytes]]]:
    """Per block of the file: (1-based line numbers, byte offsets, lines without CR/LF) of
    its non-blank lines; a UTF-8 BOM at the start is skipped."""
    number, base, carry = 0, 0, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK_BYTES)
            data = carry + block
            if not block:
                if data:
                    yield _lines(data, base, number)
                return
            cut = data.rfind(b"\n") + 1
            yield _lines(data[:cut], base, number)
            number += data.count(b"\n", 0, cut)
            base, carry = base + cut, data[cut:]


# A blank or whitespace-only line anywhere in a block (searched in C, not line by line).
_BLANK = re.compile(rb"(?:^|\n)[ \t\r\f\v]*(?:\n|$)")


def _lines(data: bytes, base: int, number: int) -> tuple[list[int], list[int], list[bytes]]:
    skip = 3 if base == 0 and data.startswith(b"\xef\xbb\xbf") else 0
    parts = data[skip:].split(b"\n")
    end = len(data)
    if data.endswith(b"\n"):
        parts.pop()  # the empty piece after the block's last newline
        end -= 1
    offsets = list(itertools.accumulate([len(p) + 1 for p in parts], initial=base + skip))[:-1]
    numbers = list(range(number + 1, number + 1 + len(parts)))
    if b"\r" in data:
        parts = [p.rstrip(b"\r") for p in parts]
    if _BLANK.search(data, skip, end) or (skip and data[skip : skip + 1] == b"\n"):
        keep = [k for k, p in enumerate(parts) if p.strip()]
        numbers, offsets, parts = ([x[k] for k in keep] for x in (numbers, offsets, parts))
    return numbers, offsets, parts


class Builder:
    """Accumulates items in line order; finish() gives the header and arrays."""

    def __init__(self, cfg: Config, root: str) -> None:
        self.cfg, self.root = cfg, root
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
        self.plan = hashlib.blake2b(digest_size=8)  # shared/fingerprint.py index_hash
        self._chunks: list[str] = []
        self._plan_chunks: list[str] = []

    def add(self, offsets: list[int], lengths: list[int], numbers: list[int],
            items: list[entry_lines.Fields]) -> None:  # fmt: skip
        """Items of one block, in line order (comprehensions: ~1 us an item, not ~3)."""
        first = len(self.offset)
        self.offset.extend(offsets)
        self.length.extend(lengths)
        self.line.extend(numbers)
        xxh = xxhash.xxh3_64_intdigest
        self.id_hash.extend([xxh(f[0].encode("utf-8", "surrogatepass")) for f in items])
        speakers, languages, default = self.speakers, self.languages, self.default_language
        self.speaker.extend([speakers.setdefault(f[3], len(speakers)) for f in items])
        codes = [f[4] or default for f in items]
        if not default:  # data.language: auto; an item awaiting detection gets its id there
            self.pending.extend((first + k, f[2]) for k, f in enumerate(items) if not codes[k])
        self.language.extend([languages.setdefault(c, len(languages)) if c else -1 for c in codes])
        line = entry_lines.digest_line
        self._chunks.append("".join([line(f[0], f[2], f[1], f[5], f[6]) for f in items]))
        self._plan_chunks.append("".join([f"{f[0]}|{f[1]}\n" for f in items]))
        self._flush()

    def _flush(self) -> None:
        self.digest.update("".join(self._chunks).encode("utf-8", "surrogatepass"))
        self.plan.update("".join(self._plan_chunks).encode("utf-8", "surrogatepass"))
        self._chunks.clear()
        self._plan_chunks.clear()
        if len(self.pending) >= DETECT_BATCH:
            self._detect()

    def _detect(self) -> None:
        if not self.pending:
            return
        from ringfeed.shared.language_id import detect_languages  # loads the detector's model

        d, f = self.cfg.data, self.cfg.features
        candidates = [language_code(c) for c in d.detect_languages]
        codes = detect_languages([t for _, t in self.pending], candidates,
                                 f.cache_dir if f.cache else None)  # fmt: skip
        for (item, _), code in zip(self.pending, codes, strict=True):
            self.language[item] = self.languages.setdefault(code, len(self.languages))
        self.pending.clear()

    def finish(self, duplicates_of: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        self._flush()
        self._detect()
        arrays = {
            "offset": np.frombuffer(self.offset, np.uint64),
            "length": np.frombuffer(self.length, np.uint64).astype(np.uint32),
            "line": np.frombuffer(self.line, np.uint64),
            "id_hash": np.frombuffer(self.id_hash, np.uint64),
            "speaker": _sorted_ids(self.speakers, self.speaker),
            "language": _sorted_ids(self.languages, self.language),
        }
        keep = duplicates_of(arrays)
        if keep is not None:  # duplicates drop out: the digests are taken again
            arrays = {k: a[keep] for k, a in arrays.items()}
        header = {
            "n_items": len(arrays["offset"]),
            "speakers": sorted(self.speakers),
            "languages": sorted(self.languages),
            "bad_lines": [[b.file, b.line, b.reason, b.item_id] for b in self.bad],
            "digest": entry_lines.digest_tables(
                self.digest,
                sorted(self.speakers),
                sorted(self.languages),
                arrays["speaker"],
                arrays["language"],
            ),  # fmt: skip
            "plan_hash": self.plan.hexdigest(),
        }
        order = np.argsort(arrays["id_hash"], kind="stable")
        arrays["id_order"] = order.astype(np.uint32 if len(order) < 2**32 else np.uint64)
        arrays["id_hash"] = arrays["id_hash"][order]
        arrays["frames"] = np.full(len(order), NOT_MEASURED, np.int32)
        arrays["text"] = np.zeros(len(order), np.int32)
        del arrays["line"]
        return header, arrays


def _sorted_ids(table: dict[str, int], ids: array) -> np.ndarray:
    """Ids in first-seen order -> ids of the table sorted by name (the same corpus gives
    the same ids whatever its order)."""
    remap = np.zeros(max(len(table), 1), np.int32)
    for rank, name in enumerate(sorted(table)):
        remap[table[name]] = rank
    return remap[np.frombuffer(ids, np.int64)] if len(ids) else np.zeros(0, np.int32)


def _duplicates(builder: Builder, reparse: Any, where: str) -> Any:
    """A function of the arrays: None when every id is unique, else the mask of items to
    keep (the first of each id, by line); the others become bad lines."""

    def check(arrays: dict[str, np.ndarray]) -> np.ndarray | None:
        hashes = arrays["id_hash"]
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
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
            for item in sorted(group):  # line order: the first of an id is kept
                item_id = reparse(item)
                if item_id in seen:
                    keep[item] = False
                    first_line = int(arrays["line"][seen[item_id]])
                    reason = f"duplicate item id {item_id!r} (first on line {first_line})"
                    builder.bad.append(BadLine(where, int(arrays["line"][item]), reason, item_id))
                else:
                    seen[item_id] = item
        if keep.all():
            return None
        _redigest(builder, keep, reparse)
        return keep

    return check


def _redigest(builder: Builder, keep: np.ndarray, fields_of: Any) -> None:
    """The digests over the items kept (rare: a corpus with duplicate ids)."""
    builder.digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    builder.plan = hashlib.blake2b(digest_size=8)
    for item in np.flatnonzero(keep):
        f = fields_of(int(item), full=True)
        line = entry_lines.digest_line(f.item_id, f.text, f.audio, f.offset_s, f.duration_s)
        builder.digest.update(line.encode("utf-8", "surrogatepass"))
        builder.plan.update(f"{f.item_id}|{f.audio}\n".encode("utf-8", "surrogatepass"))


def _guess_id(raw: bytes, kind: str) -> str:
    if kind == "jsonl":
        return ""
    first = raw.split(b"|", 1)[0]
    return first.decode("utf-8", errors="ignore").strip() if first.isascii() else ""


def build_lines(cfg: Config, path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The index of a one-file corpus (ljspeech, csv, jsonl) whose lines stay in `path`."""
    kind, root = cfg.data.format, str(path.parent.absolute())
    setting = cfg.data.text_column
    blocks = read_blocks(path)
    first = next(blocks, ([], [], []))
    if kind == "csv":
        if not first[0]:
            raise DatasetError(f"{path}: empty file, expected a header 'audio_file|text'")
        setting = _csv_columns(path, [(first[0][0], first[2][0])])
        first = (first[0][1:], first[1][1:], first[2][1:])
    builder = Builder(cfg, root)
    t0 = last = time.monotonic()
    where = str(path)
    for numbers, offsets, lines in itertools.chain([first], blocks):
        results = entry_lines.parse_block(kind, lines, setting, root)
        good = [k for k, r in enumerate(results) if r.__class__ is not str]
        if len(good) < len(results):
            builder.bad.extend(BadLine(where, numbers[k], r, _guess_id(lines[k], kind))
                               for k, r in enumerate(results) if r.__class__ is str)  # fmt: skip
            numbers, offsets = [numbers[k] for k in good], [offsets[k] for k in good]
            lines, results = [lines[k] for k in good], [results[k] for k in good]
        builder.add(offsets, [len(raw) for raw in lines], numbers, results)
        if time.monotonic() - last > PROGRESS_S and numbers:
            last = time.monotonic()
            log.info("corpus index: %d lines in %.0f s", numbers[-1], last - t0)

    def reparse(item: int, full: bool = False) -> Any:
        with open(path, "rb") as f:
            f.seek(builder.offset[item])
            fields = entry_lines.parse(kind, f.read(builder.length[item]), setting, root)
        return fields if full else fields.item_id

    header, arrays = builder.finish(_duplicates(builder, reparse, str(path)))
    header.update(kind=kind, setting=setting, root=root, lines_file=str(path.absolute()))
    return header, arrays


def build_stored(cfg: Config, root: str, items: list[entry_lines.Fields],
                 bad: list[BadLine]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:  # fmt: skip
    """The index of a corpus read some other way (folders, shards): its items are stored
    as lines inside the index ("lines", uint8)."""
    builder = Builder(cfg, root)
    builder.bad = list(bad)
    blob = [entry_lines.store(fields) for fields in items]
    lengths = [len(raw) for raw in blob]
    offsets = list(itertools.accumulate(lengths, initial=0))[:-1]
    builder.add(offsets, lengths, list(range(1, len(items) + 1)), items)

    def reparse(item: int, full: bool = False) -> Any:
        return items[item] if full else items[item].item_id

    header, arrays = builder.finish(_duplicates(builder, reparse, root))
    arrays["lines"] = np.frombuffer(b"".join(blob), np.uint8)
    header.update(kind="stored", setting=0, root=root, lines_file="")
    return header, arrays


def build_folders(cfg: Config) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from ringfeed.shared import corpora

    root = _data_path(cfg, None).absolute()
    if not root.is_dir():
        raise DatasetError(f"data.path: {root} is not a folder (data.format: {cfg.data.format})")
    if cfg.data.format == "libritts":
        entries, bad = corpora.read_libritts(root, cfg.data.text_column)
    else:
        entries, bad = corpora.read_vctk(root)
    prefix = f"{root}/"
    items = [
        entry_lines.Fields(
            e.item_id,
            e.audio_path.removeprefix(prefix),
            e.text,
            e.speaker,
            e.language,
            e.offset_s,
            e.duration_s,
        )  # fmt: skip
        for e in entries
    ]
    return build_stored(cfg, str(root), items, bad)


def build_index(cfg: Config) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header and arrays of cfg.data's index (not yet written)."""
    t0 = time.monotonic()
    if cfg.data.format in FOLDER_FORMATS:
        header, arrays = build_folders(cfg)
    elif cfg.data.format == "shards":
        from ringfeed.shared.shards import build_shards

        header, arrays = build_shards(cfg)
    else:
        header, arrays = build_lines(cfg, _metadata_path(cfg, None))
    header["build_s"] = round(time.monotonic() - t0, 3)
    return header, arrays


def main() -> int:
    """``python -m ringfeed.shared.index_build`` < config YAML: build and write the index."""
    from ringfeed.shared.corpus_index import write_built

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = config_from_dict(yaml.safe_load(sys.stdin.read()))
    try:
        write_built(cfg)
    except DatasetError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
