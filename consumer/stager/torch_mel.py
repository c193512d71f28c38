"""The stager's batch log-mel in PyTorch (devices.stager_framework: torch).

The face, the tolerance and why float64: consumer/stager/gpu_mel.py; the definition:
shared/sample/mel_definition.py. Imported by consumer/devices.py only, after the
stager's device is set (CUDA_VISIBLE_DEVICES), which also picks the torch device.
Eager ops, no graph: nothing is traced or compiled, whatever the batch's shape.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ringfeed.consumer.stager.gpu_mel import checked_batch
from ringfeed.shared.config import Config
from ringfeed.shared.sample.mel_definition import mel_definition

# Rows a CPU computes at once (a GPU: the whole batch): a row's float64 frames stay in
# cache (consumer/stager/gpu_mel.py).
CPU_ROWS = 1


class TorchLogMel:
    """Batch log-mel in PyTorch (gpu_mel.BatchLogMel) on `device` ("cuda" for the
    stager's GPU, "cpu"). The filterbank matmul is float32 at full precision:
    torch.backends.cuda.matmul.allow_tf32 is off unless a caller turns it on, and
    nothing in the stager's process does."""

    framework = "torch"

    def __init__(self, cfg: Config, device: str = "cpu") -> None:
        d = self.definition = mel_definition(cfg)
        self.device = torch.device(device)
        self.rows = CPU_ROWS if self.device.type == "cpu" else None
        # Copies: torch warns on the definition's read-only arrays, and owns its own.
        self._window = torch.tensor(d.window, dtype=torch.float64, device=self.device)
        self._filterbank = torch.tensor(d.filterbank, dtype=torch.float32, device=self.device)
        self._buffers: dict[str, torch.Tensor] = {}

    def __call__(self, waves: np.ndarray, wave_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mel float32 [B, S // hop, n_mels], mel_lens int32 [B]), numpy; gpu_mel.py."""
        waves, wave_lens = checked_batch(waves, wave_lens)
        d = self.definition
        n_frames = d.batch_frames(waves.shape[1])
        mel_lens = d.mel_lens(wave_lens, n_frames)
        mel = np.empty((len(waves), n_frames, d.n_mels), np.float32)
        rows = self.rows or max(len(waves), 1)
        with torch.inference_mode():
            to = self.device
            waves_t, wave_lens_t, mel_lens_t = (
                torch.from_numpy(x).to(to) for x in (waves, wave_lens, mel_lens)
            )
            for i in range(0, len(waves), rows):
                part = slice(i, i + rows)
                mel[part] = self._log_mel(waves_t[part], wave_lens_t[part], mel_lens_t[part]).cpu()
        return mel, mel_lens

    def _log_mel(
        self, waves: torch.Tensor, wave_lens: torch.Tensor, mel_lens: torch.Tensor
    ) -> torch.Tensor:
        """The log-mel of some rows of the batch, float32 [rows, S // hop, n_mels], in
        this object's work buffers: valid until its next call."""
        d, (rows, n_samples), to = self.definition, waves.shape, waves.device
        n_frames = d.batch_frames(n_samples)
        # Zero anything past the true length: slot padding need not be zero, and
        # librosa sees the clip followed by exactly n_fft // 2 zeros.
        padded = self._work("padded", (rows, n_samples + 2 * d.pad), torch.float32)
        padded[:, : d.pad], padded[:, d.pad + n_samples :] = 0, 0
        inside = torch.arange(n_samples, device=to) < wave_lens[:, None]
        torch.mul(waves, inside, out=padded[:, d.pad : d.pad + n_samples])
        # Framed as a view of the float32 samples, cast (a copy, exact), windowed in place:
        # float32 times the float64 window in one op took twice as long.
        frames = padded.unfold(1, d.n_fft, d.hop_length)[:, :n_frames]
        windowed = self._work("windowed", (rows, n_frames, d.n_fft), torch.float64)
        windowed.copy_(frames).mul_(self._window)
        spectrum = self._work("spectrum", (rows, n_frames, d.n_fft // 2 + 1), torch.complex128)
        torch.fft.rfft(windowed, out=spectrum)
        # The spectrum rounded to complex64 before its magnitude, as the producers do
        # (producer/features/mel.py): |X| moves by ~1 float32 ulp of |X| itself, and
        # abs of complex128 took as long as the FFT here.
        narrow = self._work("narrow", (rows, n_frames, d.bins), torch.complex64)
        narrow.copy_(spectrum[..., : d.bins])
        magnitude = self._work("magnitude", (rows, n_frames, d.bins), torch.float32)
        torch.abs(narrow, out=magnitude)
        mel = self._work("mel", (rows, n_frames, d.n_mels), torch.float32)
        torch.matmul(magnitude, self._filterbank, out=mel)
        mel.clamp_min_(d.log_floor).log_()
        inside_frames = torch.arange(n_frames, device=to) < mel_lens[:, None]
        return mel.mul_(inside_frames[:, :, None])

    def _work(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of `shape` in this object's buffer `name`, grown to the largest asked
        and reused: fresh multi-MB tensors for each row cost a CPU page faults, and the
        demo's batch took 37-89 ms instead of 35 here (a GPU's caching allocator reuses
        its blocks anyway)."""
        size = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < size:
            buf = self._buffers[name] = torch.empty(size, dtype=dtype, device=self.device)
        return buf[:size].view(shape)
