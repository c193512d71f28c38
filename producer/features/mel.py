"""Log-mel features, and fitting a waveform to features.max_frames.

Called in producer processes (features.device: producer). The definition is
exactly librosa's, written once in numpy for producers and the stager's batch
mels alike (shared/sample/mel_definition.py: window, padding, frames, Slaney
filterbank, floor), so features computed elsewhere can be checked against it;
no librosa import on the producer's path (its first call costs ~2 s).

Here the filterbank is applied as float32 matmuls in [frames, bins] layout, one
per group of neighbouring bands over the bins they weigh. The frames are
windowed and transformed in float64, as librosa does, by the fastest FFT library
of the host (producer/features/fft.py), a block of frames at a time; only the
magnitude is float32. The log-mel is within 1e-4 of librosa's everywhere, next
to LOG_FLOOR included (9.5e-7 on every shipped clip:
tests/unit/test_audio_features.py); mels of another arithmetic never share a
feature cache (STFT_DTYPE). A clip of n samples has 1 + n // hop_length frames.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ringfeed.producer.features.fft import fastest
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config
from ringfeed.shared.config.features import FeaturesConfig
from ringfeed.shared.sample.content import LOG_FLOOR
from ringfeed.shared.sample.mel_definition import (
    clip_frames,
    hann_window,
    slaney_filterbank,
    used_bins,
)

# Frames per FFT call: a block's windowed frames (float64 [64, 1024], 0.5 MiB) and its
# spectrum stay in the core's cache, where a 5 s clip's whole (3.5 MiB each) did not:
# the magnitude of a 5 s clip in 1.69 ms instead of 2.16 here (AVX2 EPYC; 2.03 at 16,
# 1.86 at 128 frames, with the complex64 rounding below).
BLOCK_FRAMES = 64
# Mel bands per matmul: a band weighs only the bins of its triangle, so one matmul per
# MEL_GROUP neighbouring bands over their bins does 3,272 multiply-adds a frame instead
# of the dense 29,760 (80 bands, 372 bins): 0.19 ms instead of 0.37 for a 5 s clip here
# (0.31 ms at 4 bands a group, where the calls cost more than the bins they skip).
MEL_GROUP = 8
# (first band, end band, first bin, end bin, weights float32 [bins, bands]).
BandGroup = tuple[int, int, int, int, np.ndarray]


def mel_filterbank(cfg: Config) -> np.ndarray:
    """Slaney mel filterbank, float32 [n_mels, n_fft // 2 + 1], read-only: the one of
    shared/sample/mel_definition.py, which the stager's batch mels use too."""
    return slaney_filterbank(cfg.audio.sample_rate, cfg.features)


@functools.lru_cache(maxsize=8)
def _band_groups(sample_rate: int, f: FeaturesConfig) -> tuple[BandGroup, ...]:
    """The filterbank as MEL_GROUP neighbouring bands at a time, each with only the bins
    they weigh: (first band, end band, first bin, end bin, filterbank.T[bins, bands]
    float32 contiguous, read-only). A group whose bands weigh no bin (librosa's "empty
    filters") has no bins, and its bands come out 0 (LOG_FLOOR after the log)."""
    fb = slaney_filterbank(sample_rate, f)
    groups = []
    for first in range(0, f.n_mels, MEL_GROUP):
        end = min(f.n_mels, first + MEL_GROUP)
        used = np.flatnonzero(fb[first:end].any(axis=0))
        lo, hi = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 0)
        weights = np.ascontiguousarray(fb[first:end, lo:hi].T)
        weights.setflags(write=False)
        groups.append((first, end, lo, hi, weights))
    return tuple(groups)


class _WorkBuffers(threading.local):
    """One set of work arrays per thread (a producer has one), grown to the largest
    clip seen and reused: fresh multi-MB arrays per clip cost page faults, ~40 % of
    log_mel on the shipped clips (the padded wave, a block's windowed frames and
    spectrum, and the magnitude [frames, bins])."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
        """An array of `shape` and `dtype` (a view of this thread's buffer `name`)."""
        size = int(np.prod(shape))
        buf = self.arrays.get(name)
        if buf is None or buf.size < size:
            buf = self.arrays[name] = np.empty(
                max(size, 2 * (0 if buf is None else buf.size)), dtype
            )
        return buf[:size].reshape(shape)


_work = _WorkBuffers()


def stft_magnitude(wave: np.ndarray, f: FeaturesConfig, bins: int | None = None) -> np.ndarray:
    """float32 [n] -> |STFT| float32 [1 + n // hop_length, bins or n_fft // 2 + 1], a new array.

    librosa.stft's definition (center=True, zero padding of n_fft // 2 on both
    sides, periodic Hann), windowed and transformed in float64 as librosa does, by
    the host's fastest FFT (producer/features/fft.py), without librosa's ~2 s first-call
    import of scipy.signal and numba, which set the first batch's latency
    (benchmarks/first_batch.py). Only the magnitude is rounded to float32.
    """
    return _magnitude(wave, f, bins).copy()


def _magnitude(wave: np.ndarray, f: FeaturesConfig, bins: int | None) -> np.ndarray:
    """stft_magnitude in this thread's work buffers: valid until its next call.

    The frames go through the FFT BLOCK_FRAMES at a time, and each block's spectrum is
    rounded to complex64 before its magnitude: rounding the real and imaginary parts
    moves |X| by ~1 float32 ulp of |X| itself (2e-7 relative at most on the shipped
    clips), unlike a float32 FFT, whose error is relative to the whole frame's energy."""
    _, rfft = fastest(f.n_fft, f.cache_dir)  # this host's library: producer/features/fft.py
    half, n = f.n_fft // 2, len(wave)
    n_out, bins = 1 + n // f.hop_length, bins or half + 1
    padded = _work.get("padded", (n + 2 * half,))
    padded[:half], padded[half : half + n], padded[half + n :] = 0, wave, 0
    frames = np.lib.stride_tricks.sliding_window_view(padded, f.n_fft)[:: f.hop_length]
    assert frames.shape[0] == n_out
    window = hann_window(f.n_fft, f.win_length)
    windowed = _work.get("windowed", (BLOCK_FRAMES, f.n_fft), np.float64)
    spectrum = _work.get("spectrum", (BLOCK_FRAMES, half + 1), np.complex128)
    narrow = _work.get("narrow", (BLOCK_FRAMES, bins), np.complex64)
    magnitude = _work.get("magnitude", (n_out, bins))
    for start in range(0, n_out, BLOCK_FRAMES):
        k = min(BLOCK_FRAMES, n_out - start)
        np.multiply(frames[start : start + k], window, out=windowed[:k])
        spec = rfft(windowed[:k], spectrum[:k])
        np.copyto(narrow[:k], spec[:, :bins], casting="same_kind")
        np.abs(narrow[:k], out=magnitude[start : start + k])
    return magnitude


def _to_log_mel(magnitude: np.ndarray, cfg: Config) -> np.ndarray:
    """|STFT| float32 [frames, bins] -> log-mel float32 [frames, n_mels], a new array: one
    matmul per group of neighbouring bands over the bins they use (_band_groups)."""
    mel = np.empty((magnitude.shape[0], cfg.features.n_mels), np.float32)
    for first, end, lo, hi, weights in _band_groups(cfg.audio.sample_rate, cfg.features):
        np.matmul(magnitude[:, lo:hi], weights, out=mel[:, first:end])
    return np.log(np.maximum(mel, np.float32(LOG_FLOOR), out=mel), out=mel)


def log_mel(wave: np.ndarray, cfg: Config) -> np.ndarray:
    """Waveform float32 [n] at audio.sample_rate -> log-mel float32 [1 + n // hop, n_mels]."""
    bins = used_bins(cfg.audio.sample_rate, cfg.features)
    return _to_log_mel(_magnitude(wave, cfg.features, bins), cfg)


def log_mel_energy(wave: np.ndarray, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """Waveform float32 [n] -> (log-mel float32 [frames, n_mels] as log_mel's, energy
    float32 [frames]): energy is the L2 norm of each frame's STFT magnitude over the
    bins the mel uses (<= fmax), from the same STFT, computed once (features.energy)."""
    bins = used_bins(cfg.audio.sample_rate, cfg.features)
    magnitude = _magnitude(wave, cfg.features, bins)
    energy = np.sqrt(np.einsum("fb,fb->f", magnitude, magnitude, dtype=np.float32))
    return _to_log_mel(magnitude, cfg), energy


def n_frames(n_samples: int, cfg: Config) -> int:
    """Frames librosa gives for n_samples (center=True)."""
    return clip_frames(n_samples, cfg.features.hop_length)


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
