"""The stager's batch log-mel: its face, its tolerance and its input checks, no framework.

With ``features.device: stager`` producers write resampled waveforms and the stager
turns a whole batch into log-mels in one call on its device (GPU:0, or the CPU where
there is none), in whichever framework the install has: torch (torch_mel.py), JAX
(jax_mel.py) or TensorFlow (tf_mel.py); consumer/devices.py picks one
(devices.stager_framework) and imports only it, after the stager's device is set.

The three compute one definition (shared/sample/mel_definition.py: window, padding,
frames, Slaney filterbank, LOG_FLOOR), the producers' (producer/features/mel.py), so
the two modes train the same model. Each windows and transforms the frames in
float64, as librosa and the producers do; only the magnitude is float32. A float32
window and FFT round to ~1e-7 of a frame's energy, which in the quietest bands of a
loud frame, next to LOG_FLOOR, was 1.1e-3 in log space on the shipped LJSpeech clips
(1.5e-4 on the 16 kHz multilingual ones); in float64 every backend is within 1e-6 of
librosa on every shipped clip (benchmarks/mel_parity.py,
docs/benchmarks.md#mel-parity), and tests/unit/test_gpu_mel.py holds MEL_ATOL for each.
The filterbank matmul stays float32 at full precision: never TF32, whose 10-bit
mantissa moves a band by ~1e-3 relative, which JAX and TensorFlow use for float32
matmuls on Ampere and later GPUs unless told not to.

A GPU takes the whole batch in one go. A CPU takes it a row at a time: a row's
float64 frames (6.5 MB at 800 frames) go through window, FFT and magnitude while they
are in cache, where the whole batch op by op moved 210 MB a step; a [32, 800 x 256]
batch on one core took torch from 570 to ~150 ms, JAX from 205 to 92 ms and
TensorFlow from 254 to 148 ms (docs/benchmarks.md#mel-parity).

Errors. A batch whose arrays break the face below raises MelInputError (a
ValueError) before any device work: that is the stager's own bug (assembly.py hands
its staging array), not a producer's, so the stager should stop with it rather than
send a batch. Anything else a backend raises (the device out of memory, a lost GPU) is
a fault of the device, not of the batch: the stager should grant the batch's positions
again or fall back to producer mels, loudly (issue 48's faults).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

# Absolute tolerance in natural-log space against librosa's (and the producers')
# log-mel on every bin within the true length, next to LOG_FLOOR included (9.5e-7
# measured for every backend: docs/benchmarks.md#mel-parity; tests/unit/test_gpu_mel.py).
MEL_ATOL = 1e-4


class BatchLogMel(Protocol):
    """The stager's batch log-mel, whatever its framework. Called by the stager's
    assembly (consumer/stager/assembly.py) once per batch.

    ``__call__(waves, wave_lens)`` takes waves float32 [B, S] (samples at
    audio.sample_rate, anything beyond wave_lens: it is zeroed; S = frames x
    hop_length of the batch's shape) and wave_lens int32 [B] (samples, 0..S), and
    returns numpy arrays (mel float32 [B, S // hop_length, n_mels], natural-log mel,
    zero beyond mel_lens; mel_lens int32 [B] = min(1 + wave_len // hop_length,
    S // hop_length)). Raises MelInputError for arrays of another shape or dtype.
    """

    framework: str

    def __call__(self, waves: np.ndarray, wave_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mel float32 [B, S // hop_length, n_mels], mel_lens int32 [B]), numpy."""
        ...


class MelInputError(ValueError):
    """A batch handed to the stager's log-mel that breaks its face (BatchLogMel): the
    caller's bug, raised before any work on the device."""


def checked_batch(waves: np.ndarray, wave_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(waves float32 [B, S], wave_lens int32 [B]) as given, or MelInputError saying
    what is wrong: every backend's first step."""
    if not isinstance(waves, np.ndarray) or waves.ndim != 2 or waves.dtype != np.float32:
        raise MelInputError(f"waves must be a float32 numpy array [B, S], got {_what(waves)}")
    if not isinstance(wave_lens, np.ndarray) or wave_lens.shape != waves.shape[:1]:
        raise MelInputError(
            f"wave_lens must be a numpy array [B={waves.shape[0]}] (one length a row of "
            f"waves), got {_what(wave_lens)}"
        )
    if wave_lens.dtype.kind not in "iu":
        raise MelInputError(f"wave_lens must hold integers (samples), got {_what(wave_lens)}")
    n = waves.shape[1]
    if wave_lens.size and not (wave_lens.min() >= 0 and wave_lens.max() <= n):
        raise MelInputError(
            f"wave_lens {int(wave_lens.min())}..{int(wave_lens.max())} outside 0..{n}, "
            "the samples a row of waves holds"
        )
    return waves, wave_lens.astype(np.int32, copy=False)


def _what(x: object) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype} {list(x.shape)}"
    return type(x).__name__
