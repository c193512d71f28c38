"""Durations per token from a per-clip durations file (features.durations_dir).

Called in producer processes by the sample pipeline, after the tokens and the mel.
An aligner's output, reduced to what a duration model trains on: for item
``<item_id>``, the file ``<durations_dir>/<item_id>.durations`` holds one
integer per token (mel frames, whitespace-separated), checked to count the
sample's tokens and to sum to its mel frames; anything else skips the sample with
stage "durations" and says which. Not cached: the file is a few hundred bytes,
and it is keyed by the entry, not by the audio.

TextGrids are not read: an aligner's phone tier is in its own phone set
(ARPAbet, or its dictionary's IPA), which need not be this run's tokens one for
one; convert them to this file with the run's tokenizer, where that mapping is
known.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ringfeed.producer.sample import SkipSample

# Longest durations file read, bytes: one integer per token, a few hundred tokens.
MAX_FILE_BYTES = 1 << 20


def read_durations(directory: str, item_id: str, n_tokens: int, n_frames: int) -> np.ndarray:
    """int32 [n_tokens] mel frames per token, summing to n_frames; SkipSample otherwise."""
    path = Path(directory) / f"{item_id}.durations"

    def skip(why: str) -> SkipSample:
        return SkipSample(f"durations {path.name}: {why}", str(path), "durations")

    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise skip(f"larger than {MAX_FILE_BYTES} bytes")
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        raise skip(f"no such file in features.durations_dir={directory}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise skip(f"unreadable ({exc})") from None
    try:
        values = [int(v) for v in text.split()]
    except ValueError:
        raise skip("not whitespace-separated integers") from None
    durations = np.asarray(values, np.int64)
    if len(durations) != n_tokens:
        raise skip(
            f"{len(durations)} durations for {n_tokens} tokens (text truncated, or "
            "another tokenizer)"
        )
    if (durations < 0).any() or int(durations.sum()) != n_frames:
        raise skip(
            f"durations >= 0 summing to {int(durations.sum())}, the mel has {n_frames} "
            "frames (audio trimmed or truncated, or another hop_length)"
        )
    return durations.astype(np.int32)
