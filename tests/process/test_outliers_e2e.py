"""A real run over a corpus with audio that is not its text (tests/support/outlier_corpus.py):
with data.outliers: flag every clip a producer can read is delivered, every row checked
against its item, and each outlier is listed once in outliers.jsonl with why, however
many epochs deliver it; with skip the outliers are quarantined with stage "outlier"
(out-of-band ones before any grant) and never delivered, every other row delivered
and checked. The clip cut under its old header is refused either way."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from ringfeed.consumer.stager.outliers import REPORT_FILE, _read
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import build_in_memory
from tests.support.checks import check_real_rows, expected_rows
from tests.support.configs import write_config
from tests.support.corpora import write_manifest
from tests.support.outlier_corpus import (
    AUDIO,
    GENUINE,
    OUT_OF_BAND,
    SMALL,
    make_outlier_corpus,
    texts,
)
from tests.support.paths import WAVS
from tests.support.runs import Run, finish, rid

EPOCHS = 2


def run_corpus(tmp_path: Path, policy: str) -> tuple[collections.Counter, list, dict, Path]:
    """(item id -> times delivered, quarantine records, stager.json, the run directory)
    of a run of EPOCHS epochs; every delivered row is checked against its item."""
    manifest = make_outlier_corpus(tmp_path / "c")
    cfg_path = write_config(
        tmp_path,
        {
            "data": {"path": str(manifest), "format": "jsonl", "outliers": policy},
            **SMALL,
            "features": {**SMALL["features"], "cache_dir": str(tmp_path / "cache")},
            "stager": {"batch_size": 4, "epochs": EPOCHS},
            "producers": {"workers": 2},
        },
    )
    cfg, run_id = load_config(cfg_path), rid()
    index, expected, delivered = build_in_memory(cfg), expected_rows(cfg), collections.Counter()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client()
        while (batch := client.next(timeout_s=120)) is not None:
            delivered.update(r["item_id"] for r in check_real_rows(batch, index, expected))
            client.free(batch)
        client.close()
        stats = finish(run, "producers")
        return delivered, read_quarantine(run.dir / "quarantine.jsonl"), stats, run.dir


@pytest.mark.slow
def test_flag_delivers_each_outlier_and_lists_it_once_with_why(tmp_path: Path) -> None:
    delivered, quarantine, stats, directory = run_corpus(tmp_path, "flag")
    usable = [*GENUINE, *OUT_OF_BAND, *AUDIO]
    assert delivered == {item_id: EPOCHS for item_id in usable}, delivered
    assert [(r["item_id"], r["stage"]) for r in quarantine] == [("cut-header", "audio")]
    assert "truncated audio file" in quarantine[0]["reason"]
    listed = _read(directory / REPORT_FILE)
    kinds = {r["item_id"]: r["kind"] for r in listed}
    assert len(listed) == len(kinds)  # once each, over both epochs
    assert kinds == {
        "long-text": "rate",
        "cut-short": "rate",
        "cut-header": "rate",
        "quiet": "near-silent",
        "clipped": "clipped",
    }
    why = {r["item_id"]: r["why"] for r in listed}
    assert "speaking rate" in why["long-text"] and "tokens/s" in why["long-text"]
    assert "fast" in why["cut-short"] and "near-silent" in why["quiet"]
    assert stats["outliers"] == {"out_of_band": 3, "listed": 5, "near_silent": 1, "clipped": 1}


@pytest.mark.slow
def test_skip_quarantines_each_outlier_and_delivers_every_other_clip(tmp_path: Path) -> None:
    delivered, quarantine, stats, directory = run_corpus(tmp_path, "skip")
    assert delivered == {item_id: EPOCHS for item_id in GENUINE}, delivered
    stages = {r["item_id"]: r["stage"] for r in quarantine}
    assert len(quarantine) == len(stages)  # one line per item per run
    # cut-header's header reads as the 40 % it holds: out of band, skipped before a grant
    assert stages == dict.fromkeys([*OUT_OF_BAND, *AUDIO, "cut-header"], "outlier"), stages
    reason = {r["item_id"]: r["reason"] for r in quarantine}
    assert "speaking rate" in reason["long-text"] and "band" in reason["long-text"]
    assert "near-silent" in reason["quiet"] and "clipped" in reason["clipped"]
    assert not (directory / REPORT_FILE).exists()
    assert stats["outliers"]["out_of_band"] == 3 and stats["counters"]["skipped"] == 2 * 5


@pytest.mark.slow
def test_a_clip_no_one_could_say_is_found_in_a_corpus_too_small_for_a_band(
    tmp_path: Path,
) -> None:
    """8 clips, one of them 1 s long with a 400-character text: no language band (under
    10 clips), but the plausibility bound holds from the first clip on. validate counts
    it out of the usable clips; a run (data.outliers: skip, the default) quarantines it
    before any grant and delivers the 7 others, each checked against its item."""
    root = tmp_path / "c"
    root.mkdir()
    text, lines = texts(), []
    for name in GENUINE[:7]:
        shutil.copy(WAVS / f"{name}.wav", root / f"{name}.wav")
        lines.append({"id": name, "audio": f"{name}.wav", "text": text[name]})
    wave, sr = sf.read(WAVS / "LJ001-0008.wav", dtype="int16")
    sf.write(root / "one-second.wav", wave[:sr], sr, subtype="PCM_16")
    long_text = (text["LJ001-0008"] + " ") * 4
    lines.append({"id": "one-second", "audio": "one-second.wav", "text": long_text[:400]})
    manifest = write_manifest(root / "train.jsonl", lines)
    cfg_path = write_config(
        tmp_path,
        {
            "data": {"path": str(manifest), "format": "jsonl"},
            **SMALL,
            "features": {**SMALL["features"], "cache_dir": str(tmp_path / "cache")},
            "text": {"max_text_len": 420},
            "stager": {"batch_size": 4, "epochs": 1},
            "producers": {"workers": 2},
        },
    )
    command = [sys.executable, "-m", "ringfeed.scripts.cli", "validate", str(cfg_path)]
    checked = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no band: fewer than 10 clips with a rate; the bound alone, 1 outside" in checked.stdout
    assert "usable        7 of 8 clips" in checked.stdout, checked.stdout
    cfg, run_id = load_config(cfg_path), rid()
    index, expected, delivered = build_in_memory(cfg), expected_rows(cfg), collections.Counter()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client()
        while (batch := client.next(timeout_s=120)) is not None:
            delivered.update(r["item_id"] for r in check_real_rows(batch, index, expected))
            client.free(batch)
        client.close()
        stats = finish(run, "producers")
        quarantine = read_quarantine(run.dir / "quarantine.jsonl")
    assert delivered == dict.fromkeys(GENUINE[:7], 1), delivered
    assert [(r["item_id"], r["stage"]) for r in quarantine] == [("one-second", "outlier")]
    assert "outside the plausibility bound 0.5..60.0 tokens/s" in quarantine[0]["reason"]
    assert stats["outliers"]["out_of_band"] == 1
