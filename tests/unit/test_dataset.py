"""read_corpus keeps good lines in file order and names what is wrong with the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import QuarantineWriter, read_quarantine
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.open import open_corpus, read_corpus
from tests.support.audio import write_audio
from tests.support.broken_dataset import make_broken_dataset
from tests.support.paths import REPO


def test_default_dataset_relative_to_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    entries, bad = read_corpus(Config())
    assert bad == [] and len(entries) == 16
    assert [e.item_id for e in entries] == [f"LJ001-{i:04d}" for i in range(1, 17)]
    assert all(Path(e.audio_path).is_absolute() for e in entries)


def test_broken_dataset_bad_lines(tmp_path: Path) -> None:
    ds = make_broken_dataset(tmp_path / "ds")
    entries, bad = read_corpus(replace(Config(), data={"path": str(ds.root)}))
    assert [e.item_id for e in entries] == ds.good + list(ds.bad_samples)
    assert {b.item_id for b in bad} == set(ds.bad_lines)
    for line in bad:
        assert ds.bad_lines[line.item_id] in line.reason, line
        assert line.line >= 1 and line.file.endswith("metadata.csv")


def test_csv_format_with_speakers(tmp_path: Path) -> None:
    write_audio(tmp_path / "audio/a.flac", REPO / "data/ljspeech-mini/wavs/LJ001-0002.wav")
    rows = [
        "audio_file|text|speaker_name",
        "audio/a.flac|Hello.|ann",
        "audio/b.wav|Gone.|bob",
        "audio/a.ogg|Odd.|ann",
    ]
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    cfg = replace(Config(), data={"path": str(tmp_path), "format": "csv"})
    entries, bad = read_corpus(cfg)
    assert [(e.item_id, e.text, e.speaker) for e in entries] == [("audio/a", "Hello.", "ann")]
    assert [b.line for b in bad] == [3, 4]
    assert "not found" in bad[0].reason and "unsupported audio extension" in bad[1].reason
    (tmp_path / "metadata.csv").write_text("path|words\n")
    with pytest.raises(CorpusError, match="header"):
        read_corpus(cfg)


def test_quarantine_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "q" / "quarantine.jsonl"
    with QuarantineWriter(path) as q:
        q.write("LJ1", "/a.wav", "zero-byte audio file", "audio")
        assert read_quarantine(path)[0]["reason"] == "zero-byte audio file"  # line-buffered
        q.write("LJ2", "/b.wav", "empty text", "dataset")
    with open(path, "a") as f:
        f.write('{"item_id": "torn')  # a crash mid-line
    records = read_quarantine(path)
    assert [r["item_id"] for r in records] == ["LJ1", "LJ2"]
    assert set(records[0]) == {"item_id", "path", "reason", "stage", "cause", "time"}


def test_a_record_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    """A stager that crashed mid-line, restarted into the same run: its next record
    must start on a line of its own, or the resumed run forgets that item."""
    path = tmp_path / "quarantine.jsonl"
    with QuarantineWriter(path) as q:
        q.write("LJ1", "/a.wav", "zero-byte audio file", "audio")
    with open(path, "a") as f:
        f.write('{"item_id": "torn')  # a crash mid-line
    with QuarantineWriter(path) as q:
        assert q.write("LJ3", "/c.wav", "empty text", "text")
    assert [r["item_id"] for r in read_quarantine(path)] == ["LJ1", "LJ3"]


def test_ljspeech_lines_of_just_id_and_text_are_read(tmp_path: Path) -> None:
    """Many corpora drop LJSpeech's second copy of the text; such a file used to fail
    every line with 'expected 3 columns'."""
    (tmp_path / "wavs").mkdir()
    (tmp_path / "wavs" / "a.wav").write_bytes(b"RIFF")
    (tmp_path / "metadata.csv").write_text("a|Just the text.\nb|x|y|z\n")
    cache = str(tmp_path / "cache")
    index = open_corpus(
        replace(Config(), data={"path": str(tmp_path)}, features={"cache_dir": cache})
    )
    assert index.n_items == 1 and index.entry(0).text == "Just the text."
    assert "got 4 columns" in index.bad_lines[0].reason
