"""Log-mel features for a whole batch of waveforms on the stager's device.

With ``features.device: stager`` producers write resampled waveforms and the
stager turns a whole batch into log-mels in one TensorFlow call on GPU:0. The
result must match what producers compute (librosa's
``melspectrogram(center=True, pad_mode="constant", power=1.0, htk=False,
norm="slaney")`` then ``log(max(mel, LOG_FLOOR))``: producer/features/mel.py), so
the two modes train the same model. How it matches:

- center=True is emulated by padding n_fft // 2 zeros on both sides
  (constant padding, as pad_mode="constant").
- The window is librosa's periodic Hann of win_length, zero-padded to n_fft
  and centred, exactly as librosa.filters.get_window + util.pad_center.
- The filterbank is librosa's Slaney one, not
  tf.signal.linear_to_mel_weight_matrix (HTK scale, no Slaney area norm):
  that would differ by up to ~2 in log space.
- The frames are windowed and transformed in float64, as librosa and the
  producers do; only the magnitude is float32. A float32 window and FFT round
  to ~1e-7 of a frame's energy, which in the quietest bands of a loud frame,
  next to LOG_FLOOR, was 1.1e-3 in log space on the shipped LJSpeech clips;
  in float64 the stager's mels are within 1e-6 of librosa's on every shipped
  clip (benchmarks/mel_parity.py, docs/benchmarks.md#mel-parity), and
  tests hold MEL_ATOL everywhere within the true length.
"""

from __future__ import annotations

import librosa
import numpy as np
import tensorflow as tf

from ringfeed.shared.config import Config
from ringfeed.shared.sample.content import LOG_FLOOR

# Absolute tolerance in natural-log space against librosa's (and the producers')
# log-mel on every bin within the true length, next to LOG_FLOOR included (9.5e-7
# measured: docs/benchmarks.md#mel-parity; tests/unit/test_gpu_mel.py).
MEL_ATOL = 1e-4


def librosa_window(cfg: Config) -> np.ndarray:
    """librosa's analysis window: periodic Hann of win_length, centred in n_fft, float64."""
    f = cfg.features
    window = librosa.filters.get_window("hann", f.win_length, fftbins=True)
    return librosa.util.pad_center(window, size=f.n_fft).astype(np.float64)


def slaney_filterbank(cfg: Config) -> np.ndarray:
    """librosa's Slaney mel filterbank, [n_mels, n_fft // 2 + 1] float32."""
    f = cfg.features
    return librosa.filters.mel(
        sr=cfg.audio.sample_rate,
        n_fft=f.n_fft,
        n_mels=f.n_mels,
        fmin=f.fmin,
        fmax=f.fmax,
        htk=False,
        norm="slaney",
    ).astype(np.float32)


class TfLogMel:
    """Batch log-mel in TensorFlow, matching the producers' librosa features.

    Called by the stager process once per batch. ``__call__(waves, wave_lens)``
    takes waves float32 [B, S] (samples at audio.sample_rate, zero beyond
    wave_lens; S = frames x hop_length of the batch's shape, cfg.max_samples
    without length buckets) and wave_lens int32 [B] (samples), and returns
    (mel float32 [B, S // hop_length, n_mels] natural-log mel, zero beyond
    mel_lens; mel_lens int32 [B] = min(1 + wave_len // hop_length, S // hop_length)).
    One trace serves every shape; under XLA each bucket's shape compiles once.
    """

    def __init__(self, cfg: Config, jit_compile: bool = False) -> None:
        f = cfg.features
        self.n_fft = f.n_fft
        self.hop_length = f.hop_length
        self.log_floor = LOG_FLOOR
        self._window = tf.constant(librosa_window(cfg), tf.float64)
        filterbank = slaney_filterbank(cfg)
        # FFT bins above fmax weigh nothing in any band: the magnitude and the matmul
        # stop at the last one used (373 of 513 bins with fmax 8 kHz at 22.05 kHz).
        self.bins = int(np.flatnonzero(filterbank.any(axis=0))[-1]) + 1
        # [bins, n_mels] so a batch of [B, frames, bins] magnitudes maps with one matmul.
        self._filterbank = tf.constant(filterbank[:, : self.bins].T)
        signature = [
            tf.TensorSpec([None, None], tf.float32, name="waves"),
            tf.TensorSpec([None], tf.int32, name="wave_lens"),
        ]
        self._fn = tf.function(self._log_mel, input_signature=signature, jit_compile=jit_compile)

    def __call__(self, waves: tf.Tensor | np.ndarray, wave_lens: tf.Tensor | np.ndarray):
        """(mel [B, max_frames, n_mels] float32, mel_lens [B] int32); see the class doc."""
        return self._fn(waves, wave_lens)

    def _log_mel(self, waves: tf.Tensor, wave_lens: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        # Zero anything past the true length: slot padding need not be zero, and
        # librosa sees the clip followed by exactly n_fft // 2 zeros.
        n_samples = tf.shape(waves)[1]
        max_frames = n_samples // self.hop_length
        inside = tf.sequence_mask(wave_lens, n_samples, dtype=waves.dtype)
        half = self.n_fft // 2
        padded = tf.pad(waves * inside, [[0, 0], [half, half]])
        # 1 + S // hop frames fit; the last one is never needed. Framed in float32 (a
        # copy, exact) and cast after: tf.signal.frame of float64 took 2x as long here.
        frames = tf.signal.frame(padded, self.n_fft, self.hop_length)[:, :max_frames]
        windowed = tf.cast(frames, tf.float64) * self._window
        spectrum = tf.signal.rfft(windowed)[:, :, : self.bins]
        # |z| from its parts: tf.abs of complex128 took as long as the FFT itself on
        # this project's CPU (78 against 77 ms for 8,000 frames; 3 ms this way).
        re, im = tf.math.real(spectrum), tf.math.imag(spectrum)
        magnitude = tf.sqrt(tf.cast(re * re + im * im, tf.float32))
        mel = tf.matmul(magnitude, self._filterbank)
        log_mel = tf.math.log(tf.maximum(mel, self.log_floor))
        mel_lens = tf.minimum(1 + wave_lens // self.hop_length, max_frames)
        inside_frames = tf.sequence_mask(mel_lens, max_frames, dtype=log_mel.dtype)
        return log_mel * inside_frames[:, :, None], mel_lens
