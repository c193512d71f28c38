"""A corpus that lists its clips by absolute path, to copy or move elsewhere: six of the
shipped LJSpeech clips under root/wavs, in a NeMo-style JSON-lines manifest (a .json
name, a rounded duration) or a csv metadata file, in root or a folder below it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.paths import WAVS

CLIPS = ["LJ001-0002", "LJ001-0003", "LJ001-0004", "LJ001-0005", "LJ001-0006", "LJ001-0007"]


def make_absolute_corpus(root: Path, fmt: str = "jsonl", manifest_in: str = "") -> Path:
    """The CLIPS under root/wavs, listed by absolute path in a manifest (jsonl) or a
    metadata file (csv) in root/manifest_in; returns the manifest's path."""
    (root / "wavs").mkdir(parents=True)
    for name in CLIPS:
        shutil.copy(WAVS / f"{name}.wav", root / "wavs" / f"{name}.wav")
    folder = root / manifest_in
    folder.mkdir(parents=True, exist_ok=True)
    audio = [str(root / "wavs" / f"{name}.wav") for name in CLIPS]
    if fmt == "csv":
        lines = ["audio_file|text|speaker_name"]
        lines += [f"{a}|Clip number {k}.|spk{k % 2}" for k, a in enumerate(audio)]
        path = folder / "metadata.csv"
    else:
        lines = [
            json.dumps(
                {
                    "audio_filepath": a,
                    "text": f"Clip number {k}.",
                    "speaker": f"spk{k % 2}",
                    "duration": 1.0,
                }
            )
            for k, a in enumerate(audio)
        ]
        path = folder / "train_manifest.json"  # NeMo's name for JSON lines
    path.write_text("\n".join(lines) + "\n")
    return path
