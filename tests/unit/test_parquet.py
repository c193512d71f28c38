"""Parquet corpora as Hugging Face datasets publishes them (shared/corpus/formats/parquet.py),
read from files datasets 5.2 wrote (tests/data/parquet/write_parquet.py): each clip's bytes
found by its byte range (shared/corpus/parquet_pages.py) and read alone, columns named
by data.columns, a row without audio costs itself, a file that cannot be read a clip at
a time, or that lacks a column, says what to change. (Real runs:
tests/process/test_published_e2e.py.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ringfeed.shared.config import Config, ConfigError, replace
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.members import MemberReader
from ringfeed.shared.corpus.open import open_corpus, read_corpus
from ringfeed.shared.corpus.parquet_pages import value_ranges
from tests.support.published import PARQUET, demo_rows, parquet_reference

AUDIO = pa.struct({"bytes": pa.binary(), "path": pa.string()})


def pq_cfg(path: Path, tmp_path: Path, **data: object) -> Config:
    return replace(
        Config(),
        data={"path": str(path), "format": "parquet", **data},
        audio={"sample_rate": 16000},
        features={"cache_dir": str(tmp_path / "cache")},
    )


def test_the_files_datasets_wrote_give_each_clip_its_own_bytes(tmp_path: Path) -> None:
    cfg = pq_cfg(PARQUET, tmp_path)
    entries, bad = read_corpus(cfg)
    reference = parquet_reference()
    got = {e.item_id: (e.text, e.speaker, e.language) for e in entries}
    assert got == {k: (e.text, e.speaker, e.language) for k, e in reference.items()}
    reader = MemberReader(cfg)
    for e in entries:  # one pread of the clip's range: the very bytes of its source file
        assert (
            reader.read(e.audio_path, *e.member)
            == Path(reference[e.item_id].audio_path).read_bytes()
        )
    assert [(Path(b.file).name, b.line, b.reason[:17]) for b in bad] == [
        ("train-00001-of-00002.parquet", 7, "no audio bytes in")
    ]
    index = open_corpus(cfg, in_subprocess=False)
    assert index.shard_starts.tolist() == [0, 6, 12]  # the files, for data.shard_window
    assert index.entry(0).audio_path == str(PARQUET / "data" / "train-00000-of-00002.parquet")


def hub_table(n: int = 6, nulls: bool = True) -> pa.Table:
    """Common Voice as the Hub names its columns, one row's audio null."""
    rows = demo_rows("ru")[:n]
    audio = [{"bytes": Path(r["audio"]).read_bytes(), "path": Path(r["audio"]).name} for r in rows]
    if nulls:
        audio[2] = None
    return pa.table(
        {
            "audio": pa.array(audio, AUDIO),
            "sentence": [r["text"] for r in rows],
            "client_id": [r["speaker"] for r in rows],
            "locale": ["ru"] * n,
        }
    )


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_byte_ranges_across_pages_of_either_version(tmp_path: Path, version: str) -> None:
    """Pages of about one clip each, nulls among them, data page v1 and v2: every range is
    its clip's bytes."""
    table = hub_table()
    path = tmp_path / "cv.parquet"
    pq.write_table(
        table,
        path,
        compression="none",
        use_dictionary=False,
        data_page_size=20_000,
        data_page_version=version,
        row_group_size=4,
        write_batch_size=1,
    )
    pf = pq.ParquetFile(path)
    fd = os.open(path, os.O_RDONLY)
    ranges = []
    for g in range(pf.metadata.num_row_groups):
        chunk = pf.metadata.row_group(g).column(0)
        ranges += value_ranges(
            lambda at, n: os.pread(fd, n, at),
            chunk.data_page_offset,
            pf.metadata.row_group(g).num_rows,
            2,
        )
    os.close(fd)
    data = path.read_bytes()
    want = table.column("audio").to_pylist()
    assert [data[r[0] : r[0] + r[1]] if r else None for r in ranges] == [
        a["bytes"] if a else None for a in want
    ]


def test_columns_named_by_data_columns(tmp_path: Path) -> None:
    pq.write_table(hub_table(), tmp_path / "cv.parquet", compression="none", use_dictionary=False)
    named = {"text": "sentence", "speaker": "client_id", "language": "locale"}
    entries, bad = read_corpus(pq_cfg(tmp_path / "cv.parquet", tmp_path, columns=named))
    assert [(e.item_id, e.speaker, e.language) for e in entries][:2] == [
        ("cv/ru-00-ava", "ava", "ru"),
        ("cv/ru-01-ben", "ben", "ru"),
    ]
    assert len(entries) == 5 and [b.line for b in bad] == [3]
    with pytest.raises(
        CorpusError,
        match=r"cv.parquet: no column data.columns.text: 'text'; "
        r"the file has audio, sentence, client_id, locale: name the right one "
        r"in data.columns$",
    ):
        open_corpus(pq_cfg(tmp_path / "cv.parquet", tmp_path / "a"), in_subprocess=False)
    wrong = {**named, "speaker": "speaker"}
    with pytest.raises(CorpusError, match=r"no column data.columns.speaker: 'speaker'; the file"):
        open_corpus(
            pq_cfg(tmp_path / "cv.parquet", tmp_path / "b", columns=wrong), in_subprocess=False
        )
    with pytest.raises(ConfigError, match=r"^data.columns: only data.format: parquet"):
        open_corpus(replace(Config(), data={"columns": named}))


def test_a_file_that_cannot_be_read_a_clip_at_a_time_says_how_to_rewrite_it(
    tmp_path: Path,
) -> None:
    pq.write_table(hub_table(), tmp_path / "snappy.parquet")  # pyarrow's default: snappy
    named = {"text": "sentence", "audio": "audio"}
    entries, bad = read_corpus(pq_cfg(tmp_path / "snappy.parquet", tmp_path, columns=named))
    assert entries == [] and len(bad) == 1
    assert "cannot be read a clip at a time (compressed with SNAPPY)" in bad[0].reason
    assert "compression={'<audio>.bytes': 'none'}" in bad[0].reason
    pq.write_table(pa.table({"sentence": ["a"]}), tmp_path / "none.parquet")
    with pytest.raises(
        CorpusError,
        match=r"no column data.columns.audio: 'audio'; the file has "
        r"sentence",
    ):
        open_corpus(pq_cfg(tmp_path / "none.parquet", tmp_path, columns=named), in_subprocess=False)


def test_a_length_that_does_not_add_up_is_refused_never_a_misread_clip(tmp_path: Path) -> None:
    """A clip's length prefix one byte short: the page's values no longer end where the
    page does, so the file is one unusable line, never ranges that cut other clips."""
    folder = tmp_path / "hf"
    folder.mkdir()
    source = PARQUET / "data" / "train-00001-of-00002.parquet"
    cfg = pq_cfg(source, tmp_path / "a")
    offset, size = open_corpus(cfg, in_subprocess=False).entry(0).member
    data = bytearray(source.read_bytes())
    data[offset - 4 : offset] = (size - 1).to_bytes(4, "little")
    (folder / source.name).write_bytes(bytes(data))
    entries, bad = read_corpus(pq_cfg(folder, tmp_path / "b"))
    assert entries == [] and len(bad) == 1
    assert "a page's values end at byte" in bad[0].reason


def test_ids_from_file_names_only_when_they_name_one_clip_each(tmp_path: Path) -> None:
    """datasets keeps the name a clip was given: "audio.wav" for every clip of a corpus
    laid out a folder a clip. Names that repeat give <file>/<row> ids, never duplicates."""
    table = hub_table(4, nulls=False)
    same = [{"bytes": a["bytes"], "path": "/data/x/audio.wav"} for a in table["audio"].to_pylist()]
    pq.write_table(
        table.set_column(0, "audio", pa.array(same, AUDIO)),
        tmp_path / "a.parquet",
        compression="none",
        use_dictionary=False,
    )
    entries, bad = read_corpus(pq_cfg(tmp_path, tmp_path, columns={"text": "sentence"}))
    assert bad == [] and [e.item_id for e in entries] == [f"a/{k:06d}" for k in range(4)]


def test_without_pyarrow_a_parquet_corpus_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow is the parquet extra, out of the base install (pyproject.toml)."""
    for name in [m for m in list(sys.modules) if m.split(".")[0] == "pyarrow"] + ["pyarrow"]:
        monkeypatch.setitem(sys.modules, name, None)  # imports fail, as without it
    with pytest.raises(CorpusError, match=r"pip install 'ringfeed\[parquet\]'") as missing:
        read_corpus(pq_cfg(PARQUET, tmp_path))
    assert "data.format: parquet reads a file's schema" in str(missing.value)
