"""Corpora that broke the readers: manifest lines that crashed the whole read, names no
file can hold, LibriTTS and VCTK trees laid out otherwise, segments under a sample."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from ringfeed.producer.prepare.lengths import header_frames
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.clips import ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.open import read_corpus
from ringfeed.shared.language.text_cache import TextCache, text_key
from ringfeed.shared.run.id_tables import IdTables, settle_tables
from tests.support.audio import copy_clip, decode_file, write_audio
from tests.support.configs import jsonl_cfg
from tests.support.corpora import make_libritts

GOOD = '{"audio": "a.wav", "text": "fine", "id": "good"}'


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"audio": "a.wav", "text": "x", "offset": 1' + "0" * 400 + "}", "past 1e308"),
        ('{"audio": "a.wav", "text": "x", "offset": 1' + "0" * 5000 + "}", "ValueError"),
        ("[" * 30000 + "]" * 30000, "RecursionError"),
        ('{"audio": "a.wav", "text": "x", "speaker": "\\udc80"}', "'speaker' is not valid"),
        ('{"audio": "a.wav", "text": "hello \\ud800"}', "'text' is not valid"),
    ],
)
def test_one_hostile_manifest_line_costs_that_line(tmp_path: Path, line: str, reason: str) -> None:
    copy_clip(tmp_path / "a.wav", "LJ001-0001")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(f"{GOOD}\n{line}\n", encoding="utf-8")
    entries, bad = read_corpus(jsonl_cfg(manifest, language="auto", detect_languages=["en"]))
    assert [e.item_id for e in entries] == ["good"]
    assert len(bad) == 1 and bad[0].line == 2 and reason in bad[0].reason


def test_language_codes_as_corpora_write_them(tmp_path: Path) -> None:
    copy_clip(tmp_path / "a.wav", "LJ001-0001")
    lines = [
        {"audio": "a.wav", "text": "t", "id": f"i{k}", "language": code}
        for k, code in enumerate(["en-US", "pt_BR", "eng", "DE"])
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    entries, bad = read_corpus(jsonl_cfg(manifest, language="en-GB"))
    assert bad == [] and [e.language for e in entries] == ["en-us", "pt-br", "en", "de"]
    (tmp_path / "n.jsonl").write_text('{"audio": "a.wav", "text": "t"}\n')
    entries, _ = read_corpus(jsonl_cfg(tmp_path / "n.jsonl", language="en-GB"))
    assert entries[0].language == "en-gb"


def test_a_failed_id_table_write_leaves_no_temp_file(tmp_path: Path) -> None:
    from ringfeed.shared.corpus.build import build_entries
    from ringfeed.shared.corpus.entry import Entry

    entry = Entry("a", "/a.wav", "t", speaker="\udc80", language="en")
    with pytest.raises(UnicodeEncodeError):
        settle_tables(Config(), build_entries(Config(), [entry]), tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert isinstance(settle_tables(Config(), build_entries(Config(), []), tmp_path), IdTables)


def test_a_lone_surrogate_is_a_cache_key_like_any_text(tmp_path: Path) -> None:
    assert text_key("k", "en", "hello \ud800") != text_key("k", "en", "hello")
    cache = TextCache(tmp_path)
    cache.put("k", "en", "a", "\ud800")  # not stored: it would fail the batch's write
    cache.put("k", "en", "b", "fine")
    cache.flush()
    assert cache.get("k", "en", "b") == "fine" and cache.errors == 0
    cache.close()


def test_libritts_root_speakers_linked_subsets_and_cycles(tmp_path: Path, caplog) -> None:
    root = tmp_path / "LibriTTS"
    make_libritts(root / "train-clean-100")
    chapter = tmp_path / "elsewhere" / "7" / "11"
    chapter.mkdir(parents=True)
    copy_clip(chapter / "7_11_0000_000000.wav", "LJ001-0004")
    (chapter / "7_11_0000_000000.normalized.txt").write_text("Linked.")
    (root / "dev-clean").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "train-clean-100" / "19" / "loop").symlink_to(root, target_is_directory=True)
    cfg = replace(Config(), data={"path": str(root), "format": "libritts"})
    entries, _ = read_corpus(cfg)
    got = [(os.path.relpath(e.audio_path, root).split(os.sep)[0], e.speaker) for e in entries]
    assert got == [("dev-clean", "7"), *[("train-clean-100", s) for s in ("19", "19", "84")]]
    bad_folder = root / "train-clean-100" / "19" / "198" / "misfiled_0001.normalized.txt"
    bad_folder.write_text("x")
    copy_clip(bad_folder.with_name("misfiled_0001.wav"), "LJ001-0001")
    with caplog.at_level(logging.WARNING, logger="ringfeed.shared.corpus.folders"):
        entries, _ = read_corpus(cfg)
    assert "misfiled" in caplog.text and "not laid out as" in caplog.text
    misfiled = "train-clean-100/19/198/misfiled_0001"  # its path: its name says no folder
    assert any(e.item_id == misfiled and e.speaker == "19" for e in entries)


def test_vctk_files_off_the_layout_are_warned_about(tmp_path: Path, caplog) -> None:
    (tmp_path / "txt" / "extra" / "p225").mkdir(parents=True)
    (tmp_path / "txt" / "extra" / "p225" / "p225_001.txt").write_text("Please.")
    with caplog.at_level(logging.WARNING, logger="ringfeed.shared.corpus.folders"):
        read_corpus(replace(Config(), data={"path": str(tmp_path), "format": "vctk"}))
    assert "not laid out as txt/<speaker>" in caplog.text


def test_a_segment_shorter_than_half_a_sample_is_one_sample_not_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.wav"
    write_audio(path, "silence", 1.0)
    data, _ = decode_file(str(path), (0.5, 1e-6))
    assert data.shape[0] == 1
    cfg, clips = Config(), ClipReader(Config())

    def frames(duration_s: float) -> int:
        return header_frames(
            clips, Entry("a", str(path), "", offset_s=0.5, duration_s=duration_s), cfg
        )

    assert frames(1e-6) == frames(1e-4)
    assert frames(1e-6) < frames(0.0)
