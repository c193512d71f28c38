"""SamplePipeline over the broken dataset: every good entry a Sample, every bad one a reason."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.process.threads import math_thread_env, pin_math_threads
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.open import read_corpus
from tests.support.broken_dataset import make_broken_dataset


@pytest.mark.parametrize("device", ["producer", "stager"])
def test_broken_dataset_verdicts(tmp_path: Path, device: str) -> None:
    ds = make_broken_dataset(tmp_path / "ds")
    cfg = replace(
        Config(), data={"path": str(ds.root)}, features={"device": device, "cache": False}
    )
    entries, _ = read_corpus(cfg)
    pipe = SamplePipeline(cfg)
    pipe.warm_up()
    verdicts: dict[str, str] = {}
    for entry in entries:
        try:
            sample = pipe(entry)
        except SkipSample as skip:
            assert skip.path == entry.audio_path
            verdicts[entry.item_id] = skip.reason
            continue
        assert sample.item_id == entry.item_id and sample.tokens.dtype == np.int32
        assert len(sample.tokens) <= cfg.text.max_text_len and not sample.truncated
        if device == "producer":
            assert sample.wave is None and sample.mel.dtype == np.float32
            assert sample.mel.shape[1] == cfg.features.n_mels
            assert sample.mel.shape[0] <= cfg.features.max_frames
        else:
            assert sample.mel is None and sample.wave.ndim == 1
            assert len(sample.wave) < cfg.max_samples
        verdicts[entry.item_id] = "ok"
    assert [i for i, v in verdicts.items() if v == "ok"] == ds.good
    for item_id, reason in ds.bad_samples.items():
        assert reason in verdicts[item_id], (item_id, verdicts[item_id])
    assert pipe.counters.samples == len(ds.good)


def test_truncate_marks_sample(tmp_path: Path) -> None:
    ds = make_broken_dataset(tmp_path / "ds")
    cfg = replace(
        Config(), data={"path": str(ds.root)}, features={"on_too_long": "truncate", "cache": False}
    )
    entry = next(e for e in read_corpus(cfg)[0] if e.item_id == "long-30s")
    sample = SamplePipeline(cfg)(entry)
    assert sample.truncated and sample.mel.shape == (cfg.features.max_frames, cfg.features.n_mels)


def test_math_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    from threadpoolctl import threadpool_info, threadpool_limits

    env = math_thread_env(1)
    assert env["OMP_NUM_THREADS"] == "1" and "OPENBLAS_CORETYPE" not in env
    for name in env:  # monkeypatch restores these after the test, like the limits below
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    SamplePipeline(replace(Config(), features={"cache": False})).warm_up()
    with threadpool_limits(limits=None):
        pin_math_threads(1)
        pools = {pool["filepath"]: pool["num_threads"] for pool in threadpool_info()}
    assert set(pools.values()) == {1}, pools
