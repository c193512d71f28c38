"""What `ringfeed validate` and `ringfeed run` check before any process starts, once the
corpus is prepared (producer/prepare/prepare.py: they prepare it first).

Each check is cheap (seconds for a 13,100-item LJSpeech): the rings against
free /dev/shm, the dataset's path, format and lines, a sample of the audio
files those lines name (headers only), the feature cache directory, the CURVE
keys of a TCP endpoint, whether stager-side mels have a framework and a GPU to run on, the
names stager.balance.weights gives, the default model's model.kwargs, the
prosody table features.pitch_norm applies (on a producer host too), and the
configured fields on the first clip that reads (producer/start_check.py: a user
function of the wrong shape refuses the run here, not by quarantining every
clip). A fatal finding stops a run before it starts, with one line that says what to
change (exit code 2, "configuration"); a warning is printed and the run goes on.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.config.transport import is_loopback

# Audio files whose headers are read, spread over the dataset.
AUDIO_SAMPLE = 8


@dataclass(frozen=True)
class Finding:
    fatal: bool
    message: str


def preflight(cfg: Config, role: str = "head") -> list[Finding]:
    """Everything found wrong with cfg on this host, fatal ones first. role: "head"
    (stager, trainer and local producers) or "producer" (a host that only runs
    `ringfeed producers --connect`: its dataset, cache and client keys)."""
    if role == "producer":
        findings = [*_dataset(cfg), *_cache(cfg), *_client_keys(cfg)]
    else:
        findings = [*_rings(cfg), *_dataset(cfg), *_cache(cfg), *_keys(cfg), *_devices(cfg)]
        findings += _model(cfg)
    if not any(f.fatal for f in findings):  # a real clip through the fields, if it reads
        findings += _fields(cfg)
    return sorted(findings, key=lambda f: not f.fatal)


def _rings(cfg: Config) -> list[Finding]:
    from ringfeed.shared.memory.ring import check_rings_fit

    try:
        check_rings_fit(cfg)
    except ConfigError as exc:
        return [Finding(True, str(exc))]
    return []


def _model(cfg: Config) -> list[Finding]:
    """The default model's model.kwargs (another factory checks its own when it runs)."""
    from ringfeed.consumer.trainer.model_kwargs import DEFAULT_FACTORY, default_model_kwargs

    if cfg.model.factory != DEFAULT_FACTORY:
        return []
    try:
        default_model_kwargs(dict(cfg.model.kwargs))
    except ConfigError as exc:
        return [Finding(True, str(exc))]
    return []


def _dataset(cfg: Config) -> list[Finding]:
    from ringfeed.shared.corpus.entry import CorpusError
    from ringfeed.shared.corpus.open import open_prepared

    try:
        index = open_prepared(cfg)
    except (CorpusError, ConfigError) as exc:  # ConfigError: what the format cannot serve
        return [Finding(True, str(exc))]
    out = _balance(cfg, index) + _prosody(cfg, index)
    if not index.has_audio:  # computed items: no files to look at
        return out
    if index.bad_lines:
        first = index.bad_lines[0]
        out.append(
            Finding(
                index.n_items == 0,
                f"data.path: {len(index.bad_lines)} unusable metadata lines, the first "
                f"{first.file}:{first.line}: {first.reason}",
            )
        )
    if index.n_items == 0:
        out.append(Finding(True, f"data.path: {cfg.data.path} has no usable items"))
        return out
    return out + _audio_sample(index, cfg)


def _prosody(cfg: Config, index: object) -> list[Finding]:
    """features.pitch_norm's table is on this host (a producer host too: its producers
    read their own features.cache_dir) and was made by this pitch estimator: otherwise
    the stager would start and every producer refuse it."""
    from ringfeed.producer.pipeline import prosody_table

    try:
        prosody_table(cfg, index)
    except ConfigError as exc:
        return [Finding(True, str(exc))]
    return []


def _balance(cfg: Config, index: object) -> list[Finding]:
    """stager.balance's weights name groups the corpus has (the stager checks it again
    when it makes its plan, but by then a run has started)."""
    if not cfg.stager.balance.on:
        return []
    from ringfeed.consumer.stager.plan.balance import named_weights, plan_groups
    from ringfeed.shared.run.id_tables import corpus_tables

    balance = cfg.stager.balance
    try:
        named_weights(balance, plan_groups(balance, corpus_tables(cfg, index), index))
    except ConfigError as exc:
        return [Finding(True, str(exc))]
    return []


def _audio_sample(index, cfg: Config) -> list[Finding]:
    from ringfeed.producer.audio.decode import read_header
    from ringfeed.shared.corpus.clips import ClipReader

    step = max(1, index.n_items // AUDIO_SAMPLE)
    picked = list(range(0, index.n_items, step))[:AUDIO_SAMPLE]
    bad = []
    clips = ClipReader(cfg)  # a file, a tar member, a Parquet byte range, an object
    for item in picked:
        entry = index.entry(item)
        path = entry.audio_path
        try:
            with clips.read_clip(entry) as clip:
                read_header(clip)
        except Exception as exc:  # soundfile raises several types on a bad file
            if not path.lower().endswith((".mp3", ".m4a", ".ogg", ".opus")):
                bad.append(f"{path}: {exc}")
    if not bad:
        return []
    return [
        Finding(
            len(bad) == len(picked),
            f"data.path: {len(bad)} of {len(picked)} sampled audio files unreadable, "
            f"the first {bad[0]}",
        )
    ]


def _fields(cfg: Config) -> list[Finding]:
    """features.user_function imports, as a producer will at start, and the configured
    fields do not fail the first clip that reads (producer/start_check.py)."""
    if not cfg.features.user_function and not cfg.features.durations_dir:
        return []
    from ringfeed.producer.features.extra_fields import load_user_function
    from ringfeed.producer.pipeline import fields_problem
    from ringfeed.shared.corpus.open import open_prepared
    from ringfeed.shared.corpus.registry import format_of

    try:
        if cfg.features.user_function:
            load_user_function(cfg.features.user_function)
        index = open_prepared(cfg) if format_of(cfg).has_audio else None
    except ConfigError as exc:
        return [Finding(True, str(exc))]
    problem = fields_problem(cfg, index) if index is not None else ""
    return [Finding(True, problem)] if problem else []


def _cache(cfg: Config) -> list[Finding]:
    if not cfg.features.cache:
        return []
    directory = Path(cfg.features.cache_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return [
            Finding(
                False,
                f"features.cache_dir: {directory} is not writable ({exc.strerror}); the run "
                "goes on without the cache: fix the directory or set features.cache: false",
            )
        ]
    return []


def _keys(cfg: Config) -> list[Finding]:
    from ringfeed.shared.wire.keys import KeysError, load_server

    t = cfg.transport
    if t.kind != "tcp" or (not t.keys_dir and is_loopback(t.host)):
        return []
    try:
        load_server(Path(t.keys_dir))
    except (KeysError, OSError, ValueError) as exc:
        return [Finding(True, f"transport.keys_dir: {exc}")]
    return []


def _client_keys(cfg: Config) -> list[Finding]:
    """A producer host connects over tcp with this host's key pair and the server's
    public key (the bundle `ringfeed keys DIR --client NAME` made for it)."""
    from ringfeed.shared.wire.keys import KeysError, load_client

    t = cfg.transport
    if t.kind != "tcp":
        return [
            Finding(
                True,
                "transport.kind: a producer host connects over tcp: set "
                "transport.kind: tcp (and the head's host and port)",
            )
        ]
    if not t.keys_dir:
        return []
    try:
        load_client(Path(t.keys_dir))
    except (KeysError, OSError, ValueError) as exc:
        return [Finding(True, f"transport.keys_dir: {exc}")]
    return []


def _devices(cfg: Config) -> list[Finding]:
    if cfg.features.device != "stager":
        return []
    from ringfeed.consumer.devices import (
        count_gpus,
        installed_stager_framework,
        no_stager_framework,
    )

    if installed_stager_framework(cfg) is None:
        return [Finding(True, no_stager_framework(cfg))]
    n_gpus, why = count_gpus()
    if n_gpus:
        return []
    return [
        Finding(
            False,
            f"features.device: stager, but this host has no GPU ({why}): stager-side mels "
            "run on the CPU, in the stager alone, at about 2x the CPU of producer mels; set "
            "features.device: producer (docs/running.md#mels-on-the-stager)",
        )
    ]
