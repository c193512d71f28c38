"""The FFT of the producers' STFT: float64, from the fastest library this host has.

Parity with librosa needs float64 where the windowed frames are formed and
transformed: librosa windows and transforms in float64, and a float32 window or
FFT rounds to ~1e-7 of a frame's energy, which in the quietest bands of a loud
frame, next to LOG_FLOOR, is up to ~1e-3 in log space (1.1e-3 on the shipped
clips; 9.5e-7 with the window and the FFT in float64: tests/unit/test_audio_features.py).
Which library transforms float64 fastest depends on the CPU: ducc0 (the FFT
TensorFlow's own is built from) took 0.93 ms for a clip's frames on an AVX-512
EPYC here, scipy's pocketfft 1.5 ms (and 0.85 ms in float32). So the candidates
this interpreter can import are timed on a batch of frames (a few milliseconds)
and the fastest is kept; the choice is logged, and `ringfeed validate` prints it.
Every candidate computes the same transform to float64 rounding (~1e-16 relative),
far below what a log-mel keeps.

The timing is done once per host, not in every process: the choice is kept in
``features.cache_dir`` under a key of the CPU (model and flags), the libraries'
versions and n_fft, and later processes read it. Timing in each producer's
warm-up imported scipy.fft there (0.5 s of CPU per producer on 2 cores here)
before its first grant, whichever library won (benchmarks/first_batch.py). A
new CPU or library version times again; so does deleting the file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# Frames of the timing batch, and tries of each candidate (the best one counts).
PROBE_FRAMES = 256
PROBE_TRIES = 3
# Bump when what a choice file holds changes meaning.
CHOICE_VERSION = 1

# rfft(frames float64 [k, n_fft], out complex128 [k, n_fft // 2 + 1]) -> the spectrum,
# over the last axis, one thread; out is where it goes when the library can write there
# (a fresh multi-MB array per clip costs page faults: producer/features/mel.py).
Rfft = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _ducc0(frames: np.ndarray, out: np.ndarray) -> np.ndarray:
    import ducc0

    return ducc0.fft.r2c(frames, axes=(1,), nthreads=1, out=out)


def _scipy(frames: np.ndarray, out: np.ndarray) -> np.ndarray:
    import scipy.fft

    return scipy.fft.rfft(frames, axis=-1, workers=1)  # no out= in scipy.fft


# Library name -> rfft over the last axis of float64 [frames, n_fft], one thread.
CANDIDATES: dict[str, Rfft] = {"ducc0": _ducc0, "scipy": _scipy}


def available() -> list[str]:
    """The candidates this interpreter can import."""
    return [name for name in CANDIDATES if importlib.util.find_spec(name) is not None]


def host_key(n_fft: int) -> str:
    """16 hex digits naming this CPU (model and flags: two EPYCs differ in AVX-512), the
    candidates' versions and n_fft: what decides which candidate is fastest."""
    cpu = {"machine": platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "flags"):
                cpu[name.strip()] = value.strip()
            if len(cpu) == 3:
                break
    except OSError:  # not Linux: the machine name and the versions must do
        pass
    versions = {}
    for name in available():
        versions[name] = _version(name)
    what = json.dumps([CHOICE_VERSION, cpu, versions, n_fft], sort_keys=True)
    return hashlib.blake2b(what.encode(), digest_size=8).hexdigest()


def _version(name: str) -> str:
    """The installed version of the candidate `name` ("?": none found), from the name of
    its NAME-VERSION.dist-info (or .egg-info) folder beside it, where pip put both:
    importlib.metadata costs ~55 ms to import, in every pool's start
    (benchmarks/first_batch.py)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return "?"
    folder = Path(spec.origin).parent  # a module's folder; a package's is one up
    folder = folder.parent if spec.submodule_search_locations else folder
    wanted = name.lower().replace("-", "_")
    try:
        entries = os.listdir(folder)
    except OSError:
        return "?"
    for entry in entries:
        stem, dot, kind = entry.rpartition(".")
        dist, _, version = stem.partition("-")
        if dot and kind in ("dist-info", "egg-info") and dist.lower().replace("-", "_") == wanted:
            return version.split("-")[0] or "?"
    return "?"


def choice_path(n_fft: int, directory: str) -> Path:
    """Where this host's choice for n_fft is kept (directory: features.cache_dir)."""
    return Path(directory) / "fft" / f"{host_key(n_fft)}.json"


@functools.cache
def fastest(n_fft: int, directory: str = "") -> tuple[str, Rfft]:
    """choose(), once per process and n_fft."""
    return choose(n_fft, directory)


def choose(n_fft: int, directory: str = "") -> tuple[str, Rfft]:
    """(name, rfft) of the candidate that transforms PROBE_FRAMES frames of n_fft samples
    fastest on this host: read from directory (features.cache_dir) when a process of this
    host timed them already, else timed here and kept there (directory "": not kept)."""
    path = choice_path(n_fft, directory) if directory else None
    name = _read_choice(path)
    if name is not None:
        log.info("STFT: float64 FFT by %s (this host's choice, %s)", name, path)
        return name, CANDIDATES[name]
    timings = _time_candidates(n_fft)
    name = min(timings, key=timings.__getitem__)
    shown = ", ".join(f"{n} {1e3 * t:.2f} ms" for n, t in timings.items())
    log.info("STFT: float64 FFT by %s (%s for %d frames of %d)", name, shown, PROBE_FRAMES, n_fft)
    if path is not None:
        _write_choice(path, name, timings)
    return name, CANDIDATES[name]


def _time_candidates(n_fft: int) -> dict[str, float]:
    """Best-of-PROBE_TRIES seconds of each candidate on PROBE_FRAMES random frames."""
    probe = np.random.default_rng(0).standard_normal((PROBE_FRAMES, n_fft))
    out = np.empty((PROBE_FRAMES, n_fft // 2 + 1), np.complex128)
    timings = {}
    for name in available():
        fn = CANDIDATES[name]
        fn(probe[:1], out[:1])  # imports and plans outside the timing
        best = float("inf")
        for _ in range(PROBE_TRIES):
            t0 = time.perf_counter()
            fn(probe, out)
            best = min(best, time.perf_counter() - t0)
        timings[name] = best
    return timings


def _read_choice(path: Path | None) -> str | None:
    """The candidate a choice file names, or None (no file, unreadable, or a candidate
    this interpreter cannot import: then it is timed again)."""
    if path is None:
        return None
    try:
        name = json.loads(path.read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if name in CANDIDATES and name in available() else None


def _write_choice(path: Path, name: str, timings: dict[str, float]) -> None:
    """Keep the choice for the host's next processes; a cache folder that cannot be
    written costs them the timing again, nothing else."""
    record = {"name": name, "ms": {n: round(1e3 * t, 3) for n, t in timings.items()}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)  # two processes timing at once: either's file is whole
    except OSError as exc:
        log.info("STFT: cannot keep the FFT choice in %s (%s): each process times it", path, exc)
    finally:  # a stop signal (Stopped) between the write and the replace leaves no litter
        tmp.unlink(missing_ok=True)
