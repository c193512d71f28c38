"""Fields of the user's own, for the tests (features.user_function points here).

Each value is a pure function of the clip, so a test can recompute it for the item
a batch row claims to be: ``loudness`` (frames-tied, float32: the mel's mean over
bands), ``emotion`` (no length axis, int32 [2]: the text's length and its first
character), ``style`` (own length, float32 [<= 4, 3]: the wave's first values).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# What the e2e test declares (features.user_fields).
FIELDS = [
    {"name": "loudness", "dtype": "float32", "shape": [], "length": "frames"},
    {"name": "emotion", "dtype": "int32", "shape": [2], "length": "none"},
    {"name": "style", "dtype": "float32", "shape": [4, 3], "length": "own", "pad": -1.0},
]


def fields(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    n_style = 1 + len(text) % 4
    return {
        "loudness": mel.mean(axis=1),
        "emotion": np.array([len(text), ord(text[0])], np.int32),
        "style": wave[: 3 * n_style].reshape(n_style, 3),
    }


def raising(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    if entry.item_id == "LJ001-0008":
        raise KeyError("no emotion label for LJ001-0008")
    return fields(wave, mel, text, entry)


def wrong_shape(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    out = fields(wave, mel, text, entry)
    out["emotion"] = np.zeros(3, np.int32)
    return out


def in_place(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    mel -= mel.mean()  # edits what it was given: must not reach the sample or the cache
    return fields(wave, mel, text, entry)


def too_wide(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    out = fields(wave, mel, text, entry)
    out["emotion"] = np.array([2**32 + 7, 1], np.int64)  # int32 would wrap it to 7
    return out


def write_durations(directory: Path, item_id: str, n_tokens: int, n_frames: int) -> Path:
    """A durations file (producer/features/durations.py): n_frames over n_tokens, uneven."""
    durations = np.full(n_tokens, n_frames // n_tokens)
    durations[: n_frames % n_tokens] += 1
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{item_id}.durations"
    path.write_text(" ".join(map(str, durations)) + "\n")
    return path


def wave_only(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    """FIELDS[1:] (no frames-tied field): for features.device: stager, where mel is None."""
    assert mel is None
    out = fields(wave, np.zeros((1, 1), np.float32), text, entry)
    del out["loudness"]
    return out


# Items fussy() fails on: not the corpus's first clip, so a run starts and quarantines them.
FUSSY_ITEMS = ("LJ001-0004", "LJ001-0008")


def fussy(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    """fields(), but no label for FUSSY_ITEMS: a function that fails on some clips."""
    if entry.item_id in FUSSY_ITEMS:
        raise KeyError(f"no emotion label for {entry.item_id}")
    return fields(wave, mel, text, entry)


def by_key(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    """Reads the entry as a dict: a TypeError on the NamedTuple, for every clip."""
    assert entry["item_id"]
    return fields(wave, mel, text, entry)


def too_loud(wave: np.ndarray, mel: np.ndarray | None, text: str, entry: Any) -> dict[str, Any]:
    """fields() with loudness in raw 16-bit units: beyond the content check's +-1e4."""
    out = fields(wave, mel, text, entry)
    out["loudness"] = out["loudness"] * 0 + 32768.0
    return out
