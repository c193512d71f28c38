"""What a producer's per-sample function returns, and how it says no.

Called in producer processes only. Arrays are unpadded; the worker pads them
into the fixed-shape slot (shared/memory/ring.py) without an extra copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sample:
    """One prepared sample.

    tokens: int32 [text_len]; mel: float32 [n_frames, n_mels] (features.device:
    producer) or None; wave: float32 [n_samples] at audio.sample_rate
    (features.device: stager) or None. truncated is set when
    features.on_too_long: truncate cut the clip. marks: the clip's audio marks
    (shared/sample/marks.py AUDIO bits: near-silent, clipped). fields: the optional fields of the
    declared schema (shared/sample/schema.py) by name: pitch, voiced, energy and the
    user's, unpadded (axis 0 the true length).
    """

    item_id: str
    tokens: np.ndarray
    mel: np.ndarray | None = None
    wave: np.ndarray | None = None
    truncated: bool = False
    marks: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    fields: dict[str, np.ndarray] = field(default_factory=dict)

    def array(self, name: str) -> np.ndarray:
        """The unpadded array of field `name` (tokens, mel, wave or an optional one)."""
        if name in ("tokens", "mel", "wave"):
            return getattr(self, name)
        return self.fields[name]


class SkipSample(Exception):  # noqa: N818 - it is a verdict, not an error of ours
    """The input cannot be used; reason is a short specific sentence for the quarantine,
    stage where it was found (the pipeline fills it in when the raiser did not)."""

    def __init__(self, reason: str, path: str = "", stage: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path
        self.stage = stage
