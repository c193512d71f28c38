"""Where each value of a Parquet byte-array column lies in its file, for one pread a clip.

Hugging Face ``datasets`` writes an Audio column's bytes uncompressed and PLAIN-encoded
(datasets/arrow_writer.py get_parquet_column_options: "none" and "PLAIN" for columns
whose files are embedded), so each clip's bytes are one contiguous range of the file,
behind a 4-byte length. The index build (shared/corpus/formats/parquet.py) walks the
column chunk's page headers (Thrift compact protocol, https://github.com/apache/parquet-format
parquet.thrift PageHeader) and each page's definition levels and length prefixes,
reading a few bytes a clip, never a clip; a producer then reads its clip's range as
it reads a tar member (shared/corpus/members.py). A chunk that is compressed or
encoded otherwise is :class:`NotAddressable`: its rows cannot be read a clip at a time.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

# PageHeader.type
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN = 0
# read_at(offset, n) -> the file's n bytes at offset (os.pread, or a store's ranged read).
ReadAt = Callable[[int, int], bytes]
# Bytes read for a page header (statistics of a byte-array page can make it longer).
HEADER_READ = 256


class NotAddressable(ValueError):
    """The column chunk's values are not plain byte ranges of the file."""


class Reader:
    """Thrift compact protocol over a bytes buffer (only what a PageHeader needs)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int) -> object:
        if kind in (1, 2):
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.at += 8
            return None
        if kind == 8:
            n = self.varint()
            self.at += n
            return self.data[self.at - n : self.at]
        if kind in (9, 10):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            size = self.varint() if size == 15 else size
            return [self.byte() == 1 if elem in (1, 2) else self.value(elem) for _ in range(size)]
        if kind == 11:
            size = self.varint()
            types = self.byte() if size else 0
            return {self.value(types >> 4): self.value(types & 0x0F) for _ in range(size)}
        if kind == 12:
            return self.struct()
        raise NotAddressable(f"unknown Thrift type {kind}")

    def struct(self) -> dict[int, object]:
        fields: dict[int, object] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind)


def levels(data: bytes, bit_width: int, count: int) -> list[int]:
    """count values of Parquet's RLE / bit-packed hybrid encoding."""
    out: list[int] = []
    at, width = 0, (bit_width + 7) // 8
    while len(out) < count:
        header, shift = 0, 0
        while True:
            b = data[at]
            at += 1
            header |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if header & 1:  # bit-packed: groups of 8 values, least significant bit first
            n = (header >> 1) * 8
            bits = int.from_bytes(data[at : at + n * bit_width // 8], "little")
            at += n * bit_width // 8
            mask = (1 << bit_width) - 1
            out.extend((bits >> (k * bit_width)) & mask for k in range(n))
        else:
            out.extend([int.from_bytes(data[at : at + width], "little")] * (header >> 1))
            at += width
    return out[:count]


def value_ranges(
    read_at: ReadAt, start: int, n_rows: int, max_def: int
) -> list[tuple[int, int] | None]:
    """Per row of one column chunk (pages from byte `start`): (offset, size) of its value
    in the file, None where it is null. NotAddressable for a compressed or non-PLAIN page
    (the chunk's codec is checked by the caller), for a page whose values do not end
    exactly where the page does, or pages that do not hold n_rows values: a range read
    wrong would hand a producer another clip's bytes, or half of one."""
    out: list[tuple[int, int] | None] = []
    at = start
    while len(out) < n_rows:
        try:
            reader = Reader(read_at(at, HEADER_READ))
            header = reader.struct()
        except IndexError:  # a header longer than HEADER_READ: read it whole
            reader = Reader(read_at(at, 1 << 16))
            header = reader.struct()
        body, size, kind = at + reader.at, int(header[3]), header[1]  # type: ignore[call-overload]
        if kind == DICTIONARY_PAGE:
            raise NotAddressable("dictionary-encoded")
        if kind in (DATA_PAGE, DATA_PAGE_V2):
            page = _page_v1 if kind == DATA_PAGE else _page_v2
            values, end = page(read_at, body, header[5 if kind == DATA_PAGE else 8], max_def)  # type: ignore[arg-type]
            if end != body + size:
                raise NotAddressable(
                    f"a page's values end at byte {end}, the page at {body + size}"
                )
            out.extend(values)
        at = body + size
    if len(out) != n_rows:
        raise NotAddressable(f"its pages hold {len(out)} values for {n_rows} rows")
    return out


def _values(
    read_at: ReadAt, at: int, defs: list[int], max_def: int
) -> tuple[list[tuple[int, int] | None], int]:
    """(the ranges of a page's values, from byte `at`; where the last one ends)."""
    out: list[tuple[int, int] | None] = []
    for d in defs:
        if d < max_def:
            out.append(None)
            continue
        (length,) = struct.unpack("<I", read_at(at, 4))
        out.append((at + 4, length))
        at += 4 + length
    return out, at


def _page_v1(read_at: ReadAt, at: int, h: dict[int, object], max_def: int) -> tuple[list, int]:
    n = int(h[1])  # type: ignore[call-overload]
    if h[2] != PLAIN:
        raise NotAddressable(f"encoding {h[2]}, not PLAIN")
    defs = [max_def] * n
    if max_def:
        (length,) = struct.unpack("<I", read_at(at, 4))
        defs = levels(read_at(at + 4, length), max_def.bit_length(), n)
        at += 4 + length
    return _values(read_at, at, defs, max_def)


def _page_v2(read_at: ReadAt, at: int, h: dict[int, object], max_def: int) -> tuple[list, int]:
    n, def_bytes, rep_bytes = (int(h[k]) for k in (1, 5, 6))  # type: ignore[call-overload]
    if h[4] != PLAIN:
        raise NotAddressable(f"encoding {h[4]}, not PLAIN")
    at += rep_bytes
    defs = levels(read_at(at, def_bytes), max_def.bit_length(), n) if max_def else [0] * n
    return _values(read_at, at + def_bytes, defs, max_def)
