"""The one configuration: YAML into frozen, validated dataclasses.

Every process loads the same file with :func:`load_config` and passes the
result down explicitly. Unknown keys, wrong types and impossible values raise
:class:`ConfigError` naming the key and what to change. Derived values (slot
shapes, byte sizes, endpoints) are computed here and nowhere else. This is the
only module that reads environment variables.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import shutil
import string
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

DEFAULT_ALPHABET = string.ascii_lowercase + " !'(),-.:;?\""


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or impossible."""


@dataclass(frozen=True)
class DataConfig:
    path: str = "data/ljspeech-mini"
    # synthetic: precomputed arrays, no files (transport tests and benchmarks).
    format: Literal["ljspeech", "csv", "synthetic"] = "ljspeech"
    synthetic_items: int = 256
    # Extra time each synthetic sample takes, seconds (to induce slow producers).
    synthetic_delay_s: float = 0.0
    # LJSpeech: which text column to use (1 = raw transcription, 2 = normalized).
    text_column: int = 2


@dataclass(frozen=True)
class TextConfig:
    alphabet: str = DEFAULT_ALPHABET
    max_text_len: int = 200
    add_eos: bool = True
    # A text whose share of characters outside the alphabet exceeds this is quarantined.
    max_unknown_frac: float = 0.1
    cache_size: int = 100_000


@dataclass(frozen=True)
class AudioConfig:
    sample_rate: int = 22050
    trim_silence: bool = False
    trim_top_db: float = 60.0
    normalize: Literal["none", "peak"] = "peak"
    peak_level: float = 0.95
    min_duration_s: float = 0.1


@dataclass(frozen=True)
class FeaturesConfig:
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    log_floor: float = 1e-5
    max_frames: int = 800
    on_too_long: Literal["skip", "truncate"] = "skip"
    # producer: producers compute the mel; stager: producers write the waveform and
    # the stager computes mels for the whole batch on its device.
    device: Literal["producer", "stager"] = "producer"
    cache_dir: str = ".cache/features"
    cache: bool = True


@dataclass(frozen=True)
class RingConfig:
    slots: int = 64
    lease_s: float = 10.0
    heartbeat_s: float = 1.0
    # An item whose lease expires this many times is skipped with a reason.
    max_item_attempts: int = 3
    # CRC32 of each slot's used bytes, verified by the stager. Off by default: it
    # costs ~45 us per 256 KiB slot, eight times the copy itself (README).
    checksum: bool = False


@dataclass(frozen=True)
class ProducersConfig:
    workers: int = 2
    max_restarts: int = 5
    restart_backoff_s: float = 0.5
    # Grants a producer holds at once: enough to hide the round trip to the stager.
    # Ring throughput here with 2, 4, 8, 16, 32 (before GRANT/READY carried lists):
    # 6.6k, 8.3k, 11.7k, 14.4k, 14.3k samples/s; 16 also caps what one producer holds.
    credits: int = 16
    # Math-library threads per producer; >1 oversubscribes cores (see README).
    math_threads: int = 1


@dataclass(frozen=True)
class StagerConfig:
    batch_size: int = 32
    batch_slots: int = 3
    deterministic: bool = True
    seed: int = 1234
    # 0 = run until stopped.
    epochs: int = 0


@dataclass(frozen=True)
class TransportConfig:
    # "ipc" keeps everything on this host; "tcp" also binds host:port so producers
    # on other hosts can connect (local processes keep using ipc).
    kind: Literal["ipc", "tcp"] = "ipc"
    host: str = "127.0.0.1"
    port: int = 5555
    # Directory of CURVE keys (shared/keys.py; required for a non-loopback host).
    # When set, the stager accepts only producers whose public key it lists.
    keys_dir: str = ""


@dataclass(frozen=True)
class ModelConfig:
    factory: str = "consumer.model:build_default_model"
    d_model: int = 128
    n_layers: int = 3
    kernel_size: int = 5
    dropout: float = 0.1


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    learning_rate: float = 1e-3
    checkpoint_every: int = 100
    log_every: int = 10
    mixed_precision: bool = True
    jit_compile: bool = True
    # Window, in steps, of the step-time coefficient of variation.
    cv_window: int = 50
    # Append each step's batch item ids to run_dir/batches.jsonl (resume tests, audits).
    log_batches: bool = False


@dataclass(frozen=True)
class DevicesConfig:
    stager_gpu: int = 0
    trainer_gpu: int = 1


@dataclass(frozen=True)
class RunConfig:
    root: str = "runs"


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    text: TextConfig = field(default_factory=TextConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    ring: RingConfig = field(default_factory=RingConfig)
    producers: ProducersConfig = field(default_factory=ProducersConfig)
    stager: StagerConfig = field(default_factory=StagerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        _validate(self)

    # ---- derived values: computed here, never inline elsewhere ----
    @property
    def vocab_size(self) -> int:
        """Token ids: 0 = pad, 1 = unknown, 2 = end of text, then the alphabet."""
        return 3 + len(self.text.alphabet)

    @property
    def max_samples(self) -> int:
        """Length of the waveform field: a clip of n samples has 1 + n // hop_length
        frames (librosa, center=True), so every clip that fits max_frames fits here."""
        return self.features.max_frames * self.features.hop_length

    def sample_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Payload fields of one sample-ring slot: name -> (shape, dtype)."""
        fields: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            "tokens": ((self.text.max_text_len,), np.dtype(np.int32)),
        }
        if self.features.device == "producer":
            fields["mel"] = (
                (self.features.max_frames, self.features.n_mels),
                np.dtype(np.float32),
            )
        else:
            fields["wave"] = ((self.max_samples,), np.dtype(np.float32))
        return fields

    def batch_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Payload fields of one batch-ring slot (always mels, never waveforms)."""
        b = self.stager.batch_size
        return {
            "tokens": ((b, self.text.max_text_len), np.dtype(np.int32)),
            "text_lens": ((b,), np.dtype(np.int32)),
            "mel": ((b, self.features.max_frames, self.features.n_mels), np.dtype(np.float32)),
            "mel_lens": ((b,), np.dtype(np.int32)),
            "items": ((b,), np.dtype(np.int64)),
        }

    @property
    def sample_slot_bytes(self) -> int:
        return _fields_bytes(self.sample_fields())

    @property
    def batch_slot_bytes(self) -> int:
        return _fields_bytes(self.batch_fields())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _fields_bytes(fields: dict[str, tuple[tuple[int, ...], np.dtype]]) -> int:
    return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in fields.values())


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _validate(cfg: Config) -> None:
    f, r, s = cfg.features, cfg.ring, cfg.stager
    for key, value in [
        ("text.max_text_len", cfg.text.max_text_len),
        ("audio.sample_rate", cfg.audio.sample_rate),
        ("features.n_fft", f.n_fft),
        ("features.hop_length", f.hop_length),
        ("features.win_length", f.win_length),
        ("features.n_mels", f.n_mels),
        ("features.max_frames", f.max_frames),
        ("ring.slots", r.slots),
        ("producers.workers", cfg.producers.workers),
        ("producers.credits", cfg.producers.credits),
        ("producers.math_threads", cfg.producers.math_threads),
        ("stager.batch_size", s.batch_size),
        ("stager.batch_slots", s.batch_slots),
        ("ring.max_item_attempts", r.max_item_attempts),
        ("model.d_model", cfg.model.d_model),
        ("model.n_layers", cfg.model.n_layers),
        ("train.log_every", cfg.train.log_every),
        ("train.checkpoint_every", cfg.train.checkpoint_every),
    ]:
        _check(value >= 1, key, f"must be >= 1, got {value}")
    _check(
        f.win_length <= f.n_fft,
        "features.win_length",
        f"{f.win_length} > features.n_fft={f.n_fft}: lower win_length or raise n_fft",
    )
    _check(
        0 <= f.fmin < f.fmax <= cfg.audio.sample_rate / 2,
        "features.fmax",
        f"need 0 <= fmin < fmax <= sample_rate/2 = {cfg.audio.sample_rate / 2}",
    )
    _check(f.log_floor > 0, "features.log_floor", "must be > 0 (it guards log(0))")
    _check(
        len(set(cfg.text.alphabet)) == len(cfg.text.alphabet) and cfg.text.alphabet != "",
        "text.alphabet",
        "must be a non-empty string of distinct characters",
    )
    _check(0 <= cfg.text.max_unknown_frac <= 1, "text.max_unknown_frac", "must be in [0, 1]")
    _check(r.heartbeat_s > 0, "ring.heartbeat_s", "must be > 0")
    _check(
        r.lease_s >= 2 * r.heartbeat_s,
        "ring.lease_s",
        f"{r.lease_s} s must be at least 2 x ring.heartbeat_s={r.heartbeat_s} s, "
        "or live producers lose their grants",
    )
    _check(
        r.slots >= s.batch_size or not s.deterministic,
        "ring.slots",
        f"{r.slots} < stager.batch_size={s.batch_size}: in deterministic mode a batch "
        "needs that many slots in flight; raise ring.slots",
    )
    _check(s.batch_slots >= 2, "stager.batch_slots", "must be >= 2 (3 = triple buffering)")
    _check(cfg.data.text_column in (1, 2), "data.text_column", "must be 1 or 2")
    _check(1 <= cfg.transport.port <= 65535, "transport.port", "must be a TCP port number")
    t = cfg.transport
    _check(
        t.kind != "tcp" or is_loopback(t.host) or t.keys_dir != "",
        "transport.keys_dir",
        f"binding {t.host} (not loopback) needs CURVE keys: run `ringfeed keys DIR --client "
        "NAME` and set transport.keys_dir, or bind transport.host: 127.0.0.1",
    )
    _check(cfg.train.steps >= 0, "train.steps", "must be >= 0")
    _check(s.epochs >= 0, "stager.epochs", "must be >= 0 (0 = until stopped)")


# ---------------------------------------------------------------- loading


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        _check(value in choices, key, f"must be one of {list(choices)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{key}: union types are not supported in the config schema")
    if dataclasses.is_dataclass(tp):
        _check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return _build(tp, value, key)
    if tp is bool:
        _check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        _check(
            isinstance(value, int) and not isinstance(value, bool),
            key,
            f"must be an integer, got {value!r}",
        )
        return value
    if tp is float:
        _check(
            isinstance(value, (int, float)) and not isinstance(value, bool),
            key,
            f"must be a number, got {value!r}",
        )
        return float(value)
    if tp is str:
        _check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")


def _build(cls: type, raw: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            raise ConfigError(f"{where}: unknown key; known keys here are {sorted(names)}")
    kwargs = {}
    for name in names & raw.keys():
        where = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(raw[name], hints[name], where)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - guarded by the checks above
        raise ConfigError(f"{prefix or 'config'}: {exc}") from exc


def config_from_dict(raw: dict[str, Any] | None) -> Config:
    """Build a validated Config from a plain mapping (as YAML gives)."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config: top level must be a mapping, got {type(raw).__name__}")
    return _build(Config, raw)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read a YAML file into a validated Config; errors name the file and key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        return config_from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def replace(cfg: Config, **sections: dict[str, Any]) -> Config:
    """A copy of cfg with some keys of some sections changed (for tests and benchmarks)."""
    raw = cfg.to_dict()
    for section, values in sections.items():
        raw[section].update(values)
    return config_from_dict(raw)


# ---------------------------------------------------------------- environment

SHM_DIR = Path("/dev/shm")


def free_shm_bytes() -> int:
    """Free bytes in /dev/shm, where POSIX shared memory lives on Linux."""
    return shutil.disk_usage(SHM_DIR).free


def check_shm_fits(cfg: Config) -> None:
    """Raise ConfigError before anything starts if the rings cannot fit in /dev/shm."""
    need = ring_bytes(cfg)
    free = free_shm_bytes()
    if need > free:
        raise ConfigError(
            f"ring.slots: the rings need {need / 2**20:.1f} MiB but /dev/shm has "
            f"{free / 2**20:.1f} MiB free; lower ring.slots (each slot is "
            f"{cfg.sample_slot_bytes / 2**20:.2f} MiB) or features.max_frames, or enlarge "
            "/dev/shm (docker: --shm-size)"
        )


def ring_bytes(cfg: Config) -> int:
    """Payload bytes of both rings (headers add a few KiB)."""
    return cfg.ring.slots * cfg.sample_slot_bytes + cfg.stager.batch_slots * cfg.batch_slot_bytes


def runtime_dir() -> Path:
    """Where ipc sockets live: short paths, as ipc endpoints are limited to ~107 bytes."""
    return Path(os.environ.get("RINGFEED_RUNTIME_DIR", "/tmp"))


@dataclass(frozen=True)
class Endpoints:
    """ZeroMQ addresses of one run: control (ROUTER on ipc: local producers and the
    trainer), stats (PUB on ipc) and remote (ROUTER on tcp for other hosts, or "")."""

    control: str
    stats: str
    remote: str


def endpoints(cfg: Config, run_id: str) -> Endpoints:
    """Where the stager binds; producers and the trainer connect to the same strings."""
    t = cfg.transport
    base = runtime_dir() / f"ringfeed-{run_id}"
    remote = f"tcp://{t.host}:{t.port}" if t.kind == "tcp" else ""
    return Endpoints(f"ipc://{base}-control", f"ipc://{base}-stats", remote)


def run_dir(cfg: Config, run_id: str) -> Path:
    return Path(cfg.run.root) / run_id


def tensorflow_log_level() -> str:
    """TF_CPP_MIN_LOG_LEVEL for our TensorFlow processes: 2 (errors) unless the user set it."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")


def cuda_visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")
