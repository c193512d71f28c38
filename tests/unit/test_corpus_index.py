"""The corpus index (shared/corpus/index.py): built once, mapped, the same items as the
corpus readers, current or rebuilt, and found by id without a table in memory."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ringfeed.scripts import cli
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.index import BuiltIndex, index_path
from ringfeed.shared.corpus.index_file import IndexFile, write_index
from ringfeed.shared.corpus.open import build_in_memory, open_corpus, read_corpus
from ringfeed.shared.run.fingerprint import plan_fingerprint
from ringfeed.shared.run.id_tables import corpus_tables
from tests.support.audio import write_audio
from tests.support.broken_dataset import make_broken_dataset
from tests.support.configs import jsonl_cfg, write_config
from tests.support.corpora import make_libritts, write_manifest
from tests.support.paths import REPO

MINI = REPO / "data" / "ljspeech-mini"


def cached(cfg: Config, tmp_path: Path) -> Config:
    return replace(cfg, features={"cache_dir": str(tmp_path / "cache")})


def same_as_readers(cfg: Config) -> BuiltIndex:
    """The mapped index gives read_corpus's entries and bad lines (less the missing files,
    found when read), and the same digest, plan hash and tables as the index built in
    memory."""
    index = open_corpus(cfg, in_subprocess=False)
    memory = build_in_memory(cfg)
    assert isinstance(index, BuiltIndex) and index.location == str(index_path(cfg))
    entries = list(index.entries)
    read, bad = read_corpus(cfg)
    missing = {b.item_id for b in bad if "audio file not found" in b.reason}
    assert [e for e in entries if e.item_id not in missing] == read
    assert {(b.line, b.reason) for b in index.bad_lines} == {
        (b.line, b.reason) for b in bad if b.item_id not in missing
    }
    assert list(memory.entries) == entries and memory.location == "(in memory)"
    assert index.digest == memory.digest
    assert plan_fingerprint(cfg, index, [], []) == plan_fingerprint(cfg, memory, [], [])
    assert corpus_tables(cfg, index) == corpus_tables(cfg, memory)
    for k, entry in enumerate(entries):
        assert index.find(entry.item_id) == k and index.item_id(k) == entry.item_id
        assert index.path(k) == entry.audio_path
    assert index.find("no-such-item") is None
    return index


def test_the_index_gives_what_the_readers_give(tmp_path: Path) -> None:
    same_as_readers(cached(replace(Config(), data={"path": str(MINI)}), tmp_path))
    ds = make_broken_dataset(tmp_path / "broken")
    broken = same_as_readers(cached(replace(Config(), data={"path": str(ds.root)}), tmp_path))
    assert [e.item_id for e in broken.entries] == ds.good + list(ds.bad_samples) + ["missing-file"]
    demo = replace(
        Config(),
        data={
            "path": str(REPO / "data/multilingual-demo/train.jsonl"),
            "format": "jsonl",
            "language": "auto",
            "detect_languages": ["en", "de", "ru", "fa"],
        },
    )
    multi = same_as_readers(cached(demo, tmp_path))
    assert multi.languages == ("de", "en", "fa", "ru") and multi.speakers == ("ava", "ben", "cyrus")
    make_libritts(tmp_path / "libritts")
    libri = replace(Config(), data={"path": str(tmp_path / "libritts"), "format": "libritts"})
    assert same_as_readers(cached(libri, tmp_path)).n_items == 4  # one without its audio


def test_csv_segments_duplicates_and_a_missing_file(tmp_path: Path) -> None:
    write_audio(tmp_path / "audio/a.flac", MINI / "wavs/LJ001-0002.wav")
    rows = [
        "audio_file|text|speaker_name",
        "audio/a.flac|Hello.|ann",
        "audio/b.wav|Gone.|bob",
        "audio/a.ogg|Odd.|ann",
        "",
        "./audio/a.flac|Again.|cy",
    ]
    (tmp_path / "metadata.csv").write_text("\r\n".join(rows) + "\r\n")
    cfg = cached(replace(Config(), data={"path": str(tmp_path), "format": "csv"}), tmp_path)
    index = same_as_readers(cfg)
    assert [(e.item_id, e.speaker) for e in index.entries] == [
        ("audio/a", "ann"),
        ("audio/b", "bob"),
    ]
    reasons = {b.line: b.reason for b in index.bad_lines}
    assert "unsupported audio extension" in reasons[4] and "duplicate item id" in reasons[6]
    manifest = write_manifest(
        tmp_path / "m.jsonl",
        [
            {"audio": "audio/a.flac", "text": "One.", "offset": 0.5, "duration": 1.0},
            {"audio": str(tmp_path / "audio/a.flac"), "text": "Two.", "id": "b", "speaker": "x"},
        ],
    )
    segments = same_as_readers(cached(jsonl_cfg(manifest), tmp_path))
    assert segments.entry(0).segment == (0.5, 1.0) and segments.entry(1).speaker == "x"


def test_reused_while_current_rebuilt_when_the_corpus_changes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(MINI, data)
    cfg = cached(replace(Config(), data={"path": str(data)}), tmp_path)
    first = open_corpus(cfg)  # built in a subprocess, as the stager and producers do
    assert isinstance(first, BuiltIndex) and first.n_items == 16
    inode = os.stat(index_path(cfg)).st_ino
    assert open_corpus(cfg).digest == first.digest and os.stat(index_path(cfg)).st_ino == inode
    with open(data / "metadata.csv", "a") as f:
        f.write("LJ-new|A new clip.|A new clip.\n")
    again = open_corpus(cfg)
    assert again.n_items == 17 and again.digest != first.digest
    assert again.find("LJ-new") == 16 and first.item_id(3) == again.item_id(3)
    other = replace(cfg, data={"text_column": 1})  # another setting: another index file
    assert index_path(other) != index_path(cfg)
    assert open_corpus(other).store.header["setting"] == 1


def test_ringfeed_index_builds_it_and_says_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = cached(replace(Config(), data={"path": str(MINI)}), tmp_path)
    path = write_config(tmp_path, cfg.to_dict())
    assert cli.main(["index", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{index_path(cfg)}: 16 items, 0 unusable lines, digest " in out
    assert open_corpus(cfg).digest in out
    missing = write_config(tmp_path, replace(cfg, data={"path": str(tmp_path / "no")}).to_dict())
    assert cli.main(["index", str(missing)]) == 2
    assert "data.path: no metadata file" in capsys.readouterr().err


def test_an_unwritable_cache_folder_reads_the_corpus_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"  # a folder under a file cannot be made, even by root
    blocked.write_text("")
    cfg = replace(Config(), data={"path": str(MINI)}, features={"cache_dir": str(blocked / "c")})
    with caplog.at_level(logging.WARNING):
        index = open_corpus(cfg)
    assert index.location == "(in memory)" and index.n_items == 16
    assert "features.cache_dir" in caplog.text


def test_a_metadata_line_changed_under_a_run_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(MINI, data)
    cfg = cached(replace(Config(), data={"path": str(data)}), tmp_path)
    index = open_corpus(cfg, in_subprocess=False)
    raw = (data / "metadata.csv").read_bytes()
    (data / "metadata.csv").write_bytes(b"x" * 40 + raw)  # every line moves
    with pytest.raises(ValueError, match="changed since the index was built"):
        [index.entry(k) for k in range(index.n_items)]
    header = json.loads(json.dumps(index.store.header))
    assert header["n_items"] == 16 and header["digest"] == index.digest


def test_one_value_of_an_index_array_reads_as_the_array_holds_it(tmp_path: Path) -> None:
    """IndexFile.item (a pread, no page in the RSS) against the mapped array, for every
    integer width and sign the index holds, at both ends of each array and past them."""
    rng = np.random.default_rng(0)
    arrays = {
        f"{kind}{bits}": rng.integers(
            np.iinfo(f"{kind}{bits}").min, np.iinfo(f"{kind}{bits}").max, 97, dtype=f"{kind}{bits}"
        )
        for kind in ("int", "uint")
        for bits in (8, 16, 32, 64)
    }
    arrays["big-endian"] = arrays["int64"].astype(">i8")
    arrays["floats"] = np.linspace(0, 1, 5)
    write_index(tmp_path / "t.rfi", {"n": 97}, arrays)
    f = IndexFile(tmp_path / "t.rfi")
    for name, array in arrays.items():
        if name == "floats":
            with pytest.raises(TypeError, match="not a 1-D integer array"):
                f.item(name, 0)
            continue
        assert [f.item(name, k) for k in range(97)] == array.tolist(), name
        assert np.array_equal(f.array(name), array)
        for k in (-1, 97):
            with pytest.raises(IndexError):
                f.item(name, k)
