"""A small LJSpeech-layout dataset with good clips and every kind of broken input.

Generated at test time from data/ljspeech-mini (nothing binary is committed).
Used by the dataset and pipeline tests, and by end-to-end tests that need a
quarantine report with known contents.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from tests.support.audio import write_audio
from tests.support.paths import MINI

# Short real clips (1.8-2.6 s) keep the tests fast.
GOOD_SOURCES = ["LJ001-0002", "LJ001-0008", "LJ001-0013"]


@dataclass
class BrokenDataset:
    """root: dataset directory; good: ids that must produce a Sample; bad_lines and
    bad_samples: id -> reason substring, rejected by read_dataset or by the pipeline."""

    root: Path
    good: list[str] = field(default_factory=list)
    bad_lines: dict[str, str] = field(default_factory=dict)
    bad_samples: dict[str, str] = field(default_factory=dict)


def _read(src: Path, item_id: str) -> tuple[np.ndarray, int]:
    wave, sr = sf.read(src / "wavs" / f"{item_id}.wav", dtype="float32")
    return wave, sr


def _write_good(ds: BrokenDataset, src: Path, wavs: Path, lines: list[str]) -> None:
    meta = {
        parts[0]: parts[1]
        for parts in (line.split("|") for line in (src / "metadata.csv").read_text().splitlines())
    }
    for item_id in GOOD_SOURCES:
        shutil.copy(src / "wavs" / f"{item_id}.wav", wavs / f"{item_id}.wav")
        lines.append(f"{item_id}|{meta[item_id]}|{meta[item_id]}")
        ds.good.append(item_id)
    wave, sr = _read(src, "LJ001-0008")
    # 44.1 kHz stereo 24-bit: must be resampled and mixed down, not rejected.
    hi = soxr.resample(wave, sr, 44100)
    write_audio(
        wavs / "stereo-44k.wav",
        np.stack([hi, 0.5 * hi], axis=1),
        sample_rate=44100,
        subtype="PCM_24",
    )
    write_audio(
        wavs / "mono-8k.wav", soxr.resample(wave, sr, 8000), sample_rate=8000, subtype="PCM_16"
    )
    for item_id in ("stereo-44k", "mono-8k"):
        lines.append(f"{item_id}|Resampled copy, 1999.|Resampled copy, 1999.")
        ds.good.append(item_id)


def _write_bad_audio(ds: BrokenDataset, src: Path, wavs: Path, lines: list[str]) -> None:
    wave, sr = _read(src, "LJ001-0002")
    write_audio(wavs / "truncated.wav", wave, sample_rate=sr)
    data = (wavs / "truncated.wav").read_bytes()
    (wavs / "truncated.wav").write_bytes(data[:30])  # cut inside the RIFF header
    (wavs / "zero-byte.wav").write_bytes(b"")
    (wavs / "text-file.wav").write_text("this is not audio\n" * 20)
    write_audio(
        wavs / "long-30s.wav", np.tile(wave, int(np.ceil(30 * sr / len(wave)))), sample_rate=sr
    )
    write_audio(wavs / "too-short.wav", wave[: sr // 50], sample_rate=sr)
    nan_wave = wave.copy()
    nan_wave[100] = np.nan
    write_audio(wavs / "has-nan.wav", nan_wave, sample_rate=sr, subtype="FLOAT")
    ds.bad_samples.update(
        {
            "truncated": "unreadable audio",
            "zero-byte": "zero-byte",
            "text-file": "unreadable audio",
            "long-30s": "features.on_too_long: truncate",
            "too-short": "too short",
            "has-nan": "NaN",
        }
    )
    for item_id in ds.bad_samples:
        # long-30s says enough for 30 s (data.outliers would skip a clip of two words
        # that long before a producer sees it), and is too long for a slot.
        text = "Some words, said again and again. " * 8 if item_id == "long-30s" else "Some words."
        lines.append(f"{item_id}|{text.strip()}|{text.strip()}")


def make_broken_dataset(dst: Path, src: Path = MINI) -> BrokenDataset:
    """Build the dataset in dst (a tmp dir); returns the expected verdicts per item id."""
    src = Path(src)
    wavs = dst / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    ds = BrokenDataset(dst)
    lines: list[str] = []
    _write_good(ds, src, wavs, lines)
    _write_bad_audio(ds, src, wavs, lines)
    lines.append("missing-file|There is no audio.|There is no audio.")
    lines.append("empty-text|   |   ")
    lines.append("four-columns|One|too|many.")
    ds.bad_lines.update(
        {
            "missing-file": "audio file not found",
            "empty-text": "empty text",
            "four-columns": "got 4 columns",
        }
    )
    raw = "\n".join(lines).encode() + b"\nbad-bytes|caf\xe9 latin-1|caf\xe9 latin-1\n"
    ds.bad_lines["bad-bytes"] = "not valid UTF-8"
    (dst / "metadata.csv").write_bytes(raw)
    return ds
