"""Pitch (f0) and voicing per mel frame, for features.pitch; called in producers.

The estimator is WORLD's DIO refined by StoneMask (pyworld, the WORLD vocoder's
own bindings; what FastSpeech 2 implementations train on): ~13 ms per second of
22.05 kHz audio on one core here, where WORLD's Harvest took ~150 ms and
librosa's pYIN costs seconds; YIN (librosa.yin) is as fast but gives no voicing
decision. DIO's frame times are k x frame_period, which with frame_period =
hop_length / sample_rate are the mel's frame centres (center=True), so frame k
of the pitch is frame k of the mel; its frame count is cut or padded (with the
last unvoiced value, 0) to the mel's exactly. f0 is in Hz, 0 where unvoiced;
voiced is 1 where f0 > 0.

F0 extraction dominates uncached producers (coqui-ai/TTS#2665): the feature
cache keeps the pitch of each whole utterance (producer/features/extra_fields.py).
"""

from __future__ import annotations

import numpy as np

from ringfeed.shared.config import Config

# DIO's search range, Hz: WORLD's default floor 71 lowered to 65 (a low male voice)
# and a ceiling of 800 (a child's or a singer's). Part of PROSODY_VERSION.
F0_FLOOR_HZ, F0_CEIL_HZ = 65.0, 800.0
# Bump when what pitch() or energy computes changes: cached prosody is keyed by it.
PROSODY_VERSION = "dio-stonemask-65-800-v1"


def pitch(wave: np.ndarray, n_frames: int, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """Waveform float32 [n] at audio.sample_rate -> (f0 float32 [n_frames] Hz, 0 where
    unvoiced; voiced uint8 [n_frames]), frame k centred on sample k x hop_length."""
    import pyworld  # here: producers without features.pitch never load it

    sr = cfg.audio.sample_rate
    x = np.asarray(wave, dtype=np.float64)
    period_ms = 1000.0 * cfg.features.hop_length / sr
    f0, times = pyworld.dio(x, sr, f0_floor=F0_FLOOR_HZ, f0_ceil=F0_CEIL_HZ, frame_period=period_ms)
    f0 = pyworld.stonemask(x, f0, times, sr)
    out = np.zeros(n_frames, np.float32)
    m = min(n_frames, len(f0))
    out[:m] = f0[:m]
    return out, (out > 0).astype(np.uint8)
