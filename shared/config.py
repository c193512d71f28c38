"""The one configuration: YAML into frozen, validated dataclasses.

Every process loads the same file with :func:`load_config` and passes the
result down explicitly. Unknown keys, wrong types and impossible values raise
:class:`ConfigError` naming the key and what to change. Derived values (slot
shapes, byte sizes, endpoints) are computed here and nowhere else. This is the
only module that reads environment variables.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ringfeed.shared.config_checks import MIN_BUCKET_FRACTION, check_moved, validate
from ringfeed.shared.config_corpus import DataConfig, TextConfig
from ringfeed.shared.config_features import FeaturesConfig, UserFieldConfig, sample_decls
from ringfeed.shared.config_model import DevicesConfig, ModelConfig, TrainConfig
from ringfeed.shared.config_stager import StagerConfig
from ringfeed.shared.sample_schema import ID_FIELDS, FieldSpec, SampleSchema
from ringfeed.shared.schema import ConfigError, build

# Re-exported: ID_FIELDS (int32 per batch row: ids in shared/id_tables.py) and the
# features section, where they always were.
__all__ = ["ID_FIELDS", "FeaturesConfig", "UserFieldConfig"]

# Floor of the mel power before its log: log(max(mel, LOG_FLOOR)), so silence is
# log(1e-5) = -11.5 and never log(0). One constant for producers (producer/features.py)
# and the stager's GPU mels (consumer/stager/gpu_mel.py), which must agree.
LOG_FLOOR = 1e-5
# Environment variable naming a source hook, "module:callable" (see source_hook).
SOURCE_HOOK_ENV = "RINGFEED_SOURCE_HOOK"


@dataclass(frozen=True)
class AudioConfig:
    # Every clip is resampled to this rate (Hz, soxr).
    sample_rate: int = 22050
    # Trim leading and trailing silence (librosa.effects.trim, trim_top_db).
    trim_silence: bool = False
    # Silence threshold of trim_silence, dB below the peak.
    trim_top_db: float = 60.0
    # peak: scale each clip to peak_level; none: as decoded.
    normalize: Literal["none", "peak"] = "peak"
    # The peak of a peak-normalized clip.
    peak_level: float = 0.95
    # Shorter clips (after trimming) are skipped, seconds.
    min_duration_s: float = 0.1
    # Longer audio (by its file header) is rejected before it is decoded, seconds. With
    # features.on_too_long: skip, audio longer than a slot is rejected the same way.
    max_duration_s: float = 60.0


@dataclass(frozen=True)
class RingConfig:
    # Sample slots in the shared-memory ring.
    slots: int = 64
    # A grant with no READY within this long comes back (and bounds one sample's work), seconds.
    lease_s: float = 10.0
    # How often producers say they are alive, seconds.
    heartbeat_s: float = 1.0
    # An item whose lease expires this many times is skipped with a reason.
    max_item_attempts: int = 3
    # Rejected messages in 10 minutes that get a peer refused for the run (0 = never).
    max_strikes: int = 3
    max_producers_per_peer: int = 64  # joined at once per CURVE key, tcp host, local pool


@dataclass(frozen=True)
class ProducersConfig:
    # Producer processes of a local pool.
    workers: int = 2
    # A pool restarts a dead worker at most this many times.
    max_restarts: int = 5
    # Wait before the first restart, doubled on each, seconds.
    restart_backoff_s: float = 0.5
    # Grants a producer holds at once: enough to hide the round trip to the stager.
    # Ring throughput here with 2, 4, 8, 16, 32 (before GRANT/READY carried lists):
    # 6.6k, 8.3k, 11.7k, 14.4k, 14.3k samples/s; 16 also caps what one producer holds.
    credits: int = 16
    # Math-library threads per producer; >1 oversubscribes cores (see README).
    math_threads: int = 1
    # Producers per node with `ringfeed producers --ray` (0 = one per CPU a node offers).
    per_node: int = 0
    # A producer that hears nothing from its stager for this long (after a WELCOME,
    # counting only time it was running: not a SIGSTOP or a suspended VM) exits, seconds.
    orphan_s: float = 30.0


@dataclass(frozen=True)
class TransportConfig:
    # "ipc" keeps everything on this host; "tcp" also binds host:port so producers
    # on other hosts can connect (local processes keep using ipc).
    kind: Literal["ipc", "tcp"] = "ipc"
    # With kind: tcp, the address the stager binds for remote producers.
    host: str = "127.0.0.1"
    # With kind: tcp, the port of that address.
    port: int = 5555
    # Directory of CURVE keys (shared/keys.py; required for a non-loopback host).
    # When set, the stager accepts only producers whose public key it lists.
    keys_dir: str = ""


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
    # Where run directories go: run_root/<run-id>/.
    run_root: str = "runs"

    def __post_init__(self) -> None:
        validate(self)

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

    @functools.cached_property
    def schema(self) -> SampleSchema:
        """The declared sample schema (shared/sample_schema.py): every field, built-in
        or the user's, from which slots, batches and specs derive."""
        return SampleSchema(sample_decls(self), self.features.max_frames,
                            self.text.max_text_len, self.features.n_mels)  # fmt: skip

    def sample_fields(self) -> FieldSpec:
        """Payload fields of one sample-ring slot: name -> (shape, dtype), ring order."""
        return self.schema.slot_fields()

    @property
    def batch_frames(self) -> int:
        """Mel frames one batch may hold (stager.batch_frames, or the fixed shape's)."""
        return self.stager.batch_frames or self.stager.batch_size * self.features.max_frames

    @property
    def max_batch_rows(self) -> int:
        """Most rows a batch can have: the budget over the shortest bucket possible
        (auto buckets are at least max_frames // MIN_BUCKET_FRACTION frames)."""
        if not self.stager.bucketed:
            return self.stager.batch_size
        shortest = min(self.stager.buckets or (self.features.max_frames // MIN_BUCKET_FRACTION,))
        return max(1, self.batch_frames // max(1, shortest))

    def batch_ring_fields(self) -> FieldSpec:
        """Payload fields of one batch-ring slot, flat: a batch of any bucket's shape
        [rows, frames, ...] is the first rows x frames entries (the client reshapes)."""
        frames = max(self.batch_frames, self.features.max_frames)
        return self.schema.batch_ring_fields(self.max_batch_rows, frames)

    def batch_fields(self) -> FieldSpec:
        """Fields of one batch at the fixed shape [batch_size, ...] (always mels, never
        waveforms): the schema's fields, their lengths, items, speaker and language."""
        return self.schema.batch_fields(self.stager.batch_size)

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-able data (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def to_yaml(self) -> str:
        """YAML that means the same wherever it is loaded from: relative input paths
        (INPUT_PATH_KEYS, relative to the working directory in a Config) are written
        absolute, as load_config would read them relative to the file's folder."""
        raw = self.to_dict()
        for section, key in INPUT_PATH_KEYS:
            if raw[section][key] and "://" not in raw[section][key]:  # a URL stays one
                raw[section][key] = str(Path(raw[section][key]).absolute())
        return yaml.safe_dump(raw, sort_keys=False)


# ---------------------------------------------------------------- loading


def config_from_dict(raw: dict[str, Any] | None) -> Config:
    """Build a validated Config from a plain mapping (as YAML gives)."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config: top level must be a mapping, got {type(raw).__name__}")
    check_moved(raw)
    return build(Config, raw)


# Inputs travel with a config file: relative to its folder. Outputs (run_root, the
# cache) stay relative to the working directory: they land where you run.
INPUT_PATH_KEYS = (("data", "path"), ("transport", "keys_dir"), ("features", "durations_dir"))


def read_raw(path: str | os.PathLike[str]) -> Any:
    """A config file's YAML as plain data, its relative INPUT_PATH_KEYS made absolute
    from the file's folder (for a tool that edits a config and writes it elsewhere)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    for section, key in INPUT_PATH_KEYS if isinstance(raw, dict) else ():
        part = raw.get(section)
        value = part.get(key) if isinstance(part, dict) else None
        is_url = isinstance(value, str) and "://" in value  # object storage: not a file path
        if isinstance(value, str) and value and not is_url:  # ~: the user's home, as in a shell
            part[key] = str(path.absolute().parent / Path(value).expanduser())
    return raw


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read a YAML file into a validated Config (read_raw); errors name the file and key."""
    path = Path(path)
    raw = read_raw(path)
    try:
        return config_from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def replace(cfg: Config, **changes: Any) -> Config:
    """A copy of cfg with some keys of some sections changed, or top-level keys
    (run_root) replaced (for tests and benchmarks)."""
    raw = cfg.to_dict()
    for name, value in changes.items():
        raw[name] = {**raw[name], **value} if isinstance(raw.get(name), dict) else value
    return config_from_dict(raw)


# ---------------------------------------------------------------- environment


def launch_grace_s() -> float:
    """How long a launcher waits after SIGTERM before SIGKILL (RINGFEED_GRACE_S), seconds."""
    raw = os.environ.get("RINGFEED_GRACE_S", "8")
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"RINGFEED_GRACE_S: {raw!r} is not a number of seconds") from None


# Every name ringfeed makes in a shared place (/dev/shm, the runtime directory) starts
# with this: two users' runs never collide, and each sees only its own.
USER_PREFIX = f"ringfeed-{os.getuid()}-"


def runtime_dir() -> Path:
    """Where ipc sockets live: a directory of this user's only (mode 0700), so no other
    local user can connect to a run's control socket; short, as ipc endpoints are
    limited to ~107 bytes. RINGFEED_RUNTIME_DIR moves its parent (default /tmp)."""
    return Path(os.environ.get("RINGFEED_RUNTIME_DIR", "/tmp")) / USER_PREFIX.rstrip("-")


def ensure_runtime_dir() -> Path:
    """Create runtime_dir() with mode 0700, or check that the one there is ours and
    private; raises ConfigError saying what to do otherwise."""
    path = runtime_dir()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
        raise ConfigError(
            f"{path} is not a directory of this user's: remove it, or set "
            "RINGFEED_RUNTIME_DIR to a directory of your own"
        )
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{path} is open to other users (mode {st.st_mode & 0o777:o}): run chmod 700 {path}"
        )
    return path


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
    base = runtime_dir() / f"{USER_PREFIX}{run_id}"
    remote = f"tcp://{t.host}:{t.port}" if t.kind == "tcp" else ""
    return Endpoints(f"ipc://{base}-control", f"ipc://{base}-stats", remote)


def run_dir(cfg: Config, run_id: str) -> Path:
    return Path(cfg.run_root) / run_id


def source_hook() -> str:
    """RINGFEED_SOURCE_HOOK: "module:callable", or "" (the default: no hook).

    For tests and benchmarks only: each producer wraps its source as
    callable(cfg, source) -> Source (producer/sources.py make_source), e.g. to
    inject faults (tests/fault_sources.py). Processes a launcher spawns inherit
    it; producers on Ray get it from source_hook_env."""
    return os.environ.get(SOURCE_HOOK_ENV, "")


def source_hook_env() -> dict[str, str]:
    """The source hook as environment variables, for a producer started where this
    process's environment does not reach (a Ray actor); {} when none is set."""
    hook = source_hook()
    return {SOURCE_HOOK_ENV: hook} if hook else {}


def tensorflow_log_level() -> str:
    """TF_CPP_MIN_LOG_LEVEL for our TensorFlow processes: 2 (errors) unless the user set it."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")


def cuda_visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")
