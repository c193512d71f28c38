"""The feature cache: second pass decodes nothing, corrupt entries recompute, processes share."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.cache import MAX_WRITE_FAILURES, FeatureCache, settings_hash
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.open import read_corpus
from tests.support.processes import run_on_small_tmpfs

REPO = Path(__file__).resolve().parents[1]
N_CLIPS = 4


def _config(tmp_path: Path, **features: object) -> Config:
    return replace(Config(), data={"path": str(REPO / "data/ljspeech-mini")},
                   features={"cache_dir": str(tmp_path / "cache"), **features})  # fmt: skip


def _short_entries(cfg: Config) -> list:
    entries = [e for e in read_corpus(cfg)[0] if os.path.getsize(e.audio_path) < 250_000]
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


# Fills the cache until it stops writing (the filesystem says no), then runs the pipeline
# on short clips and times 2,000 puts more; prints what a test checks, as JSON.
FILL_THEN_MEASURE = """
import json, os, resource, sys, time
import numpy as np
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.open import read_corpus
from tests.support.processes import run_on_small_tmpfs
cache_dir, data, fsize = sys.argv[1], sys.argv[2], int(sys.argv[3])
if fsize:
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
cfg = replace(Config(), data={"path": data}, features={"cache_dir": cache_dir})
pipe = SamplePipeline(cfg)
big = np.ones((400, 80), np.float32)  # 125 KiB
for i in range(100):
    if not pipe.cache.writing:
        break
    try:
        pipe.cache.put(i.to_bytes(16, "little"), big, False)
    except OSError:
        pass
entries = [e for e in read_corpus(cfg)[0] if os.path.getsize(e.audio_path) < 250_000]
for entry in entries[:4]:
    pipe(entry)
t = time.perf_counter()
for i in range(2000):
    pipe.cache.put((1000 + i).to_bytes(16, "little"), big, False)
print(json.dumps({"stats": vars(pipe.cache.stats), "work": vars(pipe.counters),
                  "puts_s": time.perf_counter() - t, "files": os.listdir(pipe.cache.directory)}))
"""


def _check_back_off(proc: subprocess.CompletedProcess) -> dict:
    """What every full cache must show: three failures, then no write tried, counted
    in the cache and in the producer's work counters, one warning, O(1) puts."""
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    stats, work = out["stats"], out["work"]
    assert stats["write_failures"] == MAX_WRITE_FAILURES
    assert stats["writes_off"] == 4 + 2000 and work["cache_writes_off"] == 4
    assert work["cache_errors"] == 0 and work["mels"] == 4  # the samples were made
    assert proc.stderr.count("stops writing") == 1, proc.stderr
    # Before the back-off each put opened a new shard pair scanning names from 0:
    # 2,000 puts took seconds; now each is an attribute check (~0.3 us).
    assert out["puts_s"] < 0.5, out["puts_s"]
    return out


def test_a_cache_whose_writes_fail_stops_writing_for_the_run(tmp_path: Path) -> None:
    """RLIMIT_FSIZE (64 KiB) makes every shard write fail for real, as root too; the
    failed shards are removed, so only settings.json is left."""
    argv = [str(tmp_path / "cache"), str(REPO / "data/ljspeech-mini"), str(64 << 10)]
    proc = subprocess.run([sys.executable, "-c", FILL_THEN_MEASURE, *argv],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    out = _check_back_off(proc)
    assert out["stats"]["writes"] == 0 and out["files"] == ["settings.json"]


def test_a_full_cache_filesystem_stops_writing_for_the_run(tmp_path: Path) -> None:
    """A real full 1 MiB tmpfs (issue 18, case 9): a few arrays fit, then three writes
    fail and the cache stops; one shard pair holds what fit."""
    where = tmp_path / "full"  # the tmpfs on it exists only in the child's view
    where.mkdir()
    argv = [
        sys.executable,
        "-c",
        FILL_THEN_MEASURE,
        str(where),
        str(REPO / "data/ljspeech-mini"),
        "0",
    ]
    out = _check_back_off(run_on_small_tmpfs(str(where), "1m", argv))
    assert out["stats"]["writes"] >= 1
    assert len(out["files"]) <= 3, out["files"]  # settings.json and one shard pair
