"""Metadata files read a block at a time, for the formats whose clips are lines.

The index build passes over a corpus's lines once, in blocks of BLOCK_BYTES
(its memory is its arrays, not the file), keeping each usable line's byte offset
and length; a producer later reads back only the lines of the items it is
granted. Both decode with :func:`decode_block` and parse with the same format
function, so they agree by construction. The build must pass 200,000 lines a
second (docs/scale.md#the-corpus-index): a block is decoded once when it
is valid UTF-8, and blank lines are found with one regular expression.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import BadLine

if TYPE_CHECKING:
    from ringfeed.shared.corpus.build import Builder

BLOCK_BYTES = 1 << 23
PROGRESS_S = 2.0
# A blank or whitespace-only line anywhere in a block (searched in C, not line by line).
_BLANK = re.compile(rb"(?:^|\n)[ \t\r\f\v]*(?:\n|$)")


def read_blocks(path: str) -> Iterator[tuple[list[int], list[int], list[bytes]]]:
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


def scan_lines(fmt: Any, cfg: Config, builder: Builder, path: str) -> None:
    """Every line of the metadata file `path` into builder, through fmt (a LineFormat:
    its setting, parse and guess_id), with a progress line every PROGRESS_S."""
    blocks = read_blocks(path)
    first = next(blocks, ([], [], []))
    setting, header = fmt.setting(cfg, path, first[2][0] if first[2] else None)
    if header:
        first = (first[0][1:], first[1][1:], first[2][1:])
    builder.start_lines(path, setting)
    context = builder.context()
    t0 = last = time.monotonic()
    for numbers, offsets, lines in itertools.chain([first], blocks):
        results = fmt.parse(lines, context)
        good = [k for k, r in enumerate(results) if r.__class__ is not str]
        if len(good) < len(results):
            builder.bad.extend(BadLine(path, numbers[k], r, fmt.guess_id(lines[k]))
                               for k, r in enumerate(results) if r.__class__ is str)  # fmt: skip
            numbers, offsets = [numbers[k] for k in good], [offsets[k] for k in good]
            lines, results = [lines[k] for k in good], [results[k] for k in good]
        builder.add(offsets, [len(raw) for raw in lines], numbers, results)
        if time.monotonic() - last > PROGRESS_S and numbers:
            last = time.monotonic()
            builder.progress(f"{numbers[-1]} lines in {last - t0:.0f} s")
