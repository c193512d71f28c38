"""The feature cache in this process: a second pass decodes nothing, corrupt entries
recompute, changed settings or files miss (several processes: tests/process/test_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.features.cache import FeatureCache, settings_hash
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.open import read_corpus
from tests.support.configs import clips_cfg

N_CLIPS = 4


def _short_entries(cfg: Config) -> list:
    entries = [e for e in read_corpus(cfg)[0] if os.path.getsize(e.audio_path) < 250_000]
    return entries[:N_CLIPS]


def test_second_pass_skips_decode_and_mel(tmp_path: Path) -> None:
    cfg = clips_cfg(tmp_path)
    entries = _short_entries(cfg)
    first = SamplePipeline(cfg)
    mels = [first(e).mel.copy() for e in entries]
    assert first.counters.decoded == first.counters.mels == N_CLIPS
    first.close()
    second = SamplePipeline(cfg)  # a new process would start exactly like this
    for entry, mel in zip(entries, mels, strict=True):
        np.testing.assert_array_equal(second(entry).mel, mel)
    assert (second.counters.decoded, second.counters.mels) == (0, 0)
    assert second.cache.stats.hits == N_CLIPS


def test_corrupt_and_truncated_entries_recompute(tmp_path: Path) -> None:
    cfg = clips_cfg(tmp_path)
    entries = _short_entries(cfg)[:2]
    pipe = SamplePipeline(cfg)
    for entry in entries:
        pipe(entry)
    pipe.close()
    (shard,) = pipe.cache.directory.glob("*.bin")
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # flip a byte of the first entry
    shard.write_bytes(bytes(data[: len(data) - 8]))  # and cut the second one short
    again = SamplePipeline(cfg)
    for entry in entries:
        assert again(entry).mel.shape[1] == cfg.features.n_mels
    assert again.counters.decoded == 2 and again.cache.stats.corrupt == 2
    third = SamplePipeline(cfg)  # the recomputed copies are found next time
    for entry in entries:
        third(entry)
    assert third.counters.decoded == 0


def test_settings_change_misses(tmp_path: Path) -> None:
    cfg = clips_cfg(tmp_path)
    assert settings_hash(cfg) == settings_hash(replace(cfg, features={"cache_dir": "x"}))
    for section, change in [("features", {"n_mels": 64}), ("audio", {"trim_silence": True}),
                            ("features", {"device": "stager"})]:  # fmt: skip
        changed = replace(cfg, **{section: change})
        assert settings_hash(changed) != settings_hash(cfg)
    entry = _short_entries(cfg)[0]
    SamplePipeline(cfg)(entry)
    other = SamplePipeline(replace(cfg, features={"n_mels": 64}))
    assert other(entry).mel.shape[1] == 64 and other.counters.decoded == 1


def test_edited_file_misses(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    path.write_bytes(b"abc")
    key = FeatureCache.key(str(path))
    path.write_bytes(b"abcd")
    assert FeatureCache.key(str(path)) != key
    with pytest.raises(FileNotFoundError):
        FeatureCache.key(str(tmp_path / "missing.wav"))
