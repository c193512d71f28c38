"""The stager's batch log-mel in numpy, on the CPU: where its device's mels fail mid-run.

The face, the tolerance and why float64: consumer/stager/gpu_mel.py; the definition:
shared/sample/mel_definition.py, as the torch, JAX and TensorFlow mels take it. The
assembly (consumer/stager/assembly.py) switches to this, once and loudly, when the
framework's call raises anything but a malformed batch (MelInputError): a GPU out of
memory or lost, a driver error. The batch in hand and every later one are then
computed here, a row at a time (a row's float64 frames stay in cache), within
gpu_mel.MEL_ATOL of the others: nothing is lost, nothing delivered twice, and the run
goes on at the CPU's pace (~0.1-0.2 s a [32, 800 x 256] batch on one core here).
"""

from __future__ import annotations

import numpy as np

from ringfeed.consumer.stager.gpu_mel import checked_batch
from ringfeed.shared.config import Config
from ringfeed.shared.sample.mel_definition import mel_definition


class NumpyLogMel:
    """Batch log-mel in numpy (gpu_mel.BatchLogMel), on the CPU."""

    framework = "numpy"

    def __init__(self, cfg: Config) -> None:
        self.definition = mel_definition(cfg)

    def __call__(self, waves: np.ndarray, wave_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mel float32 [B, S // hop, n_mels], mel_lens int32 [B]); gpu_mel.py."""
        waves, wave_lens = checked_batch(waves, wave_lens)
        d = self.definition
        n_samples = waves.shape[1]
        n_frames = d.batch_frames(n_samples)
        mel_lens = d.mel_lens(wave_lens, n_frames)
        mel = np.zeros((len(waves), n_frames, d.n_mels), np.float32)
        padded = np.zeros(n_samples + 2 * d.pad, np.float32)
        for row, (n, frames) in enumerate(zip(wave_lens.tolist(), mel_lens.tolist(), strict=True)):
            # Anything past the true length is zero, as librosa sees the clip followed by
            # exactly n_fft // 2 zeros.
            padded[d.pad : d.pad + n] = waves[row, :n]
            padded[d.pad + n :] = 0
            starts = np.arange(frames) * d.hop_length
            windowed = padded[starts[:, None] + np.arange(d.n_fft)].astype(np.float64)
            windowed *= d.window
            spectrum = np.fft.rfft(windowed, axis=1)[:, : d.bins].astype(np.complex64)
            bands = np.abs(spectrum) @ d.filterbank
            mel[row, :frames] = np.log(np.maximum(bands, d.log_floor))
        return mel, mel_lens
