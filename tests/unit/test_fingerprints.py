"""Fingerprints of the plan and of the config: what changed is told, what did not is not
(a stager refusing a resume against another plan: tests/process/test_fingerprints.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ringfeed.shared.config import Config, config_from_dict, replace
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.fingerprint import (
    config_fingerprint,
    config_refusal,
    corpus_digest,
    plan_changes,
    plan_fingerprint,
)
from tests.support.corpora import shipped_corpus, shipped_lines


def corpus(folder: Path, lines: int) -> Path:
    """The shipped LJSpeech clips under folder, with the first `lines` metadata lines."""
    return shipped_corpus(folder, shipped_lines()[:lines])


def test_each_plan_part_is_told_apart(tmp_path: Path) -> None:
    cfg = config_from_dict({"data": {"path": str(corpus(tmp_path / "a", 15))}})
    index = open_corpus(cfg)
    buckets, lengths = [(32, 16, 8), (64, 32, 4)], [np.arange(15), np.arange(15) // 2]
    base = plan_fingerprint(cfg, index, buckets, lengths)
    # One line appended to the metadata file: the index, and only it, changed.
    grown = replace(cfg, data={"path": str(corpus(tmp_path / "b", 16))})
    assert plan_changes(base, plan_fingerprint(grown, open_corpus(grown), buckets, lengths)) == [
        "dataset index"
    ]
    reseeded = replace(cfg, stager={"seed": 7})
    assert plan_changes(base, plan_fingerprint(reseeded, index, buckets, lengths)) == ["seed"]
    assert plan_changes(base, plan_fingerprint(cfg, index, buckets[:1], lengths)) == ["buckets"]
    remeasured = [lengths[0], lengths[1] + 1]
    assert plan_changes(base, plan_fingerprint(cfg, index, buckets, remeasured)) == ["length table"]
    # A checkpoint saved before the part was renamed names it "manifest": still the same plan.
    older = {("manifest" if part == "lengths" else part): h for part, h in base.items()}
    assert plan_changes(base, older) == []
    # The same clips in another folder: the plan is the same (paths count from the folder).
    shutil.copytree(tmp_path / "a", tmp_path / "moved", symlinks=True)
    moved = replace(cfg, data={"path": str(tmp_path / "moved")})
    assert plan_changes(base, plan_fingerprint(moved, open_corpus(moved), buckets, lengths)) == []


def test_a_config_refusal_names_the_keys_that_shape_a_sample() -> None:
    cfg = config_from_dict({})
    ours = config_fingerprint(cfg, "corpus")
    alphabet = "".join(reversed(cfg.text.alphabet))  # same size, other ids
    other = replace(cfg, features={"hop_length": 128}, text={"alphabet": alphabet})
    why = config_refusal(ours, config_fingerprint(other, "corpus"))
    assert "text.alphabet, features.hop_length:" in why
    # Where a host keeps its data and cache shapes no sample.
    elsewhere = replace(cfg, data={"path": "/elsewhere"}, features={"cache_dir": "/tmp/c"})
    assert config_refusal(ours, config_fingerprint(elsewhere, "corpus")) == ""
    # A peer that sends nothing, or junk, is refused in a bounded message.
    assert "and " in config_refusal(ours, {}) and len(config_refusal(ours, {})) < 400
    junk = {"x\x1b[2J" * 10: "y"} | {k: "0" for k in ours}
    assert "\x1b" not in config_refusal(ours, junk) and config_refusal(ours, junk)


def test_the_corpus_digest_tells_the_same_clips_in_another_order_or_with_other_texts(
    tmp_path: Path,
) -> None:
    """Only the item count used to be compared: a host whose metadata listed the same
    clips in another order paired one clip's mel with another's text."""
    lines = [f"c{i}|text {i}|text {i}" for i in range(3)]

    def corpus(name: str, metadata: list[str]) -> Config:
        folder = tmp_path / name
        (folder / "wavs").mkdir(parents=True)
        for i in range(3):
            (folder / "wavs" / f"c{i}.wav").write_bytes(b"RIFF")
        (folder / "metadata.csv").write_text("\n".join(metadata) + "\n")
        return config_from_dict({"data": {"path": str(folder)}})

    def digest(cfg: Config) -> str:
        return corpus_digest(cfg, open_corpus(cfg))

    ours = digest(corpus("a", lines))
    assert digest(corpus("moved", lines)) == ours  # paths count from the corpus root
    assert digest(corpus("reordered", lines[::-1])) != ours
    assert digest(corpus("retexted", [*lines[:2], "c2|another text|another text"])) != ours
    cfg = corpus("b", lines)
    why = config_refusal(config_fingerprint(cfg, ours), config_fingerprint(cfg, "other"))
    assert "corpus differs" in why and "docs/scaling-out.md" in why
