"""The stager's batch log-mel in TensorFlow (devices.stager_framework: tf).

The face, the tolerance and why float64: consumer/stager/gpu_mel.py; the definition:
shared/sample/mel_definition.py. Imported by consumer/devices.py only, after the
stager's device is set and TensorFlow imported there (import_tensorflow).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ringfeed.consumer.stager.gpu_mel import checked_batch
from ringfeed.shared.config import Config
from ringfeed.shared.sample.mel_definition import mel_definition


class TfLogMel:
    """Batch log-mel in TensorFlow (gpu_mel.BatchLogMel), on the device TensorFlow
    places ops on: GPU:0 when it sees one (the whole batch at once), else the CPU (a
    row at a time: gpu_mel.py). One trace serves every shape (traces counts them);
    with jit_compile each bucket's shape compiles once under XLA."""

    framework = "tf"

    def __init__(self, cfg: Config, jit_compile: bool = False) -> None:
        d = self.definition = mel_definition(cfg)
        # TensorFlow runs float32 matmuls in TF32 on Ampere and later GPUs by default:
        # its 10-bit mantissa would move a band by ~1e-3. The stager's process runs no
        # other TensorFlow, so the switch, which is process-wide, costs nothing else.
        tf.config.experimental.enable_tensor_float_32_execution(False)
        self._window = tf.constant(d.window, tf.float64)
        self._filterbank = tf.constant(d.filterbank)
        self.per_row = not tf.config.list_logical_devices("GPU")
        self.traces = 0
        signature = [
            tf.TensorSpec([None, None], tf.float32, name="waves"),
            tf.TensorSpec([None], tf.int32, name="wave_lens"),
            tf.TensorSpec([None], tf.int32, name="mel_lens"),
        ]
        self._fn = tf.function(self._log_mel, input_signature=signature, jit_compile=jit_compile)

    def __call__(self, waves: np.ndarray, wave_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mel float32 [B, S // hop, n_mels], mel_lens int32 [B]), numpy; gpu_mel.py."""
        waves, wave_lens = checked_batch(waves, wave_lens)
        mel_lens = self.definition.mel_lens(wave_lens, self.definition.batch_frames(waves.shape[1]))
        return self._fn(waves, wave_lens, mel_lens).numpy(), mel_lens

    def _log_mel(self, waves: tf.Tensor, wave_lens: tf.Tensor, mel_lens: tf.Tensor) -> tf.Tensor:
        self.traces += 1  # Python runs only while TensorFlow traces
        if not self.per_row:
            return self._rows(waves, wave_lens, mel_lens)
        return tf.map_fn(
            lambda row: self._rows(*(x[None] for x in row))[0],
            (waves, wave_lens, mel_lens),
            fn_output_signature=tf.float32,
            parallel_iterations=1,
        )

    def _rows(self, waves: tf.Tensor, wave_lens: tf.Tensor, mel_lens: tf.Tensor) -> tf.Tensor:
        """The log-mel of rows of the batch, float32 [rows, S // hop, n_mels]."""
        d = self.definition
        # Zero anything past the true length: slot padding need not be zero, and
        # librosa sees the clip followed by exactly n_fft // 2 zeros.
        n_samples = tf.shape(waves)[1]
        n_frames = n_samples // d.hop_length
        inside = tf.sequence_mask(wave_lens, n_samples, dtype=waves.dtype)
        padded = tf.pad(waves * inside, [[0, 0], [d.pad, d.pad]])
        # 1 + S // hop frames fit; the last one is never needed. Framed in float32 (a
        # copy, exact) and cast after: tf.signal.frame of float64 took 2x as long here.
        frames = tf.signal.frame(padded, d.n_fft, d.hop_length)[:, :n_frames]
        windowed = tf.cast(frames, tf.float64) * self._window
        spectrum = tf.signal.rfft(windowed)[:, :, : d.bins]
        # |z| from its parts: tf.abs of complex128 took as long as the FFT itself on
        # this project's CPU (78 against 77 ms for 8,000 frames; 3 ms this way).
        re, im = tf.math.real(spectrum), tf.math.imag(spectrum)
        magnitude = tf.sqrt(tf.cast(re * re + im * im, tf.float32))
        mel = tf.matmul(magnitude, self._filterbank)
        log_mel = tf.math.log(tf.maximum(mel, d.log_floor))
        inside_frames = tf.sequence_mask(mel_lens, n_frames, dtype=log_mel.dtype)
        return log_mel * inside_frames[:, :, None]
