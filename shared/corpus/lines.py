"""Metadata files read a block at a time, for the formats whose clips are lines.

The index build passes over a corpus's lines once, in blocks of about
block_bytes (BLOCK_BYTES; its memory is its arrays, not the file), keeping each
usable line's byte offset and length; a producer later reads back only the lines
of the items it is granted. Both decode with :func:`decode_block` and parse with
the same format function, so they agree by construction. A block is a byte range
of the file ending after a newline: it is read, parsed and summed up
(shared/corpus/block.py) on its own, by this process or, where the index is
written (shared/corpus/build.py write_built) and the file has many blocks, by a
pool of processes, one per core (parsing is the build's cost:
docs/benchmarks.md#corpus-index-at-scale); the builder merges the blocks in file
order, so the index is the same byte for byte either way
(tests/unit/test_index_build.py). A block is decoded once when it is valid UTF-8,
and its lines are filtered for blank ones only where one may be.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.block import Block, summarize

if TYPE_CHECKING:
    from ringfeed.shared.corpus.build import Builder

BLOCK_BYTES = 1 << 23
PROGRESS_S = 2.0
# A process of the pool gets at least this many blocks (16 MiB): below, starting it
# (~0.3 s of imports) costs more than it saves.
BLOCKS_PER_WORKER = 2
# A line that may be blank or whitespace-only (one starting with whitespace): when a block
# has one, its lines are filtered one by one. Searched in C from each newline, 1 ms an
# 8 MiB block; a pattern anchored at line starts ("(?:^|\n)...") is tried at every byte
# and took 320 ms, as long as parsing the block's csv lines.
_MAYBE_BLANK = re.compile(rb"\n[ \t\r\f\v\n]")
_WHITESPACE = b" \t\r\f\v\n"


class LinesJob(NamedTuple):
    """One block of a metadata file to parse and sum up: what a process needs for it."""

    fmt: Any  # the LineFormat (a stateless instance: pickled by its class)
    context: Any  # its Context
    default_language: str
    path: str
    start: int  # the block's bytes: [start, end)
    end: int
    header: bool  # the block's first line is the format's header: not an item


def block_ranges(path: str, block_bytes: int) -> list[tuple[int, int]]:
    """The file cut into [start, end) ranges of about block_bytes, each but the last
    ending just after a newline (a line longer than a block makes its block longer)."""
    size, ranges, start = os.path.getsize(path), [], 0
    with open(path, "rb") as f:
        while start < size:
            end = start + block_bytes
            f.seek(end)
            while end < size:
                piece = f.read(1 << 16)
                cut = piece.find(b"\n")
                end += cut + 1 if cut >= 0 else len(piece)
                if cut >= 0:
                    break
            ranges.append((start, min(end, size)))
            start = min(end, size)
    return ranges


def read_range(path: str, start: int, end: int) -> tuple[list[int], list[int], list[bytes], int]:
    """(1-based line numbers counted from the range's first line, byte offsets, lines
    without CR/LF) of the non-blank lines of bytes [start, end) of the file, and how
    many newlines the range holds; a UTF-8 BOM at the file's start is skipped."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    numbers, offsets, lines = _lines(data, start, 0)
    return numbers, offsets, lines, data.count(b"\n")


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
    if data[skip : skip + 1] in _WHITESPACE or _MAYBE_BLANK.search(data, skip, end):
        keep = [k for k, p in enumerate(parts) if p.strip()]
        numbers, offsets, parts = ([x[k] for k in keep] for x in (numbers, offsets, parts))
    return numbers, offsets, parts


def decode_block(lines: list[bytes]) -> tuple[list[str], dict[int, str]]:
    """(the lines as text, {k: why line k is not UTF-8}): one decode for the block when
    it is valid UTF-8 (lines hold no newline, so joining and splitting gives them back);
    a line that is not decodes as ""."""
    try:
        return b"\n".join(lines).decode("utf-8").split("\n"), {}
    except UnicodeDecodeError:
        pass
    texts, bad = [], {}
    for k, raw in enumerate(lines):
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            texts.append("")
            bad[k] = f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    return texts, bad


def summarize_range(job: LinesJob) -> Block:
    """One block read, parsed by its format and summed up: where a pool runs it, what
    comes back is the Block (arrays and bytes), not a Python object per line."""
    numbers, offsets, lines, count = read_range(job.path, job.start, job.end)
    if job.header and lines:
        numbers, offsets, lines = numbers[1:], offsets[1:], lines[1:]
    results = job.fmt.parse(lines, job.context)
    bad = []
    good = [k for k, r in enumerate(results) if r.__class__ is not str]
    if len(good) < len(results):
        bad = [
            (numbers[k], r, job.fmt.guess_id(lines[k]))
            for k, r in enumerate(results)
            if r.__class__ is str
        ]
        numbers, offsets = [numbers[k] for k in good], [offsets[k] for k in good]
        lines, results = [lines[k] for k in good], [results[k] for k in good]
    lengths = [len(raw) for raw in lines]
    return summarize(offsets, lengths, numbers, results, job.default_language, count, bad)


def scan_lines(fmt: Any, cfg: Config, builder: Builder, path: str) -> None:
    """Every line of the metadata file `path` into builder, through fmt (a LineFormat:
    its setting, parse and guess_id), by a pool of processes where the file has many
    blocks (builder.workers), with a progress line every PROGRESS_S."""
    ranges = block_ranges(path, builder.block_bytes)
    first = read_range(path, *ranges[0])[2] if ranges else []
    setting, header = fmt.setting(cfg, path, first[0] if first else None)
    builder.start_lines(path, setting)
    context, language = builder.context(), builder.default_language
    jobs = [
        LinesJob(fmt, context, language, path, start, end, header and k == 0)
        for k, (start, end) in enumerate(ranges)
    ]
    workers = builder.workers or min(len(os.sched_getaffinity(0)), len(jobs) // BLOCKS_PER_WORKER)
    workers = min(workers, len(jobs))
    import multiprocessing as mp  # here: ~20 ms of every stager's and producer's start
    from concurrent.futures import ProcessPoolExecutor

    if workers < 2 or mp.current_process().daemon:  # a daemon may start no process
        _merge(builder, map(summarize_range, jobs), jobs)
        return
    # spawn: no fork of a threaded parent; an executor, not mp.Pool: a process that dies
    # (killed, out of memory) raises BrokenProcessPool here instead of hanging the build.
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        builder.progress(f"{len(jobs)} blocks of {path} read by {workers} processes")
        _merge(builder, pool.map(summarize_range, jobs), jobs)


def _merge(builder: Builder, blocks: Iterator[Block], jobs: list[LinesJob]) -> None:
    """The blocks into builder in file order, with a progress line every PROGRESS_S."""
    size = jobs[-1].end if jobs else 0
    t0 = last = time.monotonic()
    for block, job in zip(blocks, jobs, strict=True):
        builder.merge(block)
        if time.monotonic() - last > PROGRESS_S:
            last = time.monotonic()
            builder.progress(
                f"{builder.lines_before:,} lines ({job.end / size:.0%} of "
                f"{size / 2**20:,.0f} MB) in {last - t0:.0f} s, "
                f"{len(builder.offset) / (last - t0):,.0f} items/s"
            )
