"""A reference clip that cannot be read costs itself, never the clip that drew it
(contract 9): with random bytes, an empty file and a missing file among a speaker's
clips, every good clip keeps its reference, a good clip of its own speaker, in every
epoch; the bad ones are quarantined as items, each once, with their own reasons."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.references import reference_candidates
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.corpus.open import build_in_memory
from tests.checks import check_real_rows, expected_rows
from tests.corpus_files import WAVS
from tests.runs import Run, rid, write_config

GOOD = ["LJ001-0002", "LJ001-0003", "LJ001-0004", "LJ001-0005", "LJ001-0006", "LJ001-0007"]
BAD = {"noise": b"\x13\x37" * 5000, "empty": b"", "missing": None}


def corpus(root: Path) -> Path:
    """Two speakers, each with three good clips and the three bad files."""
    root.mkdir(parents=True)
    lines = []
    for k, name in enumerate(GOOD):
        shutil.copy(WAVS / f"{name}.wav", root / f"{name}.wav")
        lines.append({"audio": f"{name}.wav", "text": f"Good clip {k}.", "speaker": f"s{k % 2}"})
    for speaker in ("s0", "s1"):
        for bad, data in BAD.items():
            if data is not None:
                (root / f"{bad}-{speaker}.wav").write_bytes(data)
            lines.append({"audio": f"{bad}-{speaker}.wav", "text": "Bad.", "speaker": speaker})
    path = root / "train.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


SMALL = {"audio": {"sample_rate": 8000},
         "features": {"n_fft": 512, "win_length": 512, "hop_length": 256, "n_mels": 20,
                      "fmax": 4000.0, "max_frames": 400, "reference": True,
                      "reference_frames": 32, "on_too_long": "truncate"}}  # fmt: skip


def test_a_bad_candidate_costs_itself_and_the_next_good_one_is_the_reference(tmp_path) -> None:
    cfg = replace(Config(), data={"path": str(corpus(tmp_path / "c")), "format": "jsonl"},
                  audio=SMALL["audio"], features={**SMALL["features"], "cache": False})  # fmt: skip
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
            first_good = next(j for j in reference_candidates(pipe.clips, k, epoch, cfg)[0]
                              if j in good)  # fmt: skip
            assert _is_cut_of(ref, mels[first_good]), (epoch, k)
    assert pipe.counters.reference_failed == len(pipe.bad_references) == 6  # each tried once
    assert pipe.counters.reference_own == 0
    for k in set(range(index.n_items)) - good:  # a bad clip as an item is its own skip
        with pytest.raises(SkipSample):
            pipe(index.entry(k), k)


def _is_cut_of(ref: np.ndarray, mel: np.ndarray) -> bool:
    """Is ref a run of mel's frames (the reference's cut)?"""
    n = len(ref)
    return any(np.allclose(ref, mel[o : o + n], atol=1e-5) for o in range(len(mel) - n + 1))


@pytest.mark.slow
def test_a_run_with_bad_files_among_the_references_loses_no_good_clip(tmp_path: Path) -> None:
    manifest = corpus(tmp_path / "c")
    cfg_path = write_config(tmp_path, {
        "data": {"path": str(manifest), "format": "jsonl"}, **SMALL,
        "ring": {"slots": 8}, "stager": {"batch_size": 2, "epochs": 3},
        "producers": {"workers": 2},
    })  # fmt: skip
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
