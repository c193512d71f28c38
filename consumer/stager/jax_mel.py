"""The stager's batch log-mel in JAX (devices.stager_framework: jax).

The face, the tolerance and why float64: consumer/stager/gpu_mel.py; the definition:
shared/sample/mel_definition.py. Imported by consumer/devices.py only, after the
stager's device is set (CUDA_VISIBLE_DEVICES; JAX_PLATFORMS=cpu without a GPU).

JAX keeps float64 off unless asked: every call runs under jax.enable_x64 (a context,
not the process-wide flag, so a process that also runs JAX for other work keeps its
dtypes). One jitted function, compiled once per batch shape (a bucket's): `traces`
counts the traces.
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ringfeed.consumer.stager.gpu_mel import checked_batch
from ringfeed.shared.config import Config
from ringfeed.shared.sample.mel_definition import MelDefinition, mel_definition


def float64_enabled() -> contextlib.AbstractContextManager:
    """jax.enable_x64(True), or jax.experimental.enable_x64() in a JAX without it."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # older JAX only

    return enable_x64()


class JaxLogMel:
    """Batch log-mel in JAX (gpu_mel.BatchLogMel) on `device` (default: JAX's first,
    the stager's GPU when it sees one): a GPU takes the whole batch at once, a CPU a
    row at a time (jax.lax.map, gpu_mel.py)."""

    framework = "jax"

    def __init__(self, cfg: Config, device: Any = None) -> None:
        d = self.definition = mel_definition(cfg)
        self.device = device if device is not None else jax.devices()[0]
        self.per_row = self.device.platform == "cpu"
        self.traces = 0
        with float64_enabled():
            self._window = jax.device_put(d.window, self.device)
            self._filterbank = jax.device_put(d.filterbank, self.device)
        self._fn = jax.jit(self._log_mel)

    def __call__(self, waves: np.ndarray, wave_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mel float32 [B, S // hop, n_mels], mel_lens int32 [B]), numpy; gpu_mel.py."""
        waves, wave_lens = checked_batch(waves, wave_lens)
        d = self.definition
        mel_lens = d.mel_lens(wave_lens, d.batch_frames(waves.shape[1]))
        with float64_enabled():
            args = jax.device_put((waves, wave_lens, mel_lens), self.device)
            mel = self._fn(self._window, self._filterbank, *args)
            return np.asarray(mel), mel_lens

    def _log_mel(
        self,
        window: jax.Array,
        filterbank: jax.Array,
        waves: jax.Array,
        wave_lens: jax.Array,
        mel_lens: jax.Array,
    ) -> jax.Array:
        self.traces += 1  # Python runs only while jit traces: once per batch shape
        if not self.per_row:
            return self._rows(window, filterbank, waves, wave_lens, mel_lens)
        return jax.lax.map(
            lambda row: self._rows(window, filterbank, *(x[None] for x in row))[0],
            (waves, wave_lens, mel_lens),
        )

    def _rows(
        self,
        window: jax.Array,
        filterbank: jax.Array,
        waves: jax.Array,
        wave_lens: jax.Array,
        mel_lens: jax.Array,
    ) -> jax.Array:
        """The log-mel of rows of the batch, float32 [rows, S // hop, n_mels]."""
        d = self.definition
        n_samples = waves.shape[1]
        n_frames = d.batch_frames(n_samples)
        # Zero anything past the true length: slot padding need not be zero, and
        # librosa sees the clip followed by exactly n_fft // 2 zeros.
        inside = jnp.arange(n_samples)[None, :] < wave_lens[:, None]
        padded = jnp.pad(jnp.where(inside, waves, 0.0), ((0, 0), (d.pad, d.pad)))
        frames = _frames(padded, n_frames, d)
        spectrum = jnp.fft.rfft(frames.astype(jnp.float64) * window)[..., : d.bins]
        power = jnp.real(spectrum) ** 2 + jnp.imag(spectrum) ** 2
        magnitude = jnp.sqrt(power.astype(jnp.float32))
        mel = jnp.matmul(magnitude, filterbank, precision=jax.lax.Precision.HIGHEST)
        log_mel = jnp.log(jnp.maximum(mel, jnp.float32(d.log_floor)))
        inside_frames = jnp.arange(n_frames)[None, :] < mel_lens[:, None]
        return jnp.where(inside_frames[:, :, None], log_mel, jnp.float32(0.0))


def _frames(padded: jax.Array, n_frames: int, d: MelDefinition) -> jax.Array:
    """float32 [B, n_frames, n_fft], frame k = padded[:, k * hop : k * hop + n_fft]. When
    hop divides n_fft (1024 / 256), k hop-long blocks side by side, which XLA fuses into
    the window's product; else a gather."""
    hop, n_fft = d.hop_length, d.n_fft
    if n_fft % hop:
        starts = jnp.arange(n_frames)[:, None] * hop + jnp.arange(n_fft)[None, :]
        return padded[:, starts]
    k = n_fft // hop
    blocks = padded[:, : (n_frames + k - 1) * hop].reshape(padded.shape[0], -1, hop)
    return jnp.concatenate([blocks[:, j : j + n_frames] for j in range(k)], axis=-1)
