"""A corpus with audio that is not its text, made of the shipped LJSpeech clips: the 16
clips with their own texts, and one of each kind data.outliers must find.

    long-text   a clip whose text is four times its own (rate x 4)
    cut-short   a clip cut to its first quarter, its WAV header written to fit (a
                truncated copy no header check can see), with the whole text (rate x 4)
    quiet       a clip 45 dB down (RMS about -66 dBFS): near-silent
    clipped     a clip driven 12 dB into full scale: clipped
    cut-header  a clip cut to 40 % of its bytes under its old header: refused by the
                producers whatever data.outliers says (producer/audio/decode.py check_whole),
                and out of band too (a header read gives what the file holds: rate x 2.5)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from tests.support.configs import EIGHT_KHZ_FEATURES
from tests.support.corpora import write_manifest
from tests.support.paths import MINI, WAVS

GENUINE = [f"LJ001-{k:04d}" for k in range(1, 17)]
OUT_OF_BAND = {"long-text": "LJ001-0013", "cut-short": "LJ001-0004"}
AUDIO = {"quiet": ("LJ001-0002", "near-silent"), "clipped": ("LJ001-0008", "clipped")}
REFUSED = {"cut-header": "LJ001-0011"}
# 8 kHz and a 256-sample hop keep a real run of 21 clips to seconds on 2 cores.
SMALL: dict[str, Any] = {
    "audio": {"sample_rate": 8000},
    "features": {
        **EIGHT_KHZ_FEATURES,
        "max_frames": 400,
        "on_too_long": "truncate",
    },
    "text": {"max_text_len": 256},
}


def texts() -> dict[str, str]:
    lines = (MINI / "metadata.csv").read_text().splitlines()
    return {parts[0]: parts[2] for parts in (line.split("|") for line in lines)}


def make_outlier_corpus(root: Path) -> Path:
    """The corpus (module docstring) as a jsonl manifest in root; returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    text, lines = texts(), []
    for name in GENUINE:
        shutil.copy(WAVS / f"{name}.wav", root / f"{name}.wav")
        lines.append({"id": name, "audio": f"{name}.wav", "text": text[name]})
    source = OUT_OF_BAND["long-text"]
    shutil.copy(WAVS / f"{source}.wav", root / "long-text.wav")
    four_times = " ".join([text[source]] * 4)
    lines.append({"id": "long-text", "audio": "long-text.wav", "text": four_times})
    wave, sr = sf.read(WAVS / f"{OUT_OF_BAND['cut-short']}.wav", dtype="int16")
    sf.write(root / "cut-short.wav", wave[: len(wave) // 4], sr, subtype="PCM_16")
    lines.append({"id": "cut-short", "audio": "cut-short.wav", "text": text["LJ001-0004"]})
    for name, (source, _) in AUDIO.items():
        wave, sr = sf.read(WAVS / f"{source}.wav", dtype="float32")
        wave = wave * 10 ** (-45 / 20) if name == "quiet" else np.clip(wave * 4, -1, 1)
        sf.write(root / f"{name}.wav", wave, sr, subtype="PCM_16")
        lines.append({"id": name, "audio": f"{name}.wav", "text": text[source]})
    data = (WAVS / f"{REFUSED['cut-header']}.wav").read_bytes()
    (root / "cut-header.wav").write_bytes(data[: len(data) * 2 // 5])
    lines.append({"id": "cut-header", "audio": "cut-header.wav", "text": text["LJ001-0011"]})
    return write_manifest(root / "train.jsonl", lines)
