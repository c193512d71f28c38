"""A reference clip that cannot be read costs itself, never the clip that drew it
(contract 9): with random bytes, an empty file, a missing file and a near-silent clip
(no example of the voice: data.outliers) among a speaker's
clips (tests/support/reference_corpus.py), every good clip's reference is a good clip
of its own speaker, in every epoch, and a bad clip as an item is its own skip (a real
run losing no good clip: tests/process/test_bad_references.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ringfeed.producer.features.references import reference_candidates
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.open import build_in_memory
from tests.support.reference_corpus import SMALL, make_reference_corpus


def test_a_bad_candidate_costs_itself_and_the_next_good_one_is_the_reference(tmp_path) -> None:
    manifest = make_reference_corpus(tmp_path / "c")
    cfg = replace(
        Config(),
        data={"path": str(manifest), "format": "jsonl"},
        audio=SMALL["audio"],
        features={**SMALL["features"], "cache": False},
    )
    index = build_in_memory(cfg)
    good = {k for k in range(index.n_items) if index.entry(k).text != "Bad."}
    pipe = SamplePipeline(cfg, index=index)
    mels = {k: pipe(index.entry(k), k).mel for k in good}
    for epoch in range(4):
        for k in sorted(good):
            sample = pipe(index.entry(k), k, epoch)
            ref = sample.fields["ref_mel"]
            same_speaker = [
                j for j in good - {k} if index.entry(j).speaker == index.entry(k).speaker
            ]
            assert any(_is_cut_of(ref, mels[j]) for j in same_speaker), (epoch, k)
            candidates = reference_candidates(pipe.references.speakers, k, epoch, cfg)[0]
            first_good = next(j for j in candidates if j in good)
            assert _is_cut_of(ref, mels[first_good]), (epoch, k)
    assert pipe.counters.reference_failed == len(pipe.references.bad) == 8  # each tried once
    assert pipe.counters.reference_own == 0
    for k in set(range(index.n_items)) - good:  # a bad clip as an item is its own skip
        with pytest.raises(SkipSample):
            pipe(index.entry(k), k)


def _is_cut_of(ref: np.ndarray, mel: np.ndarray) -> bool:
    """Is ref a run of mel's frames (the reference's cut)?"""
    n = len(ref)
    return any(np.allclose(ref, mel[o : o + n], atol=1e-5) for o in range(len(mel) - n + 1))
