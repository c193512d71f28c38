"""One block of a corpus's items as the index keeps them: :class:`Block`.

The index build (shared/corpus/build.py) reads a corpus a block at a time. What an
item adds to the index (its line's place, its id's hash, its speaker and language,
its part of the corpus digest and of the plan hash) depends on the item alone, so
:func:`summarize` sums a block up wherever it was parsed (in the building process,
or in one of a pool of processes: shared/corpus/lines.py), and the builder merges
the blocks in file order (``Builder.merge``): the index is the same, byte for byte,
whichever process did the work and however the file was cut.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import xxhash

from ringfeed.shared.corpus.entry import digest_line


class Block(NamedTuple):
    """A block's items, in file order (n of them). Line numbers count from the block's
    first line (1-based); the builder adds the lines of the blocks before it."""

    offsets: np.ndarray  # uint64 [n]: byte offset of each item's line in its file
    lengths: np.ndarray  # uint64 [n]: bytes of each item's line, without CR/LF
    numbers: np.ndarray  # uint64 [n]: 1-based line numbers within the block
    lines: int  # newlines in the block: the next block's numbers count on from them
    id_hash: np.ndarray  # uint64 [n]: xxh3-64 of the item id
    speakers: list[str]  # speaker names in the order the block first names them
    speaker: np.ndarray  # int64 [n]: into speakers
    languages: list[str]  # language codes, likewise
    language: np.ndarray  # int64 [n]: into languages; -1: to be detected
    pending: list[tuple[int, str]]  # (item within the block, text) to detect
    digest: bytes  # the block's part of the corpus digest (entry.digest_line)
    plan: bytes  # its part of the plan hash (shared/run/fingerprint.py)
    outside: int  # items whose audio lies outside the corpus root ('../')
    outside_example: str
    bad: list[tuple[int, str, str]]  # (line within the block, reason, id it seems to name)


def summarize(
    offsets: list[int],
    lengths: list[int],
    numbers: list[int],
    rows: list[tuple],
    default_language: str,
    lines: int = 0,
    bad: list[tuple[int, str, str]] | None = None,
) -> Block:
    """The Block of a block's usable rows (Entry-shaped tuples, audio relative to the
    root): comprehensions, ~1 us an item (a loop of calls per item costs ~3).
    default_language: data.language's code, "" where it is detected."""
    xxh = xxhash.xxh3_64_intdigest
    speakers: dict[str, int] = {}
    languages: dict[str, int] = {}
    speaker = [speakers.setdefault(f[3], len(speakers)) for f in rows]
    codes = [f[4] or default_language for f in rows]
    language = [languages.setdefault(c, len(languages)) if c else -1 for c in codes]
    outside = [f[1] for f in rows if f[1].startswith("../")]
    digest = "".join([digest_line(f[0], f[2], f[1], f[5], f[6]) for f in rows])
    return Block(
        offsets=np.array(offsets, np.uint64),
        lengths=np.array(lengths, np.uint64),
        numbers=np.array(numbers, np.uint64),
        lines=lines,
        id_hash=np.array([xxh(f[0].encode("utf-8", "surrogatepass")) for f in rows], np.uint64),
        speakers=list(speakers),
        speaker=np.array(speaker, np.int64),
        languages=list(languages),
        language=np.array(language, np.int64),
        pending=[(k, f[2]) for k, f in enumerate(rows) if not codes[k]],
        digest=digest.encode("utf-8", "surrogatepass"),
        plan="".join([f"{f[0]}|{f[1]}\n" for f in rows]).encode("utf-8", "surrogatepass"),
        outside=len(outside),
        outside_example=outside[0] if outside else "",
        bad=bad or [],
    )
