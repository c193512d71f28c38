"""Checks of a whole configuration, beyond each key's type (shared/schema.py).

Called once per Config, from its __post_init__ (shared/config.py); each failed
check raises ConfigError naming the key and what to change. Before that,
check_moved turns a key of an earlier schema into an error saying where it went.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from ringfeed.shared.field_config_checks import validate_fields
from ringfeed.shared.language_codes import valid_code
from ringfeed.shared.schema import ConfigError, check

if TYPE_CHECKING:
    from ringfeed.shared.config import Config

# Auto buckets are at least max_frames // this long, so a batch's rows are bounded.
MIN_BUCKET_FRACTION = 8
# Each bucket is one more compilation of the train step.
MAX_BUCKETS = 16

_TESTS_ONLY = "fault injection is for tests only (RINGFEED_SOURCE_HOOK, tests/fault_sources.py)"
# Keys of earlier versions of the schema, and where each went: a config of the old
# shape gets this instead of "unknown key".
MOVED_KEYS = {
    "model.d_model": "moved to model.kwargs.d_model",
    "model.n_layers": "moved to model.kwargs.n_layers",
    "model.kernel_size": "moved to model.kwargs.kernel_size",
    "model.dropout": "moved to model.kwargs.dropout",
    "run.root": "moved to run_root",
    "devices.trainer_gpu": "moved to devices.model (a list of GPU indices, one per replica)",
    "text.cache_size": "no longer a setting (a constant in producer/text.py)",
    "train.cv_window": "no longer a setting (a constant in consumer/trainer/metrics.py)",
    "features.log_floor": "no longer a setting (LOG_FLOOR in shared/config.py)",
    "data.synthetic_raise": _TESTS_ONLY,
    "data.synthetic_exit": _TESTS_ONLY,
    "data.synthetic_delay_s": _TESTS_ONLY,
}


# ringfeed's own model factory before the package moved under `ringfeed.`: an earlier
# config or a checkpoint's copy names it so. Only these names: a user's own package
# may well be called `scripts` or `consumer`.
MOVED_FACTORIES = {
    "consumer.trainer.model:build_default_model": (
        "ringfeed.consumer.trainer.model:build_default_model"
    ),
}


def check_moved(raw: dict[str, Any]) -> None:
    """Raise ConfigError for a key of an earlier schema (MOVED_KEYS) in a raw config
    mapping, saying where it went; ringfeed's own old model.factory is renamed."""
    for key, note in MOVED_KEYS.items():
        section, name = key.split(".")
        if isinstance(raw.get(section), dict) and name in raw[section]:
            raise ConfigError(f"{key}: {note}")
    model = raw.get("model")
    factory = model.get("factory") if isinstance(model, dict) else None
    if isinstance(factory, str) and factory in MOVED_FACTORIES:
        model["factory"] = MOVED_FACTORIES[factory]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate(cfg: Config) -> None:
    """Every check of a whole config; raises ConfigError naming the key and the fix."""
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
        ("ring.max_producers_per_peer", r.max_producers_per_peer),
        ("train.log_every", cfg.train.log_every),
        ("train.checkpoint_every", cfg.train.checkpoint_every),
        ("data.max_speakers", cfg.data.max_speakers),
        ("data.max_languages", cfg.data.max_languages),
        ("data.shard_cache_mb", cfg.data.shard_cache_mb),
        ("data.store_retries", cfg.data.store_retries),
    ]:
        check(value >= 1, key, f"must be >= 1, got {value}")
    _validate_features(cfg)
    _validate_ring(cfg)
    check(cfg.data.text_column in (1, 2), "data.text_column", "must be 1 or 2")
    if cfg.data.format == "synthetic":  # each row names its item (producer/sources.py)
        check(f.n_mels >= 3, "features.n_mels", "synthetic items need 3 mel columns or more")
        check(cfg.data.synthetic_items <= 8192**2, "data.synthetic_items", "at most 8192**2")
    _validate_data(cfg)
    _validate_transport(cfg)
    _validate_producers(cfg)
    _validate_buckets(cfg)
    _validate_balance(cfg)
    _validate_trainer(cfg)
    check(s.epochs >= 0, "stager.epochs", "must be >= 0 (0 = until stopped)")
    check(r.max_strikes >= 0, "ring.max_strikes", "must be >= 0 (0 = never refuse a peer)")
    check(cfg.producers.per_node >= 0, "producers.per_node", "must be >= 0 (0 = one per CPU)")


def _validate_data(cfg: Config) -> None:
    d = cfg.data
    check(
        d.language == "auto" or valid_code(d.language),
        "data.language",
        f"must be a language code such as en, de or pt-br, or auto; got {d.language!r}",
    )
    for code in d.detect_languages:
        check(valid_code(code), "data.detect_languages", f"{code!r} is no code")
    check(d.shard_window >= 0, "data.shard_window", "must be >= 0 (0 = off)")
    check(not d.shard_window or d.format == "shards", "data.shard_window",
          "only tar shards have shards to deal: set data.format: shards, or 0 here")  # fmt: skip
    check("://" not in d.path or d.format == "shards", "data.path",
          f"{d.path!r} is an object-store URL: only data.format: shards reads one "
          "(pack the corpus into tar shards, or copy it to a local folder)")  # fmt: skip


def _validate_trainer(cfg: Config) -> None:
    check(cfg.train.steps >= 0, "train.steps", "must be >= 0")
    check(cfg.train.cpu_threads >= 0, "train.cpu_threads", "must be >= 0 (0 = every core)")
    check(cfg.train.collective_timeout_s > 0, "train.collective_timeout_s", "must be > 0")
    for key in ("connect_timeout_s", "data_timeout_s"):
        check(getattr(cfg.train, key) > 0, f"train.{key}", "must be > 0")
    check(cfg.devices.cpu_replicas >= 1, "devices.cpu_replicas", "must be >= 1")
    model = cfg.devices.model
    check(len(set(model)) == len(model) and all(g >= 0 for g in model), "devices.model",
          f"must list distinct GPU indices >= 0, got {list(model)}")  # fmt: skip


def _validate_features(cfg: Config) -> None:
    f = cfg.features
    check(
        f.win_length <= f.n_fft,
        "features.win_length",
        f"{f.win_length} > features.n_fft={f.n_fft}: lower win_length or raise n_fft",
    )
    check(
        0 <= f.fmin < f.fmax <= cfg.audio.sample_rate / 2,
        "features.fmax",
        f"need 0 <= fmin < fmax <= sample_rate/2 = {cfg.audio.sample_rate / 2}",
    )
    check(cfg.audio.max_duration_s > 0, "audio.max_duration_s", "must be > 0 seconds")
    check(
        len(set(cfg.text.alphabet)) == len(cfg.text.alphabet) and cfg.text.alphabet != "",
        "text.alphabet",
        "must be a non-empty string of distinct characters",
    )
    check(0 <= cfg.text.max_unknown_frac <= 1, "text.max_unknown_frac", "must be in [0, 1]")
    validate_fields(cfg)


def _validate_ring(cfg: Config) -> None:
    r, s = cfg.ring, cfg.stager
    check(r.heartbeat_s > 0, "ring.heartbeat_s", "must be > 0")
    check(
        r.lease_s >= 2 * r.heartbeat_s,
        "ring.lease_s",
        f"{r.lease_s} s must be at least 2 x ring.heartbeat_s={r.heartbeat_s} s, "
        "or live producers lose their grants",
    )
    check(
        r.slots >= s.batch_size or not s.deterministic,
        "ring.slots",
        f"{r.slots} < stager.batch_size={s.batch_size}: in deterministic mode a batch "
        "needs that many slots in flight; raise ring.slots",
    )
    check(s.batch_slots >= 2, "stager.batch_slots", "must be >= 2 (3 = triple buffering)")


def _validate_buckets(cfg: Config) -> None:
    s, top = cfg.stager, cfg.features.max_frames
    check(s.batch_frames >= 0, "stager.batch_frames", "must be >= 0 (0 = batch_size x max_frames)")
    check(0 <= s.auto_buckets <= MAX_BUCKETS, "stager.auto_buckets", f"must be 0..{MAX_BUCKETS}")
    check(len(s.buckets) <= MAX_BUCKETS, "stager.buckets", f"at most {MAX_BUCKETS} buckets")
    if not s.bucketed:
        return
    check(
        not (s.buckets and s.auto_buckets),
        "stager.auto_buckets",
        "set stager.buckets or stager.auto_buckets, not both",
    )
    check(
        s.deterministic,
        "stager.deterministic",
        "length buckets need deterministic: true (each batch is a fixed part of the plan)",
    )
    if s.buckets:
        check(
            list(s.buckets) == sorted(set(s.buckets)) and s.buckets[0] >= 1,
            "stager.buckets",
            f"must be distinct positive frame counts in ascending order, got {list(s.buckets)}",
        )
        check(
            s.buckets[-1] == top,
            "stager.buckets",
            f"the largest bucket ({s.buckets[-1]}) must equal features.max_frames={top}: "
            "it sets the slot size",
        )
    check(
        cfg.batch_frames >= top,
        "stager.batch_frames",
        f"{cfg.batch_frames} < features.max_frames={top}: the longest bucket needs a row",
    )


def _validate_balance(cfg: Config) -> None:
    b = cfg.stager.balance
    if not b.on:
        check(
            not b.weights, "stager.balance.weights", "needs stager.balance.by (language or speaker)"
        )
        return
    check(
        0.0 <= b.temperature <= 1.0,
        "stager.balance.temperature",
        f"must be in [0, 1] (1: as in the data, 0: uniform), got {b.temperature}",
    )
    for name, weight in b.weights.items():
        check(
            0.0 < weight < 1e6,
            f"stager.balance.weights.{name}",
            f"must be a number > 0 and < 1e6 (a multiplier; 1 is the default), got {weight}",
        )
    check(
        cfg.stager.deterministic,
        "stager.deterministic",
        "balanced epochs need deterministic: true (each batch is a fixed part of the plan)",
    )


def _validate_producers(cfg: Config) -> None:
    check(
        cfg.producers.orphan_s > 2 * cfg.ring.lease_s,
        "producers.orphan_s",
        f"{cfg.producers.orphan_s} s must exceed two ring.lease_s ({cfg.ring.lease_s} s): "
        "a producer must outlast a stager's restart and its own HELLO again",
    )


def _validate_transport(cfg: Config) -> None:
    t = cfg.transport
    check(1 <= t.port <= 65535, "transport.port", "must be a TCP port number")
    check(
        t.kind != "tcp" or is_loopback(t.host) or t.keys_dir != "",
        "transport.keys_dir",
        f"binding {t.host} (not loopback) needs CURVE keys: run `ringfeed keys DIR --client "
        "NAME` and set transport.keys_dir, or bind transport.host: 127.0.0.1",
    )
    check(
        t.keys_dir == "" or t.kind == "tcp",
        "transport.keys_dir",
        "keys authenticate tcp peers only: set transport.kind: tcp (and host, port), or "
        "remove keys_dir (with kind: ipc no remote producer can reach the stager)",
    )
