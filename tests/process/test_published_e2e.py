"""Corpora as the field publishes them, through real processes: two epochs of each, stopped
and resumed, every row checked against its source row (text, speaker, language, mel),
every item exactly once an epoch (tests/support/published_runs.py)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.support.published import (
    LHOTSE,
    PARQUET,
    lhotse_reference,
    parquet_reference,
    write_commonvoice,
)
from tests.support.published_runs import EPOCHS, two_epochs

pytestmark = pytest.mark.slow


def test_a_common_voice_release(tmp_path: Path) -> None:
    reference = write_commonvoice(tmp_path / "cv", "de")
    got = two_epochs(tmp_path / "run", {"path": str(tmp_path / "cv" / "de"),
                                        "format": "commonvoice"}, reference)  # fmt: skip
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
