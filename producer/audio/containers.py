"""Audio files shorter than their header says, found from their chunk headers alone.

libsndfile reads a RIFF/WAVE, RF64, Wave64 or AIFF file whose sample data runs past
the end of the file as if it were whole, cut to what is there, and reports the cut
length as the file's: a copy cut short, or a header over garbage, would train as a
short clip against its whole text. shortfall() walks the container's chunks (a few
small reads, wherever the data chunk starts: LIST, bext, iXML or id3 chunks may come
first) and compares the sample data the header declares with the bytes the file
holds. Compressed streams (MP3, FLAC, Ogg) are judged after decoding instead
(producer/audio/decode.py decode: the frames their header declares against the frames
decoded); a stream cut at a page boundary that is a valid shorter stream can only be
caught by its speaking rate (data.outliers).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

# read_at(offset, n) -> up to n bytes of the file from offset (os.pread, a member slice).
ReadAt = Callable[[int, int], bytes]
# A WAV data chunk whose size says this is unknown (a stream written before its end).
UNKNOWN_SIZES = (0, 0xFFFFFFFF)
# Chunks walked before the data chunk; a real file has a handful.
MAX_CHUNKS = 64
# Wave64 chunk ids are GUIDs whose first 4 bytes spell the RIFF names.
W64_RIFF = b"riff\x2e\x91\xcf\x11\xa5\xd6\x28\xdb\x04\xc1\x00\x00"


def shortfall(read_at: ReadAt, size: int) -> tuple[float, float] | None:
    """(seconds the header declares, seconds the file holds) of a file whose sample
    data is cut short, else None (whole, unknown length, or another format)."""
    head = read_at(0, 16)
    if len(head) < 12:
        return None
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return _riff(read_at, size, rf64=head[:4] == b"RF64")
    if head[:16] == W64_RIFF:
        return _w64(read_at, size)
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return _aiff(read_at, size)
    return None


def _verdict(declared: int, held: int, bytes_per_s: float) -> tuple[float, float] | None:
    if declared <= held or bytes_per_s <= 0:
        return None
    return declared / bytes_per_s, max(held, 0) / bytes_per_s


def _riff(read_at: ReadAt, size: int, rf64: bool) -> tuple[float, float] | None:
    at, byte_rate, data64 = 12, 0, None
    for _ in range(MAX_CHUNKS):
        header = read_at(at, 8)
        if len(header) < 8:
            return None
        chunk, length = header[:4], int.from_bytes(header[4:], "little")
        if chunk == b"ds64" and rf64:
            data64 = struct.unpack("<Q", read_at(at + 16, 8).ljust(8, b"\0"))[0]
        elif chunk == b"fmt ":
            fmt = read_at(at + 8, 16)
            if len(fmt) == 16:
                byte_rate = int.from_bytes(fmt[8:12], "little")
        elif chunk == b"data":
            if rf64 and length == 0xFFFFFFFF and data64 is not None:
                length = data64
            elif length in UNKNOWN_SIZES:
                return None
            return _verdict(length, size - (at + 8), byte_rate)
        at += 8 + length + (length & 1)  # chunks are word-aligned
    return None


def _w64(read_at: ReadAt, size: int) -> tuple[float, float] | None:
    at, byte_rate = 40, 0  # riff GUID + size, wave GUID
    for _ in range(MAX_CHUNKS):
        header = read_at(at, 24)
        if len(header) < 24:
            return None
        chunk, length = header[:4], int.from_bytes(header[16:24], "little")  # with header
        if chunk == b"fmt ":
            fmt = read_at(at + 24, 16)
            if len(fmt) == 16:
                byte_rate = int.from_bytes(fmt[8:12], "little")
        elif chunk == b"data":
            return _verdict(length - 24, size - (at + 24), byte_rate)
        if length < 24:
            return None
        at += (length + 7) // 8 * 8  # chunks are 8-byte aligned
    return None


def _aiff(read_at: ReadAt, size: int) -> tuple[float, float] | None:
    at, frames, frame_bytes, rate = 12, 0, 0, 0.0
    for _ in range(MAX_CHUNKS):
        header = read_at(at, 8)
        if len(header) < 8:
            return None
        chunk, length = header[:4], int.from_bytes(header[4:], "big")
        if chunk == b"COMM":
            comm = read_at(at + 8, 18)
            if len(comm) < 18:
                return None
            channels, frames, bits = struct.unpack(">hIh", comm[:8])
            frame_bytes, rate = channels * ((bits + 7) // 8), _extended(comm[8:18])
        elif chunk == b"SSND":
            if not frames or not frame_bytes:
                return None
            held = size - (at + 16)  # after the chunk header, offset and block size
            return _verdict(frames * frame_bytes, held, rate * frame_bytes)
        at += 8 + length + (length & 1)
    return None


def _extended(b: bytes) -> float:
    """An IEEE 754 80-bit extended float (AIFF's sample rate)."""
    exponent = int.from_bytes(b[:2], "big") & 0x7FFF
    mantissa = int.from_bytes(b[2:10], "big")
    return math.ldexp(mantissa, exponent - 16383 - 63) if exponent else 0.0
