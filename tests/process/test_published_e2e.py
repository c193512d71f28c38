"""Corpora as the field publishes them, through real processes: two epochs of each, stopped
and resumed, every row checked against its source row (text, speaker, language, mel),
every item exactly once an epoch (tests/support/published_runs.py)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.open import open_corpus
from tests.support.published import (
    HUB,
    LHOTSE,
    PARQUET,
    hub_reference,
    lhotse_reference,
    parquet_reference,
    write_commonvoice,
)
from tests.support.published_runs import EPOCHS, two_epochs
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.slow


def test_a_common_voice_release(tmp_path: Path) -> None:
    reference = write_commonvoice(tmp_path / "cv", "de")
    got = two_epochs(
        tmp_path / "run", {"path": str(tmp_path / "cv" / "de"), "format": "commonvoice"}, reference
    )
    assert got["epochs"] == [collections.Counter(list(reference))] * EPOCHS
    assert got["ids"]["languages"] == ["de"] and len(got["ids"]["speakers"]) == 3


@pytest.mark.parametrize("manifest", ["demo_supervisions_train.jsonl.gz", "demo_cuts_train.jsonl"])
def test_lhotse_manifests(tmp_path: Path, manifest: str) -> None:
    """Recordings with supervisions, gzipped, and cuts, as lhotse wrote them: whole clips
    and segments of them (offsets and durations honoured: the mel of each is its part's)."""
    reference = lhotse_reference()
    got = two_epochs(tmp_path, {"path": str(LHOTSE / manifest), "format": "lhotse"}, reference)
    assert got["epochs"] == [collections.Counter(list(reference))] * EPOCHS
    assert got["ids"] == {
        "speakers": ["ava", "ben", "cyrus"],
        "languages": ["de", "en", "fa", "ru"],
    }


def test_parquet_files_as_datasets_wrote_them(tmp_path: Path) -> None:
    """Each clip read by its byte range in its file; the row without audio is a skip."""
    reference = parquet_reference()
    got = two_epochs(tmp_path, {"path": str(PARQUET), "format": "parquet"}, reference)
    assert got["epochs"] == [collections.Counter(list(reference))] * EPOCHS
    assert got["ids"] == {
        "speakers": ["ava", "ben", "cyrus"],
        "languages": ["de", "en", "fa", "ru"],
    }


def test_a_hub_dataset_of_per_speaker_folders(tmp_path: Path) -> None:
    """push_to_hub's shards of spk_a/0001.flac ... spk_b/0004.flac (datasets keeps only
    the base names, which repeat across the shards): every row delivered once an epoch
    under its own id, checked against its source file; the test split is not read."""
    reference = hub_reference()
    got = two_epochs(tmp_path, {"path": str(HUB), "format": "parquet"}, reference)
    assert got["epochs"] == [collections.Counter(list(reference))] * EPOCHS
    assert got["ids"] == {"speakers": ["spk_a", "spk_b"], "languages": ["de", "en"]}


def test_parquet_files_on_object_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same files on a real S3-compatible server: the build and the producers read
    ranges (never a whole file: nothing in the shard cache), and a read that breaks
    mid-body is tried again."""
    reference = parquet_reference()
    with S3Server(tmp_path) as s3:
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)  # the run's processes inherit them
        fs = s3.client()
        fs.mkdir("corpus")
        for path in sorted((PARQUET / "data").iterdir()):
            fs.put_file(str(path), f"corpus/hf/data/{path.name}")
        s3.break_next_ranges = 1
        got = two_epochs(tmp_path, {"path": "s3://corpus/hf", "format": "parquet"}, reference)
        assert s3.broken == 1
        wrong = replace(
            Config(),
            data={"path": "s3://corpus/hf", "format": "parquet", "columns": {"text": "sentence"}},
            features={"cache_dir": str(tmp_path / "wrong")},
        )
        with pytest.raises(
            CorpusError,
            match=r"no column data.columns.text: 'sentence'; the "
            r"file has audio, text, speaker_id, language",
        ) as caught:
            open_corpus(wrong, in_subprocess=False)
        assert "tries" not in str(caught.value)  # the user's to fix: never retried
    assert got["epochs"] == [collections.Counter(list(reference))] * EPOCHS
    assert got["index"].entry(0).audio_path == "s3://corpus/hf/data/train-00000-of-00002.parquet"
    work = [p["work"] for p in got["stats"]["producers"]]
    assert sum(w.get("shards_fetched", 0) for w in work) == 0, work
    assert sum(w.get("shard_bytes_fetched", 0) for w in work) > 0, work
