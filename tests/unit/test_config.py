"""The configuration rejects what cannot work, naming the key and the fix (its generated
reference page: tests/docs/test_docs_and_code.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from ringfeed.shared.config import Config, ConfigError, config_from_dict, load_config, replace
from ringfeed.shared.config.environment import run_dir, user_cache_dir
from ringfeed.shared.config.moved import MOVED_KEYS
from ringfeed.shared.memory.ring import check_rings_fit, rings_bytes, slot_bytes
from tests.support.paths import REPO


def test_defaults_and_derived_sizes() -> None:
    cfg = Config()
    fields = cfg.sample_fields()
    assert fields["tokens"][0] == (200,) and fields["tokens"][1].name == "int32"
    assert fields["mel"][0] == (800, 80) and fields["mel"][1].name == "float32"
    assert slot_bytes(fields) == 832 + 800 * 80 * 4  # tokens padded to 64 bytes
    stager_mode = replace(cfg, features={"device": "stager"})
    assert "wave" in stager_mode.sample_fields() and "mel" not in stager_mode.sample_fields()
    assert stager_mode.max_samples == 800 * 256


def test_the_look_ahead_is_sized_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """ring.lookahead 0: what the producers ask for, as far as both rings fit in 90 % of
    /dev/shm: a container's default 64 MiB takes the default 2 producers, a large host
    gives 14 all they ask; a look-ahead set by hand is kept."""
    import ringfeed.shared.config.config as config_module

    for shm_mib, workers, ahead in ((64, 2, 2), (64, 14, 2), (1 << 14, 2, 3), (1 << 14, 14, 15)):
        monkeypatch.setattr(config_module, "shm_total_bytes", lambda mib=shm_mib: mib << 20)
        cfg = config_from_dict({"producers": {"workers": workers}})
        assert cfg.lookahead_batches == ahead, (shm_mib, workers)
        assert cfg.lookahead_need == 2 * -(-workers * 16 // 32) + 1
        assert rings_bytes(cfg) <= 0.9 * (shm_mib << 20)
    cfg = config_from_dict({"producers": {"workers": 14}, "ring": {"lookahead": 20}})
    assert cfg.lookahead_batches == 20


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"ring": {"lookahed": 3}}, "ring.lookahed: unknown key; did you mean 'lookahead'?"),
        ({"train": {"learning_rate": "fast"}}, "train.learning_rate: must be a number"),
        ({"transport": {"keys_dir": "keys"}}, "transport.keys_dir: keys authenticate tcp"),
        ({"ring": {"lookahead": -1}}, "ring.lookahead: must be >= 0"),
        ({"ring": {"lookahead": "many"}}, "ring.lookahead: must be an integer"),
        ({"ring": {"slots": 64}}, "ring.slots: no longer a setting"),
        ({"stager": {"deterministic": "yes"}}, "stager.deterministic: must be true or false"),
        ({"features": {"device": "gpu"}}, "features.device: must be one of"),
        ({"ring": {"lease_s": 1.0, "heartbeat_s": 1.0}}, "ring.lease_s"),
        ({"features": {"fmax": 20000.0}}, "features.fmax"),
        ({"nonsense": {}}, "nonsense: unknown key"),
    ],
)
def test_errors_name_the_key(raw: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        config_from_dict(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"model": {"d_model": 64}}, "model.d_model: moved to model.kwargs.d_model"),
        ({"model": {"dropout": 0.0}}, "model.dropout: moved to model.kwargs.dropout"),
        ({"run": {"root": "runs"}}, "run.root: moved to run_root"),
        (
            {"text": {"cache_size": 10}},
            "text.cache_size: no longer a setting (a constant in producer/text/encoder.py)",
        ),
        ({"train": {"cv_window": 50}}, "train.cv_window: no longer a setting (a constant in"),
        (
            {"features": {"log_floor": 1e-5}},
            "features.log_floor: no longer a setting (LOG_FLOOR in shared/sample/content.py)",
        ),
        (
            {"data": {"synthetic_raise": [3]}},
            "data.synthetic_raise: fault injection is for tests only (RINGFEED_SOURCE_HOOK",
        ),
        ({"data": {"synthetic_exit": [3]}}, "data.synthetic_exit: fault injection is for tests"),
        ({"data": {"synthetic_delay_s": 0.1}}, "data.synthetic_delay_s: fault injection is"),
    ],
)
def test_a_key_of_the_old_shape_says_where_it_went(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    assert str(info.value).startswith(message)


def test_moved_keys_are_not_keys_of_the_schema() -> None:
    """A note for an old key must never hide a key that is still read."""
    raw = Config().to_dict()
    for key in MOVED_KEYS:
        section, name = key.split(".")
        assert not isinstance(raw.get(section), dict) or name not in raw[section], key


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"model": {"kwargs": [64]}}, "model.kwargs: must be a mapping"),
        ({"model": {"kwargs": {"d_model": {1, 2}}}}, "model.kwargs.d_model: must be plain YAML"),
        ({"run_root": 3}, "run_root: must be a string"),
    ],
)
def test_mapping_and_top_level_keys_name_the_key(raw: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        config_from_dict(raw)


def test_model_kwargs_and_run_root_round_trip_through_yaml(tmp_path: Path) -> None:
    kwargs = {"d_model": 64, "dropout": 0.0, "widths": [1, 2], "name": "x"}
    cfg = config_from_dict({"model": {"kwargs": kwargs}, "run_root": str(tmp_path)})
    path = tmp_path / "resolved.yaml"
    path.write_text(cfg.to_yaml())
    # Its input paths, relative to the working directory here, are written absolute.
    absolute = replace(cfg, data={"path": str(Path(cfg.data.path).absolute())})
    assert load_config(path) == absolute and cfg.model.kwargs == kwargs
    assert run_dir(cfg, "r1") == tmp_path / "r1"
    assert replace(cfg, run_root="elsewhere").run_root == "elsewhere"


def test_a_path_with_undecodable_bytes_round_trips_and_bad_yaml_names_its_character(
    tmp_path: Path,
) -> None:
    """Configs load and dump through libyaml where it can (shared/config/config.py): a
    path whose bytes are not UTF-8 (a lone surrogate in Python), which libyaml can neither
    write nor read back, still round-trips, as a config written before reads; a broken
    file's error still shows the offending character and its line."""
    cfg = config_from_dict({"data": {"path": "/data/caf\udce9/corpus"}})
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml(), errors="surrogateescape")
    assert load_config(path).data.path == "/data/caf\udce9/corpus"
    path.write_text(yaml.safe_dump(cfg.to_dict()))  # what the Python dumper alone wrote
    assert load_config(path).data.path == "/data/caf\udce9/corpus"
    path.write_text("train:\n\tsteps: 3\n")
    with pytest.raises(ConfigError, match=r"(?s)not valid YAML.*'\\t'.*line 2"):
        load_config(path)


def test_ring_larger_than_dev_shm_is_refused_before_start() -> None:
    cfg = replace(Config(), ring={"lookahead": 100_000})  # ~780 GiB of batch slots
    with pytest.raises(ConfigError, match="lower ring.lookahead"):
        check_rings_fit(cfg)


def test_numbers_yaml_reads_as_text_are_numbers(tmp_path: Path) -> None:
    """YAML 1.1 reads 2e-3 (no dot) as a string; a float key takes it as the number."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  learning_rate: 2e-3\nring:\n  lease_s: 1E1\n")
    cfg = load_config(path)
    assert cfg.train.learning_rate == 0.002 and cfg.ring.lease_s == 10.0
    with pytest.raises(ConfigError, match="ring.lookahead: must be an integer"):
        config_from_dict({"ring": {"lookahead": "1e3"}})  # counts stay integers


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"train": {"steps": -1}}))
    with pytest.raises(ConfigError, match=r"bad\.yaml: train\.steps"):
        load_config(path)


def _keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        out |= _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return out


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_and_every_key_is_read(path: Path) -> None:
    load_config(path)
    code = "".join(
        p.read_text()
        for d in ("shared", "producer", "consumer", "scripts")
        for p in (REPO / d).rglob("*.py")
    )
    for key in _keys(yaml.safe_load(path.read_text()) or {}):
        name = key.rsplit(".", 1)[-1]
        # Sections are often bound to a short name (rc = cfg.ring), and a factory's
        # model.kwargs to its own (m = DefaultModelKwargs): look for the attribute.
        assert f".{name}" in code, f"{path.name}: {key} is read by no code"


def test_input_paths_are_relative_to_the_config_file_outputs_to_the_working_directory(
    tmp_path: Path,
) -> None:
    """runs/ and .cache used to land in the repository whatever the working folder,
    and a config's data.path meant something else from each folder."""
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "c.yaml"
    path.write_text("data: {path: ../corpus}\ntransport: {kind: tcp, keys_dir: keys}\n")
    cfg = load_config(path)
    assert cfg.data.path == str(tmp_path / "configs" / ".." / "corpus")
    assert cfg.transport.keys_dir == str(tmp_path / "configs" / "keys")
    assert cfg.run_root == "runs" and cfg.features.cache_dir == str(user_cache_dir() / "features")
    path.write_text("transport: {kind: tcp, keys_dir: ~/.ringfeed/keys}\n")
    assert load_config(path).transport.keys_dir == str(Path.home() / ".ringfeed" / "keys")
    again = tmp_path / "again.yaml"
    again.write_text(cfg.to_yaml())
    assert load_config(again) == cfg


def test_a_mel_through_the_api_writes_nothing_into_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """features.cache_dir was `.cache/features` from the working directory: a mel computed
    by a script's own Config() left the host's FFT choice in ./.cache/features/fft/. The
    default is now the per-user cache ($XDG_CACHE_HOME/ringfeed, else ~/.cache/ringfeed);
    a relative cache_dir written in a config stays the working directory's, as run_root."""
    from ringfeed.producer.features.mel import log_mel

    work, xdg = tmp_path / "work", tmp_path / "xdg"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    cfg = Config()
    assert cfg.features.cache_dir == str(xdg / "ringfeed" / "features")
    log_mel(np.zeros(4000, np.float32), cfg)
    assert list(work.iterdir()) == []
    assert len(list((xdg / "ringfeed" / "features" / "fft").glob("*.json"))) == 1
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # not absolute: ignored, as XDG says
    assert Config().features.cache_dir == str(Path.home() / ".cache" / "ringfeed" / "features")
    assert config_from_dict({"features": {"cache_dir": "mine"}}).features.cache_dir == "mine"
    assert config_from_dict(Config().to_dict()) == Config()  # the resolved path round-trips


def test_only_ringfeeds_own_old_factory_name_is_renamed() -> None:
    """A checkpoint's config names the default model as before the package move; a
    user's own package called `scripts` keeps its name."""
    old = config_from_dict({"model": {"factory": "consumer.trainer.model:build_default_model"}})
    assert old.model.factory == "ringfeed.consumer.trainer.model:build_default_model"
    own = config_from_dict({"model": {"factory": "scripts.mymodel:build"}})
    assert own.model.factory == "scripts.mymodel:build"


def test_non_loopback_bind_needs_keys() -> None:
    with pytest.raises(ConfigError, match="transport.keys_dir"):
        config_from_dict({"transport": {"kind": "tcp", "host": "0.0.0.0"}})
