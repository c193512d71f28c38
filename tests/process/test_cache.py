"""The feature cache across processes: several share one folder; a cache whose writes fail,
or whose filesystem fills, stops writing for the run (a child process each)."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.feature_cache import MAX_WRITE_FAILURES, FeatureCache
from tests.support.configs import clips_cfg
from tests.support.paths import REPO
from tests.support.processes import run_on_small_tmpfs


def test_processes_share_one_cache_dir(tmp_path: Path) -> None:
    cfg = clips_cfg(tmp_path)
    files = []
    for i in range(40):
        path = tmp_path / f"f{i}.wav"
        path.write_bytes(b"x" * (i + 1))  # distinct files: the key is path, size, mtime
        files.append(str(path))
    ctx = mp.get_context("spawn")
    reader = FeatureCache(cfg, rescan_interval_s=0.0)  # opened before the writers
    procs = [
        ctx.Process(target=_write_entries, args=(cfg, files[k::2], 1000.0 * k)) for k in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(list(reader.directory.glob("shard-*.idx"))) == 2
    for k in range(2):
        for i, path in enumerate(files[k::2]):
            hit = reader.get(FeatureCache.key(Entry("", path, "")))
            assert hit is not None, path
            array, truncated = hit
            assert array.shape == (10 + i, 8) and not truncated
            assert float(array[0, 0]) == 1000.0 * k + i
    assert reader.stats.hits == 40 and len(FeatureCache(cfg)) == 40


def test_a_cache_whose_writes_fail_stops_writing_for_the_run(tmp_path: Path) -> None:
    """RLIMIT_FSIZE (64 KiB) makes every shard write fail for real, as root too; the
    failed shards are removed, so only settings.json is left."""
    argv = [str(tmp_path / "cache"), str(REPO / "data/ljspeech-mini"), str(64 << 10)]
    proc = subprocess.run(
        [sys.executable, "-c", FILL_THEN_MEASURE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = _check_back_off(proc, MAX_WRITE_FAILURES, "stops writing")
    assert out["stats"]["writes"] == 0 and out["files"] == ["settings.json"]


def test_a_full_cache_filesystem_stops_writing_for_the_run(tmp_path: Path) -> None:
    """A real full 1 MiB tmpfs (issue 18, case 9): a few arrays fit, then one write
    fails and the cache stops at once, saying the disk is full and where (issue 35: no
    retry finds room); one shard pair holds what fit."""
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
    proc = run_on_small_tmpfs(str(where), "1m", argv)
    out = _check_back_off(proc, 1, f"no space left on the disk holding {where}/")
    assert " free of 1.0 MiB)" in proc.stderr, proc.stderr
    assert out["stats"]["writes"] >= 1
    assert len(out["files"]) <= 3, out["files"]  # settings.json and one shard pair


def _write_entries(cfg: Config, files: list[str], tag: float) -> None:
    """Runs in a spawned process: cache one synthetic array per file."""
    cache = FeatureCache(cfg)
    for i, path in enumerate(files):
        key = FeatureCache.key(Entry("", path, ""))
        cache.put(key, np.full((10 + i, 8), tag + i, np.float32), False)
    cache.close()


# Fills the cache until it stops writing (the filesystem says no), then runs the pipeline
# on short clips and times 2,000 puts more; prints what a test checks, as JSON.
FILL_THEN_MEASURE = """
import json, os, resource, sys, time
import numpy as np
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.open import read_corpus
from tests.support.paths import REPO
from tests.support.processes import run_on_small_tmpfs
cache_dir, data, fsize = sys.argv[1], sys.argv[2], int(sys.argv[3])
if fsize:
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
cfg = replace(Config(), data={"path": data}, features={"cache_dir": cache_dir})
pipe = SamplePipeline(cfg)
cache = pipe.features.cache
big = np.ones((400, 80), np.float32)  # 125 KiB
for i in range(100):
    if not cache.writing:
        break
    try:
        cache.put(i.to_bytes(16, "little"), big, False)
    except OSError:
        pass
entries = [e for e in read_corpus(cfg)[0] if os.path.getsize(e.audio_path) < 250_000]
for entry in entries[:4]:
    pipe(entry)
t = time.perf_counter()
for i in range(2000):
    cache.put((1000 + i).to_bytes(16, "little"), big, False)
print(json.dumps({"stats": vars(cache.stats), "work": vars(pipe.counters),
                  "puts_s": time.perf_counter() - t, "files": os.listdir(cache.directory)}))
"""


def _check_back_off(proc: subprocess.CompletedProcess, failures: int, warning: str) -> dict:
    """What every full cache must show: `failures` failed writes, then no write tried,
    counted in the cache and in the producer's work counters, one warning (saying
    `warning`), O(1) puts."""
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    stats, work = out["stats"], out["work"]
    assert stats["write_failures"] == failures
    assert stats["writes_off"] == 4 + 2000 and work["cache_writes_off"] == 4
    assert work["cache_errors"] == 0 and work["mels"] == 4  # the samples were made
    assert proc.stderr.count(warning) == 1, proc.stderr
    # Before the back-off each put opened a new shard pair scanning names from 0:
    # 2,000 puts took seconds; now each is an attribute check (~0.3 us).
    assert out["puts_s"] < 0.5, out["puts_s"]
    return out
