"""Log-mel features, and fitting a waveform to features.max_frames.

Called in producer processes (features.device: producer). The definition is
exactly librosa's, so features computed elsewhere can be checked against it::

    mel = librosa.feature.melspectrogram(
        y=wave, sr=sample_rate, n_fft=n_fft, hop_length=hop_length,
        win_length=win_length, window="hann", center=True, pad_mode="constant",
        power=1.0, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=False, norm="slaney")
    log_mel = np.log(np.maximum(mel, log_floor)).T        # [n_frames, n_mels]

Here the filterbank is built once per process (librosa rebuilds it on every
call) and applied as one float32 matmul in [frames, bins] layout; a test
holds the result to librosa within 1e-4 in log space. A clip of n samples has 1 + n // hop_length
frames.
"""

from __future__ import annotations

import functools

import numpy as np

from producer.sample import SkipSample
from shared.config import Config, FeaturesConfig


@functools.lru_cache(maxsize=8)
def _filterbank(sample_rate: int, f: FeaturesConfig) -> np.ndarray:
    import librosa  # deferred so importing this module stays cheap

    fb = librosa.filters.mel(
        sr=sample_rate, n_fft=f.n_fft, n_mels=f.n_mels, fmin=f.fmin, fmax=f.fmax,
        htk=False, norm="slaney", dtype=np.float32,
    )  # fmt: skip
    fb.setflags(write=False)
    return fb


def mel_filterbank(cfg: Config) -> np.ndarray:
    """Slaney mel filterbank, float32 [n_mels, n_fft // 2 + 1], read-only.

    The same matrix for producers and the stager's on-device mel
    (features.device: stager), so the two modes agree.
    """
    return _filterbank(cfg.audio.sample_rate, cfg.features)


def stft_magnitude(wave: np.ndarray, f: FeaturesConfig) -> np.ndarray:
    """float32 [n] -> |STFT| float32 [1 + n // hop_length, n_fft // 2 + 1] (a transposed view).

    center=True with zero ("constant") padding of n_fft // 2 on both sides, as librosa.
    librosa.stft itself is used: a numpy rfft of the framed signal was no faster and
    differs from it by float32 rounding, up to 1.5e-4 in log space in bins near
    log_floor.
    """
    import librosa

    spec = librosa.stft(
        wave, n_fft=f.n_fft, hop_length=f.hop_length, win_length=f.win_length,
        window="hann", center=True, pad_mode="constant",
    )  # fmt: skip
    return np.abs(spec).T


def log_mel(wave: np.ndarray, cfg: Config) -> np.ndarray:
    """Waveform float32 [n] at audio.sample_rate -> log-mel float32 [1 + n // hop, n_mels]."""
    mag = stft_magnitude(wave, cfg.features)
    mel = mag @ mel_filterbank(cfg).T
    return np.log(np.maximum(mel, np.float32(cfg.features.log_floor)), out=mel)


def n_frames(n_samples: int, cfg: Config) -> int:
    """Frames librosa gives for n_samples (center=True)."""
    return 1 + n_samples // cfg.features.hop_length


def fit_length(wave: np.ndarray, cfg: Config, path: str = "") -> tuple[np.ndarray, bool]:
    """Apply features.on_too_long -> (wave float32 [n], truncated).

    A clip fits when 1 + n // hop_length <= max_frames, i.e. n < cfg.max_samples.
    "truncate" cuts it to cfg.max_samples - 1 samples, the longest length with
    max_frames frames; "skip" raises SkipSample naming the key to change.
    """
    limit = cfg.max_samples
    if len(wave) < limit:
        return wave, False
    if cfg.features.on_too_long == "truncate":
        return wave[: limit - 1], True
    raise SkipSample(
        f"clip has {n_frames(len(wave), cfg)} frames > features.max_frames="
        f"{cfg.features.max_frames}: raise max_frames or set features.on_too_long: truncate",
        path,
    )
