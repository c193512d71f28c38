"""Log-mel features for a whole batch of waveforms on the stager's device.

With ``features.device: stager`` producers write resampled waveforms and the
stager turns a whole batch into log-mels in one TensorFlow call on GPU:0. The
result must match what producers compute with librosa
(``melspectrogram(center=True, pad_mode="constant", power=1.0, htk=False,
norm="slaney")`` then ``log(max(mel, log_floor))``), so the two modes train the
same model. How it matches:

- center=True is emulated by padding n_fft // 2 zeros on both sides
  (constant padding, as pad_mode="constant").
- The window is librosa's periodic Hann of win_length, zero-padded to n_fft
  and centred, exactly as librosa.filters.get_window + util.pad_center.
- The filterbank is librosa's Slaney one, not
  tf.signal.linear_to_mel_weight_matrix (HTK scale, no Slaney area norm):
  that would differ by up to ~2 in log space.

Tolerance: float32 FFTs in TF and numpy round differently; the error is
relative to the magnitude, so in log space it is small where the mel energy is
well above the floor and grows where the energy approaches log_floor. We
compare frames inside the true length. Measured on LJ001-0001/0002 at the
default features (n_fft 1024, hop 256, 80 mels), max |log difference|:
8.1e-5 on bins with mel >= 1e-4 (96-98 % of bins), 1.6e-5 on bins >= 1e-3,
6.6e-4 over all bins (the worst at the 1e-5 floor). Hence MEL_ATOL on bins
>= MEL_COMPARE_FLOOR and the looser MEL_ATOL_ALL everywhere else.
"""

from __future__ import annotations

import librosa
import numpy as np
import tensorflow as tf

from ringfeed.shared.config import Config
from ringfeed.shared.sample.content import LOG_FLOOR

# Absolute tolerance in natural-log space on frames within the true length and
# bins whose librosa mel >= MEL_COMPARE_FLOOR (measured 8.1e-5; tests/unit/test_gpu_mel.py).
MEL_ATOL = 2e-4
# Below ~1e-4 (80 dB under a full-scale bin) float32 rounding in the FFT
# dominates the magnitude and the log amplifies it.
MEL_COMPARE_FLOOR = 1e-4
# Tolerance on every bin within the true length, floor included (measured 6.6e-4).
MEL_ATOL_ALL = 2e-3


def librosa_window(cfg: Config) -> np.ndarray:
    """librosa's analysis window: periodic Hann of win_length, centred in n_fft, float32."""
    f = cfg.features
    window = librosa.filters.get_window("hann", f.win_length, fftbins=True)
    return librosa.util.pad_center(window, size=f.n_fft).astype(np.float32)


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
        self._window = tf.constant(librosa_window(cfg))
        # [bins, n_mels] so a batch of [B, frames, bins] magnitudes maps with one matmul.
        self._filterbank = tf.constant(slaney_filterbank(cfg).T)
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
        waves = waves * inside
        half = self.n_fft // 2
        padded = tf.pad(waves, [[0, 0], [half, half]])
        stft = tf.signal.stft(
            padded,
            frame_length=self.n_fft,
            frame_step=self.hop_length,
            fft_length=self.n_fft,
            window_fn=lambda length, dtype: tf.cast(self._window, dtype),
            pad_end=False,
        )
        # 1 + S // hop = max_frames + 1 frames; the last one is never needed.
        magnitude = tf.abs(stft[:, :max_frames, :])
        mel = tf.matmul(magnitude, self._filterbank)
        log_mel = tf.math.log(tf.maximum(mel, self.log_floor))
        mel_lens = tf.minimum(1 + wave_lens // self.hop_length, max_frames)
        frames = tf.sequence_mask(mel_lens, max_frames, dtype=log_mel.dtype)
        return log_mel * frames[:, :, None], mel_lens
