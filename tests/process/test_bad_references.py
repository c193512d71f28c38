"""A reference clip that cannot be read costs itself, never the clip that drew it
(contract 9), through real processes: with bad files among a speaker's clips
(tests/support/reference_corpus.py), a run of three epochs delivers every good clip in
every epoch with its reference, every row checked against its item; the bad ones are
quarantined as items, each once, with their own reasons."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import build_in_memory
from tests.support.checks import check_real_rows, expected_rows
from tests.support.configs import write_config
from tests.support.reference_corpus import BAD, GOOD, SMALL, make_reference_corpus
from tests.support.runs import Run, rid


@pytest.mark.slow
def test_a_run_with_bad_files_among_the_references_loses_no_good_clip(tmp_path: Path) -> None:
    manifest = make_reference_corpus(tmp_path / "c")
    cfg_path = write_config(
        tmp_path,
        {
            "data": {"path": str(manifest), "format": "jsonl"},
            **SMALL,
            "stager": {"batch_size": 2, "epochs": 3},
            "producers": {"workers": 2},
        },
    )
    cfg = load_config(cfg_path)
    index, expected, rows = build_in_memory(cfg), expected_rows(cfg), []
    with Run(cfg_path, rid(), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client()
        while (batch := client.next(timeout_s=120)) is not None:
            rows += check_real_rows(batch, index, expected)  # every row against its item
            client.free(batch)
        quarantine = read_quarantine(run.dir / "quarantine.jsonl")
    delivered = collections.Counter(r["item_id"] for r in rows)
    assert delivered == {f"{name}": 3 for name in GOOD}, delivered  # every epoch, once each
    assert all(r["ref_mel_lens"] > 0 for r in rows)
    bad = sorted(r["item_id"] for r in quarantine)
    assert bad == sorted(f"{b}-{s}" for b in BAD for s in ("s0", "s1")), quarantine
    assert all(r["stage"] != "reference" for r in quarantine)
