"""`ringfeed prepare` and what runs read of it, through real processes: a prepare stopped
by SIGINT finishes when run again and writes what an uninterrupted one writes; a corpus
that changed since it was prepared is refused by a run's processes started alone and
prepared again (only what changed) by a run, whose every row is its item's; a full disk
under the cache folder is one line, and a run goes on with the tables in memory."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.index import BuiltIndex, index_path
from ringfeed.shared.corpus.memory_copies import memory_copy, memory_folder
from ringfeed.shared.corpus.open import open_prepared
from tests.support.checks import check_real_rows, expected_rows
from tests.support.configs import write_config
from tests.support.corpora import shipped_corpus, shipped_lines, write_manifest
from tests.support.paths import REPO, WAVS
from tests.support.processes import run_on_small_tmpfs
from tests.support.runs import Run, rid, started

pytestmark = pytest.mark.slow

# Lines of the manifest a prepare is stopped in: a few seconds of its text and header
# pass on 2 cores, so that the stop lands in the middle of it.
MANY = 20_000
FULL_LINE = "no space left on the disk holding"


def prepare(config: Path, **popen: object) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ringfeed.scripts.cli", "prepare", str(config)]
    return subprocess.Popen(
        cmd, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen
    )  # type: ignore[call-overload]


def many_clips(tmp_path: Path, cache: str) -> Path:
    """A manifest of MANY lines over the shipped clips (every text its own) and its
    config, both named after the cache folder."""
    wavs = sorted(WAVS.glob("*.wav"))
    lines = [
        {
            "audio": str(wavs[k % len(wavs)]),
            "id": f"c{k:05d}",
            "text": f"Clip {k} of the corpus, said on May {1 + k % 28}.",
        }
        for k in range(MANY)
    ]
    manifest = write_manifest(tmp_path / f"{cache}.jsonl", lines)
    return write_config(
        tmp_path,
        {
            "data": {"path": str(manifest), "format": "jsonl"},
            "features": {"cache_dir": str(tmp_path / cache), "on_too_long": "truncate"},
        },
        name=f"{cache}.yaml",
    )


def prepared(config: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """The length table and the vocabulary file that preparation wrote for config."""
    cfg = load_config(config)
    index = open_prepared(cfg)
    table = BuiltIndex.mapped(Path(index.location))
    vocab = next(Path(cfg.features.cache_dir).glob("vocab-*.json"))
    return table.store.array("frames"), table.store.array("text"), json.loads(vocab.read_text())


def ignore_sigint() -> None:
    """A child's start as a shell without job control starts a background command
    (`cmd &` in a script, nohup, a CI runner): SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_prepare_stopped_by_a_signal_finishes_when_run_again_as_if_never_stopped(
    tmp_path: Path, signum: int
) -> None:
    """Stopped with SIGINT (started as a background command, which inherits it ignored:
    this test failed whenever the suite itself ran in the background) or SIGTERM, in the
    middle of its length pass."""
    whole = many_clips(tmp_path, "whole")
    assert prepare(whole).wait(120) == 0
    stopped = many_clips(tmp_path, "stopped")
    proc = prepare(stopped, preexec_fn=ignore_sigint)
    said = ""
    while not re.search(r"length table: [1-9]\d* of", said):  # into the pass, items done
        # (a fixed second once: on a busy host its processes had measured none by then)
        line = proc.stderr.readline()
        assert line, f"prepare ended before its pass: {said}"
        said += line
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, said + err
    assert "interrupted; what was done is kept: run it again to go on" in err
    partial = list((tmp_path / "stopped").glob("lengths-*.partial.npz"))
    assert len(partial) == 1, err
    again = prepare(stopped)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    resumed = [line for line in err.splitlines() if "length table: resuming" in line]
    done = int(resumed[0].split("resuming, ")[1].split(" of ")[0]) if resumed else 0
    assert 0 < done < MANY, err
    frames, text, vocab = prepared(stopped)
    want_frames, want_text, want_vocab = prepared(whole)
    assert np.array_equal(frames, want_frames) and np.array_equal(text, want_text)
    assert (frames > 0).all() and (text > 0).all()
    assert vocab == want_vocab
    assert list((tmp_path / "stopped").glob("lengths-*.partial.npz")) == []


def lj_config(tmp_path: Path, folder: Path) -> Path:
    return write_config(
        tmp_path,
        {
            "data": {"path": str(folder)},
            "features": {"cache_dir": str(tmp_path / "cache"), "on_too_long": "truncate"},
            "ring": {"heartbeat_s": 0.1},
            "stager": {"batch_size": 4, "epochs": 1},
            "producers": {"workers": 2},
        },
    )


def test_a_changed_corpus_is_refused_by_a_runs_processes_and_prepared_again_by_a_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = shipped_lines()
    folder = shipped_corpus(tmp_path / "lj", lines[:15])
    config = lj_config(tmp_path, folder)
    first = prepare(config)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0 and "measured 15, 0 current" in out, out + err
    (folder / "wavs" / f"{lines[15].split('|')[0]}.wav").symlink_to(
        WAVS / f"{lines[15].split('|')[0]}.wav"
    )
    with open(folder / "metadata.csv", "a") as f:  # the corpus changes since
        f.write(lines[15] + "\n")
    with Run(config, rid(), tmp_path) as alone:
        alone.prepares = False  # the run's processes started by hand: nobody prepares
        alone.start("stager")
        alone.start("producers")
        assert alone.wait("stager", 60) == 2 and alone.wait("producers", 60) == 2
        logs = alone.logs()
    assert logs.count("is changed since it was prepared") >= 2, logs
    assert "run `ringfeed prepare CONFIG` first" in logs
    cfg = load_config(config)
    expected = expected_rows(cfg)
    delivered = []
    with (
        caplog.at_level("INFO", logger="ringfeed.producer.prepare"),
        started(config, tmp_path, timeout_s=60) as (run, client),
    ):
        index = open_prepared(cfg)
        while (batch := client.next(timeout_s=90)) is not None:
            delivered += [r["item_id"] for r in check_real_rows(batch, index, expected)]
            client.free(batch)
        client.close()
        assert run.wait("stager", 30) == 0, run.logs()
    assert sorted(delivered) == sorted(expected) and len(delivered) == 16
    assert "measured 1, 15 current" in caplog.text  # the new line, the others kept


# In a mount namespace whose cache folder is a small full tmpfs: the index is prepared
# while there is room, the disk filled, then a whole run (`ringfeed run`, which prepares
# the length table the outlier band reads) with a drain consumer.
FULL_DISK_RUN = """
import subprocess, sys
from pathlib import Path
config, full = sys.argv[1], Path(sys.argv[2])
cli = [sys.executable, "-m", "ringfeed.scripts.cli"]
keep = subprocess.run(cli + ["index", config], capture_output=True, text=True)
assert keep.returncode == 0, keep.stderr
try:
    with open(full / "fill", "wb", buffering=0) as f:
        while True:
            f.write(bytes(4096))
except OSError:
    pass
sys.exit(subprocess.run(cli + ["run", config, "--consumer", "drain"]).returncode)
"""


def test_a_full_disk_under_the_cache_is_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    config = write_config(
        tmp_path,
        {
            "data": {"path": str(REPO / "data" / "ljspeech-mini")},
            "features": {"cache_dir": str(full / "cache"), "on_too_long": "truncate"},
            "stager": {"batch_size": 4, "epochs": 1},
            "producers": {"workers": 1},
        },
    )
    kept = memory_copy(index_path(load_config(config)))
    before = set(memory_folder().glob("*"))
    try:
        proc = run_on_small_tmpfs(
            str(full), "1m", [sys.executable, "-c", FULL_DISK_RUN, str(config), str(full)]
        )
        said = proc.stdout + proc.stderr
        assert proc.returncode == 0, said
        assert "drained 4 batches of 4" in proc.stdout, said
        full_lines = [line for line in said.splitlines() if FULL_LINE in line and "index-" in line]
        assert len(full_lines) == 1 and str(full / "cache") in full_lines[0], said
        assert "kept in memory instead" in full_lines[0] and "Traceback" not in said
        assert kept.exists()  # the length table, kept in memory for the run's processes
    finally:
        for made in set(memory_folder().glob("*")) - before:  # the index, the vocabulary
            made.unlink()
    assert os.listdir(full) == []  # the tmpfs went with its namespace
