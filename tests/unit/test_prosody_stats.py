"""Per-speaker prosody statistics (producer/prepare/prosody_pass.py, shared/run/prosody_table.py) on
the multilingual demo: the table against a direct computation from the producers' own
pitch and energy fields, features.pitch_norm giving zero-mean unit-variance voiced
log-f0 per speaker (and over the corpus), a pass that stops resumes where it stopped,
a missing table refused with what to run, and every checkpoint carrying the table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.prepare import prosody_pass
from ringfeed.scripts import cli
from ringfeed.shared.config import Config, ConfigError, load_config, replace
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.prosody_table import RUN_FILE, keep_in_run, table_path
from tests.support.paths import REPO

TOLERANCE = 1e-3


def demo_cfg(tmp_path: Path, **features: object) -> Config:
    return replace(
        load_config(REPO / "configs" / "multilingual.yaml"),
        features={"cache_dir": str(tmp_path / "cache"), "pitch": True, "energy": True, **features},
    )


def direct(cfg: Config) -> dict[str, dict[str, np.ndarray]]:
    """Per speaker, every voiced log-f0 and every energy value of the producers' fields."""
    index = open_corpus(cfg, in_subprocess=False)
    pipe = SamplePipeline(replace(cfg, features={"cache": False}), index=index)
    out: dict[str, dict[str, list]] = {}
    for k, entry in enumerate(index.entries):
        s = pipe(entry, k)
        mine = out.setdefault(entry.speaker, {"f0": [], "energy": []})
        mine["f0"].append(np.log(s.fields["pitch"][s.fields["voiced"] == 1].astype(np.float64)))
        mine["energy"].append(s.fields["energy"].astype(np.float64))
    return {who: {k: np.concatenate(v) for k, v in d.items()} for who, d in out.items()}


def test_the_table_is_what_a_direct_computation_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = demo_cfg(tmp_path)
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(json.loads(json.dumps(cfg.to_dict()))))
    assert cli.main(["stats", str(config), "--workers", "2"]) == 0  # spawned workers
    out = capsys.readouterr().out
    assert "3 speakers, 0 clips skipped" in out and "ava" in out
    table = json.loads(table_path(cfg, open_corpus(cfg).digest).read_text())
    want = direct(cfg)
    assert sorted(table["speakers"]) == sorted(want) == ["ava", "ben", "cyrus"]
    for who, values in [
        *want.items(),
        ("", {k: np.concatenate([v[k] for v in want.values()]) for k in ("f0", "energy")}),
    ]:
        got = table["speakers"][who] if who else table["global"]
        assert got["voiced_frames"] == len(values["f0"]) and got["frames"] == len(values["energy"])
        for name, key in (("log_f0", "f0"), ("energy", "energy")):
            assert abs(got[f"{name}_mean"] - values[key].mean()) < TOLERANCE, (who, name)
            assert abs(got[f"{name}_std"] - values[key].std()) < TOLERANCE, (who, name)


@pytest.mark.parametrize("mode", ["speaker", "global"])
def test_pitch_norm_gives_zero_mean_unit_variance_voiced_log_f0(tmp_path: Path, mode: str) -> None:
    cfg = demo_cfg(tmp_path, pitch_norm=mode)
    index = open_corpus(cfg, in_subprocess=False)
    prosody_pass.compute_table(cfg, index, workers=1)
    pipe = SamplePipeline(cfg, index=index)
    groups: dict[str, list[np.ndarray]] = {}
    for k, entry in enumerate(index.entries):
        s = pipe(entry, k)
        voiced = s.fields["voiced"] == 1
        assert (s.fields["pitch"][~voiced] == 0).all()
        groups.setdefault(entry.speaker if mode == "speaker" else "", []).append(
            s.fields["pitch"][voiced].astype(np.float64)
        )
    assert len(groups) == (3 if mode == "speaker" else 1)
    for who, parts in groups.items():
        values = np.concatenate(parts)
        assert abs(values.mean()) < TOLERANCE and abs(values.std() - 1) < TOLERANCE, who


def test_a_pass_that_stops_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = demo_cfg(tmp_path)
    calls, stopped = [], []
    real = prosody_pass.clip_sums

    class Stopped(Exception):
        """The pass stopped from outside (a SIGTERM, a crash) in the middle of a chunk."""

    def counted(*args: object) -> np.ndarray:
        calls.append(1)
        if len(calls) == 10 and not stopped:
            stopped.append(1)
            raise Stopped  # in the middle of the third chunk
        return real(*args)

    monkeypatch.setattr(prosody_pass, "CHUNK", 4)
    monkeypatch.setattr(prosody_pass, "clip_sums", counted)
    with pytest.raises(Stopped):
        prosody_pass.compute_table(cfg, open_corpus(cfg), workers=1)
    path = table_path(cfg, open_corpus(cfg).digest)
    assert not path.exists() and path.with_name(path.name.replace(".json", ".partial.npz")).exists()
    calls.clear()
    _, table = prosody_pass.compute_table(cfg, open_corpus(cfg), workers=1)
    assert len(calls) == 40 - 8, "the two chunks done before the stop are not done again"
    monkeypatch.setattr(prosody_pass, "clip_sums", real)
    again = demo_cfg(tmp_path / "again")
    _, whole = prosody_pass.compute_table(again, open_corpus(again), workers=1)
    assert table["speakers"] == whole["speakers"] and table["global"] == whole["global"]


def test_a_missing_table_is_refused_with_what_to_run(tmp_path: Path) -> None:
    cfg = demo_cfg(tmp_path, pitch_norm="speaker")
    index = open_corpus(cfg, in_subprocess=False)
    refusal = (
        r"^features.pitch_norm: speaker needs this corpus's prosody statistics "
        r"\(none at .*\): run `ringfeed prepare CONFIG` first \(`ringfeed run` and "
        r"`ringfeed validate` do\)$"
    )
    with pytest.raises(ConfigError, match=refusal):
        SamplePipeline(cfg, index=index)
    prosody_pass.compute_table(cfg, open_corpus(cfg), workers=1)
    other = replace(cfg, features={"hop_length": 200})  # other frames: another table
    with pytest.raises(ConfigError, match="ringfeed prepare"):
        SamplePipeline(other, index=open_corpus(other, in_subprocess=False))
    with pytest.raises(ConfigError, match="^features.pitch_norm: normalizes the pitch field"):
        replace(Config(), features={"pitch_norm": "global"})


def test_every_checkpoint_carries_the_table(tmp_path: Path) -> None:
    import keras

    from ringfeed.consumer.trainer.checkpoint import CheckpointManager

    cfg = demo_cfg(tmp_path, pitch_norm="speaker")
    _, table = prosody_pass.compute_table(cfg, open_corpus(cfg), workers=1)
    run = tmp_path / "run"
    keep_in_run(cfg, open_corpus(cfg).digest, run)  # what the stager does at start
    assert json.loads((run / RUN_FILE).read_text()) == table
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    CheckpointManager(run, model, keras.optimizers.Adam()).save(3, {}, cfg.to_yaml())
    sidecar = json.loads((run / "checkpoints" / "ckpt-3.json").read_text())
    assert sidecar["prosody"]["speakers"]["ava"] == table["speakers"]["ava"]
