"""A corpus with bad files among a speaker's reference clips, made of the shipped LJSpeech
clips: two speakers, each with three good clips and four bad files (random bytes, an
empty file, a missing file, a near-silent hiss that reads), and the small features that
draw references from them."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from tests.support.configs import EIGHT_KHZ_FEATURES
from tests.support.paths import WAVS


def _hiss() -> bytes:
    """2 s of noise at about -70 dBFS: it reads, and normalized up it would be loud hiss."""
    out = io.BytesIO()
    noise = np.random.default_rng(7).standard_normal(16000).astype(np.float32) * 3e-4
    sf.write(out, noise, 8000, format="WAV", subtype="PCM_16")
    return out.getvalue()


GOOD = ["LJ001-0002", "LJ001-0003", "LJ001-0004", "LJ001-0005", "LJ001-0006", "LJ001-0007"]
BAD = {"noise": b"\x13\x37" * 5000, "empty": b"", "missing": None, "hiss": _hiss()}
SMALL: dict[str, Any] = {
    "audio": {"sample_rate": 8000},
    "features": {
        **EIGHT_KHZ_FEATURES,
        "max_frames": 400,
        "reference": True,
        "reference_frames": 32,
        "on_too_long": "truncate",
    },
}


def make_reference_corpus(root: Path) -> Path:
    """The corpus (module docstring) as a jsonl manifest in root; returns its path."""
    root.mkdir(parents=True)
    lines = []
    for k, name in enumerate(GOOD):
        shutil.copy(WAVS / f"{name}.wav", root / f"{name}.wav")
        lines.append({"audio": f"{name}.wav", "text": f"Good clip {k}.", "speaker": f"s{k % 2}"})
    for speaker in ("s0", "s1"):
        for bad, data in BAD.items():
            if data is not None:
                (root / f"{bad}-{speaker}.wav").write_bytes(data)
            lines.append({"audio": f"{bad}-{speaker}.wav", "text": "Bad.", "speaker": speaker})
    path = root / "train.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path
