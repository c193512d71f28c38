"""The one configuration: YAML into frozen, validated dataclasses.

Every process loads the same file with :func:`load_config` and passes the
result down explicitly. Unknown keys, wrong types and impossible values raise
:class:`ConfigError` naming the key and what to change: each section checks its
own keys (one module per section in this package), shared/config/checks.py the
rules between sections. Derived values (slot shapes, byte sizes) are computed
here and nowhere else. What comes from the environment (the runtime directory,
endpoints, hooks) is shared/config/environment.py's, the only module that reads
environment variables.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ringfeed.shared.config.audio import AudioConfig
from ringfeed.shared.config.checks import validate
from ringfeed.shared.config.data import DataConfig
from ringfeed.shared.config.environment import shm_total_bytes
from ringfeed.shared.config.features import FeaturesConfig, sample_decls
from ringfeed.shared.config.loader import ConfigError, build
from ringfeed.shared.config.model import DevicesConfig, ModelConfig, TrainConfig
from ringfeed.shared.config.moved import check_moved
from ringfeed.shared.config.producers import ProducersConfig
from ringfeed.shared.config.ring import RingConfig
from ringfeed.shared.config.stager import MIN_BUCKET_FRACTION, StagerConfig
from ringfeed.shared.config.text import TextConfig
from ringfeed.shared.config.transport import TransportConfig
from ringfeed.shared.sample.schema import FieldSpec, SampleSchema


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
        """The declared sample schema (shared/sample/schema.py): every field, built-in
        or the user's, from which slots, batches and specs derive."""
        return SampleSchema(
            sample_decls(self),
            self.features.max_frames,
            self.text.max_text_len,
            self.features.n_mels,
            self.features.hop_length,
        )

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

    @property
    def typical_batch_rows(self) -> int:
        """Rows of a batch of the longest bucket (the fewest rows a batch has), or the
        fixed batch_size: what the look-ahead counts batches in."""
        if not self.stager.bucketed:
            return self.stager.batch_size
        return max(1, self.batch_frames // self.features.max_frames)

    @property
    def lookahead_need(self) -> int:
        """The look-ahead the producers ask for: twice the batches every local producer's
        producers.credits rows fill, so they hold them while answered rows wait for the
        oldest batch, plus that batch: 2 x ceil(workers x credits / rows) + 1
        (docs/design.md#the-look-ahead)."""
        p = self.producers
        return 2 * -(-p.workers * p.credits // self.typical_batch_rows) + 1

    @functools.cached_property
    def lookahead_batches(self) -> int:
        """Batches the producers fill ahead of the consumer: ring.lookahead, or (0)
        lookahead_need as far as both rings then fit in SHM_SHARE of this host's
        /dev/shm (a container's is 64 MiB by default), at least one: sized in bytes, so
        2 producers fit a container's and 14 on a large host get all they ask."""
        if self.ring.lookahead:
            return self.ring.lookahead
        budget = SHM_SHARE * shm_total_bytes()
        batch = fields_bytes(self.batch_ring_fields())
        sample = fields_bytes(self.sample_fields())
        for ahead in range(self.lookahead_need, 1, -1):
            slots = self.stager.batch_slots + ahead + 1
            if slots * batch + self._spare_slots(ahead) * sample <= budget:
                return ahead
        return 1

    @property
    def grants_in_flight(self) -> int:
        """Grants out at once, at most: the look-ahead's rows (fair shares split these)."""
        return self.lookahead_batches * self.typical_batch_rows

    @property
    def batch_ring_slots(self) -> int:
        """Slots of the batch ring: the consumer's (stager.batch_slots), the look-ahead,
        and one that a batch moves into when one of its rows may still be written by a
        producer the stager gave up on (docs/design.md#rows-written-once)."""
        return self.stager.batch_slots + self.lookahead_batches + 1

    @property
    def spare_slots(self) -> int:
        """Places of the spare ring: ring.spares, or (0) the look-ahead's rows when the
        stager computes the mels (every sample comes as a waveform), else twice
        producers.credits, at least 8."""
        return self._spare_slots(self.lookahead_batches)

    def _spare_slots(self, ahead: int) -> int:
        if self.ring.spares:
            return self.ring.spares
        if self.features.device == "stager":
            return ahead * self.max_batch_rows + self.producers.credits
        return max(8, 2 * self.producers.credits)

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
        return dump_yaml(raw)


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
# The share of /dev/shm a run's rings may take by default (ring.lookahead 0): the rest is
# for what else the host keeps there (NCCL's buffers, a framework's workers).
SHM_SHARE = 0.9


def fields_bytes(fields: FieldSpec) -> int:
    """Payload bytes of one slot of these fields (shared/memory/ring.py lays them out
    64-byte aligned: within 64 bytes a field of this)."""
    return sum(
        int(np.prod(shape, dtype=np.int64)) * dtype.itemsize + 64
        for shape, dtype in fields.values()
    )


INPUT_PATH_KEYS = (
    ("data", "path"),
    ("data", "root"),
    ("transport", "keys_dir"),
    ("features", "durations_dir"),
)


# libyaml's C loader and dumper where PyYAML has them (its wheels do), else the same
# safe ones in Python: loading a config took 14 ms in Python, 2 ms in C, in each of
# the processes a run starts (benchmarks/first_batch.py). Where libyaml refuses, the
# Python ones decide: it cannot write a path with undecodable bytes (Python holds them
# as lone surrogates), nor read the escapes the Python dumper wrote for them, and its
# errors say less (no line shown, no offending character).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def parse_yaml(text: str) -> Any:
    """YAML text as plain data, as yaml.safe_load reads it (raises yaml.YAMLError)."""
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader, C or Python
    except yaml.YAMLError:
        return yaml.safe_load(text)  # its data, or its error


def dump_yaml(data: Any) -> str:
    """Plain data as YAML, keys in their order, as yaml.safe_dump writes it."""
    try:
        return yaml.dump(data, Dumper=_DUMPER, sort_keys=False)
    except UnicodeEncodeError:  # a lone surrogate (see above)
        return yaml.safe_dump(data, sort_keys=False)


def config_from_yaml(text: str) -> Config:
    """A Config from YAML text (Config.to_yaml's, passed to a process it starts)."""
    return config_from_dict(parse_yaml(text))


def read_raw(path: str | os.PathLike[str]) -> Any:
    """A config file's YAML as plain data, its relative INPUT_PATH_KEYS made absolute
    from the file's folder (for a tool that edits a config and writes it elsewhere)."""
    path = Path(path)
    try:
        raw = parse_yaml(path.read_text())
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
