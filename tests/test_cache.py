"""The feature cache: second pass decodes nothing, corrupt entries recompute, processes share."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest

from producer.cache import FeatureCache, settings_hash
from producer.pipeline import SamplePipeline
from shared.config import Config, replace
from shared.dataset import read_dataset

REPO = Path(__file__).resolve().parents[1]
N_CLIPS = 4


def _config(tmp_path: Path, **features: object) -> Config:
    return replace(Config(), data={"path": str(REPO / "data/ljspeech-mini")},
                   features={"cache_dir": str(tmp_path / "cache"), **features})  # fmt: skip


def _short_entries(cfg: Config) -> list:
    entries = [e for e in read_dataset(cfg)[0] if os.path.getsize(e.audio_path) < 250_000]
    return entries[:N_CLIPS]


def test_second_pass_skips_decode_and_mel(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
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
    cfg = _config(tmp_path)
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
    cfg = _config(tmp_path)
    assert settings_hash(cfg) == settings_hash(replace(cfg, features={"cache_dir": "x"}))
    for section, change in [("features", {"n_mels": 64}), ("audio", {"trim_silence": True}),
                            ("features", {"device": "stager"})]:  # fmt: skip
        changed = replace(cfg, **{section: change})
        assert settings_hash(changed) != settings_hash(cfg)
    entry = _short_entries(cfg)[0]
    SamplePipeline(cfg)(entry)
    other = SamplePipeline(replace(cfg, features={"n_mels": 64}))
    assert other(entry).mel.shape[1] == 64 and other.counters.decoded == 1


def _write_entries(cfg: Config, files: list[str], tag: float) -> None:
    """Runs in a spawned process: cache one synthetic array per file."""
    cache = FeatureCache(cfg)
    for i, path in enumerate(files):
        cache.put(FeatureCache.key(path), np.full((10 + i, 8), tag + i, np.float32), False)
    cache.close()


def test_processes_share_one_cache_dir(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    files = []
    for i in range(40):
        path = tmp_path / f"f{i}.wav"
        path.write_bytes(b"x" * (i + 1))  # distinct files: the key is path, size, mtime
        files.append(str(path))
    ctx = mp.get_context("spawn")
    reader = FeatureCache(cfg, rescan_interval_s=0.0)  # opened before the writers
    procs = [ctx.Process(target=_write_entries, args=(cfg, files[k::2], 1000.0 * k))
             for k in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(list(reader.directory.glob("shard-*.idx"))) == 2
    for k in range(2):
        for i, path in enumerate(files[k::2]):
            hit = reader.get(FeatureCache.key(path))
            assert hit is not None, path
            array, truncated = hit
            assert array.shape == (10 + i, 8) and not truncated
            assert float(array[0, 0]) == 1000.0 * k + i
    assert reader.stats.hits == 40 and len(FeatureCache(cfg)) == 40


def test_edited_file_misses(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    path.write_bytes(b"abc")
    key = FeatureCache.key(str(path))
    path.write_bytes(b"abcd")
    assert FeatureCache.key(str(path)) != key
    with pytest.raises(FileNotFoundError):
        FeatureCache.key(str(tmp_path / "missing.wav"))
