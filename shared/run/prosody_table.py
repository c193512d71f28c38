"""Per-speaker prosody statistics: the mean and standard deviation of log-f0 over voiced
frames and of energy, per speaker and over the whole corpus (FastPitch-style pitch
normalization; one pass over the corpus, NeMo PR#5455).

Preparation computes the table (`ringfeed prepare CONFIG` when features.pitch_norm asks,
or `ringfeed stats CONFIG`; producer/prepare/prosody_pass.py) and keeps it beside the
corpus index as ``prosody-<key>.json`` (in memory on a full disk:
shared/corpus/memory_copies.py): the key hashes the corpus digest and every
setting that shapes a clip's pitch and energy (audio section; the STFT and frame keys
of the features section), so a table made from another corpus or other settings is
never found; the table also names the pitch estimator's version (producer/features/prosody.py
PROSODY_VERSION), checked by whoever applies it. With ``features.pitch_norm: speaker``
(or ``global``) the producers apply it to the pitch field, and the stager keeps a copy
in the run directory, which every checkpoint's sidecar carries
(consumer/trainer/checkpoint.py), so inference can invert it:
f0 = exp(pitch * std + mean) on voiced frames.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.corpus.memory_copies import places, write_kept

# The run directory's copy, which checkpoints carry.
RUN_FILE = "prosody.json"
# The features keys that shape a clip's pitch and energy (with the whole audio section).
SHAPING = ("n_fft", "hop_length", "win_length", "fmin", "fmax", "max_frames", "on_too_long")
# What each speaker's (and the corpus's) entry holds.
FIELDS = (
    "log_f0_mean",
    "log_f0_std",
    "energy_mean",
    "energy_std",
    "voiced_frames",
    "frames",
    "clips",
)


def table_key(cfg: Config, digest: str) -> str:
    """A hash of the corpus digest and the settings that shape pitch and energy."""
    shaping = {k: getattr(cfg.features, k) for k in SHAPING}
    raw = json.dumps([digest, repr(cfg.audio), shaping], sort_keys=True, default=str)
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def table_path(cfg: Config, digest: str) -> Path:
    return Path(cfg.features.cache_dir).absolute() / f"prosody-{table_key(cfg, digest)}.json"


def moments(sums: np.ndarray) -> dict[str, float]:
    """A table entry from summed moments [sum log-f0, sum log-f0^2, voiced frames, sum
    energy, sum energy^2, frames, clips] (float64): population standard deviations."""
    s = np.asarray(sums, np.float64)
    out = {"voiced_frames": int(s[2]), "frames": int(s[5]), "clips": int(s[6])}
    for name, total, square, n in (("log_f0", s[0], s[1], s[2]), ("energy", s[3], s[4], s[5])):
        mean = total / n if n else 0.0
        out[f"{name}_mean"] = float(mean)
        out[f"{name}_std"] = float(np.sqrt(max(square / n - mean * mean, 0.0))) if n else 0.0
    return out


def write_table(path: Path, table: dict[str, Any]) -> None:
    """The table at path, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(table, ensure_ascii=False, indent=1), "utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def keep_table(path: Path, table: dict[str, Any]) -> Path:
    """Preparation's copy of the table: at path, or in memory when its disk is full
    (shared/corpus/memory_copies.py); returns where."""
    return write_kept(path, lambda there: write_table(there, table))


def read_table(path: Path) -> dict[str, Any] | None:
    """The table at path (its memory copy first), or None."""
    for place in places(path):
        try:
            table = json.loads(place.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(table, dict) and "speakers" in table:
            return table
    return None


def required_table(cfg: Config, digest: str, version: str = "") -> dict[str, Any]:
    """The table features.pitch_norm applies; ConfigError saying what to run when it is
    missing, or was made by another pitch estimator (version: PROSODY_VERSION)."""
    path = table_path(cfg, digest)
    table = read_table(path)
    if table is None or (version and table.get("prosody_version") != version):
        why = "none" if table is None else f"one of {table.get('prosody_version')}"
        raise ConfigError(
            f"features.pitch_norm: {cfg.features.pitch_norm} needs this corpus's "
            f"prosody statistics ({why} at {path}): run `ringfeed prepare CONFIG` "
            "first (`ringfeed run` and `ringfeed validate` do)"
        )
    return table


def keep_in_run(cfg: Config, digest: str, run_dir: Path) -> None:
    """The stager at start: the table the producers apply, copied into the run directory
    (RUN_FILE), which checkpoints carry; ConfigError when there is none."""
    write_table(Path(run_dir) / RUN_FILE, required_table(cfg, digest))


def read_run_table(run_dir: Path) -> dict[str, Any] | None:
    """The run's copy of the table, or None (a run without features.pitch_norm)."""
    return read_table(Path(run_dir) / RUN_FILE)


def normalized_pitch(f0: np.ndarray, entry: dict[str, float]) -> np.ndarray:
    """f0 float32 [frames] Hz (0 unvoiced) -> (log f0 - mean) / std on voiced frames, 0 on
    unvoiced ones, with a table entry's log-f0 moments."""
    out = np.zeros_like(f0, dtype=np.float32)
    voiced = f0 > 0
    std = entry["log_f0_std"] or 1.0  # one voiced value: nothing to scale
    out[voiced] = (np.log(f0[voiced].astype(np.float64)) - entry["log_f0_mean"]) / std
    return out
