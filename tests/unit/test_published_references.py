"""A speaker's reference clip from each published format (shared/corpus/formats/): a
Parquet row read by its byte range, a Lhotse cut (a segment of its recording), a
Common Voice mp3. Each clip's reference is a cut of the first usable candidate of its
own speaker (producer/features/references.py), as for loose files
(tests/unit/test_bad_references.py), and the row of the Parquet fixture that has no audio
is never one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.features.references import reference_candidates
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import config_from_dict
from ringfeed.shared.corpus.open import open_corpus
from tests.support.published import LHOTSE, PARQUET, write_commonvoice
from tests.support.published_runs import demo_raw


@pytest.mark.parametrize("fmt", ["parquet", "lhotse", "commonvoice"])
def test_each_clips_reference_is_a_cut_of_its_speakers_first_usable_candidate(
    tmp_path: Path, fmt: str
) -> None:
    if fmt == "parquet":
        data = {"path": str(PARQUET), "format": "parquet"}
    elif fmt == "lhotse":
        data = {"path": str(LHOTSE / "demo_cuts_train.jsonl"), "format": "lhotse"}
    else:
        write_commonvoice(tmp_path / "cv", "de")
        data = {"path": str(tmp_path / "cv" / "de"), "format": "commonvoice"}
    raw = demo_raw(tmp_path, data)
    raw["features"]["reference"] = True
    cfg = config_from_dict(raw)
    index = open_corpus(cfg, in_subprocess=False)
    pipe = SamplePipeline(cfg, index=index)
    mels = {}
    for k in range(index.n_items):
        try:
            mels[k] = pipe(index.entry(k), k).mel
        except SkipSample:
            pass
    checked = 0
    for epoch in range(2):
        for k in sorted(mels):
            ref = pipe(index.entry(k), k, epoch).fields["ref_mel"]
            order = reference_candidates(pipe.references.speakers, k, epoch, cfg)[0]
            first = next((j for j in order if j in mels), None)
            if first is None:  # its speaker's only clip: its own (features.single_clip)
                continue
            assert index.entry(first).speaker == index.entry(k).speaker
            assert _is_cut_of(ref, mels[first]), (fmt, epoch, k, first)
            checked += 1
    assert checked >= len(mels), (checked, len(mels))  # nearly every clip has another


def _is_cut_of(ref: np.ndarray, mel: np.ndarray) -> bool:
    """Is ref a run of mel's frames (the reference's cut)?"""
    n = len(ref)
    return any(np.allclose(ref, mel[o : o + n], atol=1e-5) for o in range(len(mel) - n + 1))
