"""Where the tests find the repository and the clips it ships."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "data" / "ljspeech-mini"  # 16 LJSpeech clips and their metadata.csv
WAVS = MINI / "wavs"
