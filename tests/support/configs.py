"""The configs tests run with, and the one way a test writes a config file.

- SYNTHETIC: a trainer run shrunk to seconds (32 synthetic items, a one-layer model);
  BUCKETS: SYNTHETIC with LJSpeech-shaped lengths in three length buckets;
- small(): a config file for a run without a model (synthetic items, short leases);
  tcp() its transport section for a tcp socket; keyed() small() with CURVE keys;
- lopsided_config(): a trainer run over 48 clips of three speakers, 36 / 9 / 3;
- clips_cfg(), jsonl_cfg(), shards_cfg(): Configs over the shipped clips, a JSON-lines
  manifest, tar shards; each keeps its feature cache in the test's tmp folder;
- write_config(): any raw config as a file, its run_root in the test's tmp folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ringfeed.shared.config import Config, replace
from ringfeed.shared.wire.keys import generate
from tests.support.corpora import write_manifest
from tests.support.fault_sources import inject_faults
from tests.support.paths import MINI, WAVS
from tests.support.ports import free_port

# A trainer run shrunk to seconds on 2 cores: 32 synthetic items, a one-layer model.
SYNTHETIC: dict[str, dict[str, Any]] = {
    "data": {"format": "synthetic", "synthetic_items": 32},
    "features": {"max_frames": 32, "cache": False},
    "text": {"max_text_len": 32},
    "stager": {"batch_size": 4},
    "producers": {"workers": 2},
    "model": {"kwargs": {"d_model": 16, "n_layers": 1}},
}

# SYNTHETIC with LJSpeech-shaped lengths in three length buckets.
BUCKETS = {
    "data": SYNTHETIC["data"] | {"synthetic_lengths": "ljspeech", "synthetic_items": 48},
    "stager": {"batch_size": 4, "buckets": [16, 24, 32]},
}


def write_config(tmp_path: Path, raw: dict[str, Any], name: str = "config.yaml") -> Path:
    """Write raw as YAML with run_root in tmp_path; returns the file."""
    raw = {**raw, "run_root": str(tmp_path / "runs")}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def small(tmp_path: Path, items: int = 300, delay_s: float = 0.002, **over: dict[str, Any]) -> Path:
    """A config file for a run without a model: `items` synthetic items of
    `delay_s` seconds' work each, small slots and short leases; each keyword names a
    section whose keys it overrides."""
    raw = {
        "data": {"format": "synthetic", "synthetic_items": items},
        "features": {"max_frames": 64, "cache": False},
        "text": {"max_text_len": 32},
        "ring": {"lease_s": 1.0, "heartbeat_s": 0.2},
        "stager": {"batch_size": 8, "epochs": 1},
        "producers": {"workers": 2, "restart_backoff_s": 0.1},
    }
    for section, values in over.items():
        raw[section] = {**raw.get(section, {}), **values}
    path = write_config(tmp_path, raw)
    inject_faults(path, delay_s=delay_s)  # each sample delay_s longer
    return path


# Features of real clips at 8 kHz (with audio.sample_rate 8000): a 256-sample hop and 20
# bands keep a real run of the shipped clips to seconds on 2 cores.
EIGHT_KHZ_FEATURES: dict[str, Any] = {
    "n_fft": 512,
    "win_length": 512,
    "hop_length": 256,
    "n_mels": 20,
    "fmax": 4000.0,
}

# For a run whose producers are all remote: nothing local to audit them with, so no
# audit waits for one (docs/faults-and-security.md#audits).
ALL_REMOTE = {"audit_first": 0, "audit_fraction": 0.0}


def tcp(port: int, keys_dir: Path | str = "", host: str = "127.0.0.1") -> dict[str, Any]:
    """A transport section: the stager binds host:port beside its ipc socket, with the
    CURVE keys in keys_dir if given."""
    transport = {"kind": "tcp", "host": host, "port": port}
    return transport | ({"keys_dir": str(keys_dir)} if keys_dir else {})


def keyed(
    tmp_path: Path, clients: tuple[str, ...] = ("liar",), **small_args: Any
) -> tuple[Path, dict[str, Path]]:
    """small(**small_args) with a CURVE-keyed tcp socket on a free port; returns the
    config file and, by client name, the folder of that client's valid key."""
    keys = tmp_path / "keys"
    bundles = {client: generate(keys, client) for client in clients}
    return small(tmp_path, transport=tcp(free_port(), keys), **small_args), bundles


def jsonl_cfg(path: Path, **data) -> Config:
    """The default Config over the JSON-lines manifest at path; data: more data keys."""
    return replace(Config(), data={"path": str(path), "format": "jsonl", **data})


def lopsided_config(tmp_path: Path) -> Path:
    """48 clips (the 16 shipped recordings, each under three ids) of speakers ann 36,
    bob 9 and cy 3, balanced by speaker (uniform: 16 positions each an epoch); clip k's
    text is k + 1 letters, so a row's text length names its item."""
    speakers = ["ann"] * 36 + ["bob"] * 9 + ["cy"] * 3
    lines = [
        {
            "audio": str(WAVS / f"LJ001-{k % 16 + 1:04d}.wav"),
            "text": "a" * (k + 1),
            "speaker": s,
            "id": f"c{k}",
        }
        for k, s in enumerate(speakers)
    ]
    manifest = write_manifest(tmp_path / "lopsided.jsonl", lines)
    train = {
        "steps": 16,
        "checkpoint_every": 4,
        "log_every": 4,
        "jit_compile": False,
        "log_batches": True,
        "cpu_threads": 1,
        "collective_timeout_s": 8.0,
    }
    raw = SYNTHETIC | {
        # Its texts name their items, not what the clips say: no speaking-rate band.
        "data": {"path": str(manifest), "format": "jsonl", "outliers": "keep"},
        "features": {
            "max_frames": 32,
            "on_too_long": "truncate",
            "cache_dir": str(tmp_path / "cache"),
        },
        "text": {"max_text_len": 64},
        "stager": {"batch_size": 4, "balance": {"by": "speaker", "temperature": 0.0}},
        "producers": {"workers": 1},
        "train": train,
    }
    return write_config(tmp_path, raw)


def clips_cfg(tmp_path: Path, **features: Any) -> Config:
    """The default Config over the shipped clips, its feature cache in tmp_path/cache;
    features: more feature keys."""
    return replace(
        Config(),
        data={"path": str(MINI)},
        features={"cache_dir": str(tmp_path / "cache"), **features},
    )


def shards_cfg(path: str, tmp_path: Path, **data: Any) -> Config:
    """The default Config over the tar shards at path (a folder or an s3:// URL), its
    feature cache in tmp_path/cache; data: more data keys."""
    return replace(
        Config(),
        data={"path": path, "format": "shards", **data},
        features={"cache_dir": str(tmp_path / "cache")},
    )
