"""The FFT of the producers' STFT: float64, from the fastest library this host has.

Parity with librosa needs float64 where the windowed frames are formed and
transformed: librosa windows and transforms in float64, and a float32 window or
FFT rounds to ~1e-7 of a frame's energy, which in the quietest bands of a loud
frame, next to LOG_FLOOR, is up to ~1e-3 in log space (1.1e-3 on the shipped
clips; 8e-7 with the window and the FFT in float64: tests/unit/test_audio_features.py).
Which library transforms float64 fastest depends on the CPU: ducc0 (the FFT
TensorFlow's own is built from) took 0.93 ms for a clip's frames on an AVX-512
EPYC here, scipy's pocketfft 1.5 ms (and 0.85 ms in float32). So each process times
the candidates it can import on a batch of frames at its first STFT (a few
milliseconds, in the producer's warm-up) and keeps the fastest; the choice is
logged, and `ringfeed validate` prints it. Every candidate computes the same
transform to float64 rounding (~1e-16 relative), far below what a log-mel keeps.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import time
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

# Frames of the timing batch, and tries of each candidate (the best one counts).
PROBE_FRAMES = 256
PROBE_TRIES = 3

Rfft = Callable[[np.ndarray], np.ndarray]


def _ducc0(frames: np.ndarray) -> np.ndarray:
    import ducc0

    return ducc0.fft.r2c(frames, axes=(1,), nthreads=1)


def _scipy(frames: np.ndarray) -> np.ndarray:
    import scipy.fft

    return scipy.fft.rfft(frames, axis=-1, workers=1)


# Library name -> rfft over the last axis of float64 [frames, n_fft], one thread.
CANDIDATES: dict[str, Rfft] = {"ducc0": _ducc0, "scipy": _scipy}


def available() -> list[str]:
    """The candidates this interpreter can import."""
    return [name for name in CANDIDATES if importlib.util.find_spec(name) is not None]


@functools.cache
def fastest(n_fft: int) -> tuple[str, Rfft]:
    """(name, rfft) of the candidate that transforms PROBE_FRAMES frames of n_fft samples
    fastest in this process; logged once per n_fft."""
    probe = np.random.default_rng(0).standard_normal((PROBE_FRAMES, n_fft))
    timings = {}
    for name in available():
        fn = CANDIDATES[name]
        fn(probe[:1])  # imports and plans outside the timing
        best = float("inf")
        for _ in range(PROBE_TRIES):
            t0 = time.perf_counter()
            fn(probe)
            best = min(best, time.perf_counter() - t0)
        timings[name] = best
    name = min(timings, key=timings.__getitem__)
    shown = ", ".join(f"{n} {1e3 * t:.2f} ms" for n, t in timings.items())
    log.info("STFT: float64 FFT by %s (%s for %d frames of %d)", name, shown, PROBE_FRAMES,
             n_fft)  # fmt: skip
    return name, CANDIDATES[name]
