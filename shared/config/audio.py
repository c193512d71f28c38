"""The configuration's audio section: how every clip is decoded and shaped.

Part of the one configuration (shared/config/config.py); validates its own keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ringfeed.shared.config.loader import at_least_one, check

# soxr "HQ" is 20-bit precision, transparent for 16-bit speech and ~2x faster than "VHQ":
# every resample's, no key; part of the feature cache's settings
# (shared/corpus/feature_cache.py).
RESAMPLE_QUALITY = "HQ"


@dataclass(frozen=True)
class AudioConfig:
    # Every clip is resampled to this rate (Hz, soxr).
    sample_rate: int = 22050
    # Trim leading and trailing silence (librosa.effects.trim, trim_top_db).
    trim_silence: bool = False
    # Silence threshold of trim_silence, dB below the peak.
    trim_top_db: float = 60.0
    # peak: scale each clip to peak_level; none: as decoded.
    normalize: Literal["none", "peak"] = "peak"
    # The peak of a peak-normalized clip.
    peak_level: float = 0.95
    # Shorter clips (after trimming) are skipped, seconds.
    min_duration_s: float = 0.1
    # Longer audio (by its file header) is rejected before it is decoded, seconds. With
    # features.on_too_long: skip, audio longer than a slot is rejected the same way.
    max_duration_s: float = 60.0

    def __post_init__(self) -> None:
        at_least_one("audio", sample_rate=self.sample_rate)
        check(self.max_duration_s > 0, "audio.max_duration_s", "must be > 0 seconds")
