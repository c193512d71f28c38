"""A full disk says so, in one line naming the path and the space left, and the run goes
on where it can (issue 35, item 7): the corpus index is built in memory, the feature and
shard caches stop writing, a checkpoint is tried again at the next one; the quarantine,
which must say why an item is skipped, stops the run with that line. ENOSPC is injected
where a writer meets the OS (tests/support/full_disk.py); the index and the feature
cache also meet a real full tmpfs."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import QuarantineWriter
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.corpus import build as build_module
from ringfeed.shared.corpus import feature_cache as cache_module
from ringfeed.shared.corpus import object_store
from ringfeed.shared.corpus.index import BuiltIndex
from ringfeed.shared.corpus.memory_copies import memory_folder
from ringfeed.shared.corpus.open import NotPrepared, open_corpus, open_prepared, read_corpus
from ringfeed.shared.memory.disk import DiskFull, disk_error, space_left
from tests.support.configs import clips_cfg
from tests.support.full_disk import no_space, raising_after
from tests.support.processes import run_on_small_tmpfs

FULL_LINE = "no space left on the disk holding"


def test_the_line_names_the_path_and_the_space_left(tmp_path: Path) -> None:
    exc = disk_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "a" / "b")
    assert isinstance(exc, DiskFull) and exc.errno == errno.ENOSPC
    assert str(exc).startswith(f"{FULL_LINE} {tmp_path / 'a' / 'b'} (") and " free of " in str(exc)
    assert space_left(tmp_path / "not" / "there")  # its nearest folder's
    other = OSError(errno.EACCES, "Permission denied")
    assert disk_error(other, tmp_path) is other  # any other error stays itself


def test_a_cache_disk_and_a_dev_shm_both_full_read_the_index_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = clips_cfg(tmp_path)
    monkeypatch.setattr(build_module, "write_index", no_space)  # both refuse it
    with caplog.at_level(logging.WARNING):
        index = open_corpus(cfg, in_subprocess=False)
    assert index.n_items == len(read_corpus(cfg)[0]) and index.location == "(in memory)"
    assert f"{FULL_LINE} {tmp_path / 'cache'}" in caplog.text
    assert "this process reads the corpus in memory" in caplog.text
    with pytest.raises(NotPrepared, match="is not prepared"):  # no other process has it
        open_prepared(cfg)


def test_a_full_disk_turns_the_feature_cache_off_at_once_and_samples_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = clips_cfg(tmp_path, on_too_long="truncate")
    entries = read_corpus(cfg)[0][:3]
    pipe = SamplePipeline(cfg)
    monkeypatch.setattr(cache_module.os, "write", raising_after(0, os.write))
    with caplog.at_level(logging.WARNING):
        samples = [pipe(entry) for entry in entries]
    assert all(s.mel.shape[0] > 0 for s in samples)  # every sample made, none skipped
    assert not pipe.features.cache.writing and pipe.features.cache.stats.write_failures == 1
    warnings = [r.getMessage() for r in caplog.records if FULL_LINE in r.getMessage()]
    assert len(warnings) == 1 and "features.cache_dir elsewhere" in warnings[0], caplog.text
    assert str(pipe.features.cache.directory) in warnings[0]


def test_a_full_shard_cache_reads_each_clip_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = "memory://full-disk-test/shard-0.tar"
    with fsspec.open(url, "wb") as f:
        f.write(bytes(range(256)) * 4)
    store = object_store.ShardCache(clips_cfg(tmp_path))
    monkeypatch.setattr(Path, "write_bytes", no_space)
    with caplog.at_level(logging.WARNING):
        assert store.local(url) is None
    assert store.full and store.read_range(url, 10, 5) == bytes(range(10, 15))
    assert f"{FULL_LINE} {store.folder}" in caplog.text
    # No half-written copy left behind (an empty lock file may stay: it holds no data).
    assert not [f for f in store.folder.iterdir() if not f.name.endswith(".lock")]


def test_a_full_disk_stops_the_quarantine_with_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with QuarantineWriter(tmp_path / "quarantine.jsonl") as q:
        monkeypatch.setattr(os, "fsync", no_space)
        with pytest.raises(DiskFull, match=f"^{FULL_LINE} {tmp_path / 'quarantine.jsonl'}"):
            q.write("item-1", "a.wav", "too long", "features")


# Fills the tmpfs, then opens the corpus (its index built in a subprocess) and the
# feature cache on it; prints what the test checks, as JSON.
ON_A_FULL_DISK = """
import json, sys
from ringfeed.shared.config import replace
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.memory.disk import DiskFull
from ringfeed.shared.corpus.feature_cache import FeatureCache
from tests.support.configs import clips_cfg
from pathlib import Path
full = Path(sys.argv[1])
try:
    with open(full / "fill", "wb", buffering=0) as f:
        while True:
            f.write(bytes(4096))
except OSError:
    pass
cfg = replace(clips_cfg(full), features={"cache_dir": str(full / "cache")})
index = open_corpus(cfg)
n_items, where = index.n_items, index.location
try:
    FeatureCache(cfg)
    cache = "opened"
except DiskFull as exc:
    cache = str(exc)
print(json.dumps({"n_items": n_items, "where": where, "cache": cache}))
"""


def test_a_real_full_disk_under_the_cache(tmp_path: Path) -> None:
    """The index build in its subprocess and the feature cache, on a full 256 KiB tmpfs
    of a child's own (tests/support/processes.py): the index is kept in memory, in
    /dev/shm, where every process of the host maps it."""
    full = tmp_path / "full"
    full.mkdir()
    argv = [sys.executable, "-c", ON_A_FULL_DISK, str(full)]
    proc = run_on_small_tmpfs(str(full), "256k", argv)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    kept = Path(out["where"])
    try:
        assert out["n_items"] == len(read_corpus(clips_cfg(tmp_path))[0])
        assert f"{FULL_LINE} {full / 'cache'}" in proc.stderr
        assert "kept in memory instead" in proc.stderr and kept.parent == memory_folder()
        assert BuiltIndex.mapped(kept).n_items == out["n_items"]  # another process maps it
    finally:
        kept.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the folder too, unless other copies live there
            kept.parent.rmdir()
    assert out["cache"].startswith(f"{FULL_LINE} {full / 'cache'}/"), out


def test_a_pass_partial_file_on_a_full_disk_stops_saving_and_leaves_no_temporary(
    tmp_path: Path,
) -> None:
    """producer/prepare/passes.py save_partial on a real 64 KiB tmpfs: a partial that fits
    is saved whole; one that does not returns False with the one line, and neither it
    nor its temporary file is left behind (the pass goes on without resuming)."""
    full = tmp_path / "full"
    full.mkdir()
    code = (
        "import json, sys, numpy as np; from pathlib import Path;"
        "from ringfeed.producer.prepare.passes import save_partial;"
        "from ringfeed.shared.run.process import setup_logging; setup_logging();"
        "d = Path(sys.argv[1]);"
        "small = save_partial(d / 'small.npz', {'done': np.ones(100, bool)});"
        "big = save_partial(d / 'big.npz', {'done': np.ones(1 << 20, bool)});"
        "print(json.dumps([small, big, sorted(p.name for p in d.iterdir()),"
        " np.load(d / 'small.npz')['done'].all().item()]))"
    )
    proc = run_on_small_tmpfs(str(full), "64k", [sys.executable, "-c", code, str(full)])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [True, False, ["small.npz"], True]
    assert f"{FULL_LINE} {full}" in proc.stderr and "cannot resume if it stops" in proc.stderr
