"""The log-mel's one definition: window, padding, frames, filterbank and floor, in numpy.

Producers compute a clip's log-mel (producer/features/mel.py, features.device:
producer) and the stager a whole batch's in torch, JAX or TensorFlow
(consumer/stager/gpu_mel.py, features.device: stager); every one of them takes its
arrays and numbers from here, so the two modes compute one function, librosa's::

    mel = librosa.feature.melspectrogram(
        y=wave, sr=sample_rate, n_fft=n_fft, hop_length=hop_length,
        win_length=win_length, window="hann", center=True, pad_mode="constant",
        power=1.0, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=False, norm="slaney")
    log_mel = np.log(np.maximum(mel, LOG_FLOOR)).T        # [n_frames, n_mels]

- center=True with pad_mode="constant": n_fft // 2 zeros on both sides of the clip
  (``pad``); frame k starts at sample k * hop_length of the padded clip, and a clip
  of n samples has 1 + n // hop_length frames (``clip_frames``).
- The window is librosa's periodic Hann of win_length, zero-padded to n_fft in the
  middle (get_window("hann", fftbins=True) then util.pad_center), float64: a float32
  window alone moves the quietest bands by ~2e-4 in log space.
- The filterbank is librosa's Slaney one (htk=False, norm="slaney"), written here in
  numpy: not tf.signal.linear_to_mel_weight_matrix (HTK scale, no area norm), which
  differs by up to ~2 in log space. FFT bins above fmax weigh nothing in any band,
  so the magnitude stops at ``used_bins`` (372 of 513 with fmax 8 kHz at 22.05 kHz).
- The floor is LOG_FLOOR (shared/sample/content.py), applied to the magnitude mel.

No framework and no librosa here (librosa's first call costs a producer ~2 s); the
parity tests compare with librosa itself (tests/support/audio.py librosa_log_mel).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ringfeed.shared.sample.content import LOG_FLOOR

if TYPE_CHECKING:
    from ringfeed.shared.config import Config
    from ringfeed.shared.config.features import FeaturesConfig

# The producers' STFT arithmetic (producer/features/mel.py): part of the feature cache's
# settings (shared/corpus/feature_cache.py), so mels of another arithmetic (the float32
# FFT that was 1e-3 off next to the floor) are not mixed with these.
STFT_DTYPE = "float64"
# Slaney's mel scale (librosa.hz_to_mel, htk=False): linear below 1 kHz, log above.
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(f: np.ndarray | float) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    log_part = _MIN_LOG_MEL + np.log(np.maximum(f, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(f >= _MIN_LOG_HZ, log_part, f / _F_SP)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(
        m >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL)), _F_SP * m
    )


@functools.lru_cache(maxsize=8)
def slaney_filterbank(sample_rate: int, f: FeaturesConfig) -> np.ndarray:
    """librosa.filters.mel(htk=False, norm="slaney"): float32 [n_mels, n_fft // 2 + 1],
    computed in float64 as librosa does, read-only."""
    fft_hz = np.fft.rfftfreq(n=f.n_fft, d=1.0 / sample_rate)
    mel_hz = _mel_to_hz(np.linspace(_hz_to_mel(f.fmin), _hz_to_mel(f.fmax), f.n_mels + 2))
    width = np.diff(mel_hz)
    ramps = np.subtract.outer(mel_hz, fft_hz)
    rising, falling = -ramps[:-2] / width[:-1, None], ramps[2:] / width[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (mel_hz[2 : f.n_mels + 2] - mel_hz[: f.n_mels]))[:, None]  # Slaney norm
    fb = weights.astype(np.float32)
    fb.setflags(write=False)
    return fb


@functools.lru_cache(maxsize=8)
def hann_window(n_fft: int, win_length: int) -> np.ndarray:
    """Periodic Hann of win_length, zero-padded to n_fft in the middle: float64 [n_fft],
    read-only."""
    n = np.arange(win_length)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / win_length)
    left = (n_fft - win_length) // 2
    window = np.pad(window, (left, n_fft - win_length - left))
    window.setflags(write=False)
    return window


@functools.lru_cache(maxsize=8)
def used_bins(sample_rate: int, f: FeaturesConfig) -> int:
    """b: FFT bins at or above b have zero weight in every band (above fmax), so the
    magnitude stops there: with fmax 8 kHz at 22.05 kHz, 372 of 513 bins."""
    used = np.flatnonzero(slaney_filterbank(sample_rate, f).any(axis=0))
    return int(used[-1]) + 1 if used.size else 1


def clip_frames(n_samples: int, hop_length: int) -> int:
    """Frames librosa gives for a clip of n_samples (center=True)."""
    return 1 + n_samples // hop_length


@dataclass(frozen=True, eq=False)
class MelDefinition:
    """The log-mel of features.* as a batch transform needs it (the stager's torch, JAX
    and TensorFlow mels build their constants from this, and nothing else).

    window float64 [n_fft]; filterbank float32 [bins, n_mels], the Slaney filterbank
    transposed and cut at used_bins, so [B, frames, bins] magnitudes map with one
    matmul; both read-only. pad: zeros on each side of a clip (center=True).
    """

    n_fft: int
    hop_length: int
    n_mels: int
    window: np.ndarray
    filterbank: np.ndarray
    log_floor: float = LOG_FLOOR

    @property
    def pad(self) -> int:
        return self.n_fft // 2

    @property
    def bins(self) -> int:
        return int(self.filterbank.shape[0])

    def batch_frames(self, n_samples: int) -> int:
        """Frames of a batch of waveforms [B, n_samples]: n_samples // hop_length, as a
        batch of max_frames frames holds waveforms of max_frames x hop_length samples,
        and a clip that fits has fewer (features.max_frames, producer/features/mel.py
        fit_length)."""
        return n_samples // self.hop_length

    def mel_lens(self, wave_lens: np.ndarray, n_frames: int) -> np.ndarray:
        """int32 [B] true frames of clips of wave_lens samples in a batch of n_frames:
        min(1 + wave_len // hop_length, n_frames)."""
        lens = 1 + np.asarray(wave_lens, np.int64) // self.hop_length
        return np.minimum(lens, n_frames).astype(np.int32)


@functools.lru_cache(maxsize=8)
def _definition(sample_rate: int, f: FeaturesConfig) -> MelDefinition:
    bins = used_bins(sample_rate, f)
    filterbank = np.ascontiguousarray(slaney_filterbank(sample_rate, f)[:, :bins].T)
    filterbank.setflags(write=False)
    window = hann_window(f.n_fft, f.win_length)
    return MelDefinition(f.n_fft, f.hop_length, f.n_mels, window, filterbank)


def mel_definition(cfg: Config) -> MelDefinition:
    """The log-mel of cfg.features at cfg.audio.sample_rate (one object per settings)."""
    return _definition(cfg.audio.sample_rate, cfg.features)
