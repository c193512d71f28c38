"""One sample, one failure: hostile text and audio cost bounded work, a broken feature
cache costs the cache, and any exception in a sample's work becomes that sample's
quarantine entry with its type, message and stage."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.process.worker import describe
from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text.encoder import TextEncoder, clean_text
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.entry import Entry
from tests.support.audio import write_audio


@pytest.mark.parametrize(
    "text",
    [
        "9" * 5000,  # int() refuses > 4300 digits; num2words overflows far sooner
        "$" + "9" * 60 + ".99",
        "1," + "000," * 40 + "000",
        "7" * 40 + "th",
        "3." + "1" * 3000,
        "(" * 20000 + "a" * 20000,
    ],
)
def test_text_cleaning_is_bounded_whatever_the_content(text: str) -> None:
    t0 = time.perf_counter()
    out = clean_text(text[:2000])
    assert out and time.perf_counter() - t0 < 1.0


def test_huge_raw_text_is_rejected_before_cleaning_or_cut() -> None:
    cfg = Config()
    with pytest.raises(SkipSample, match="characters before cleaning"):
        TextEncoder(cfg).encode("a " * 100_000)
    cut = replace(cfg, features={"on_too_long": "truncate"})
    ids, truncated = TextEncoder(cut).encode("a " * 100_000)
    assert truncated and len(ids) == cfg.text.max_text_len


def test_audio_longer_than_the_limit_is_rejected_from_its_header(tmp_path: Path) -> None:
    cfg = replace(Config(), audio={"max_duration_s": 2.0}, features={"cache": False})
    long = write_audio(tmp_path / "long.wav", "tone", 3.0)
    pipe = SamplePipeline(cfg)
    with pytest.raises(SkipSample, match="not decoded") as info:
        pipe(Entry("long", str(long), "hello there"))
    assert info.value.stage == "audio" and pipe.counters.decoded == 0


def test_audio_longer_than_a_slot_is_rejected_from_its_header(tmp_path: Path) -> None:
    cfg = replace(Config(), features={"cache": False, "max_frames": 100})  # ~1.16 s
    long = write_audio(tmp_path / "long.wav", "tone", 1.5)
    pipe = SamplePipeline(cfg)
    with pytest.raises(SkipSample, match="features.max_frames=100"):
        pipe(Entry("long", str(long), "hello there"))
    assert pipe.counters.decoded == 0
    fits = write_audio(tmp_path / "fits.wav", "tone", 1.0)
    assert pipe(Entry("fits", str(fits), "hello there")).mel.shape[0] <= 100


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_an_unwritable_feature_cache_costs_the_cache_not_the_samples(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    cfg = replace(Config(), features={"cache_dir": str(cache_dir)})
    clip = write_audio(tmp_path / "a.wav", "tone", 0.5)
    pipe = SamplePipeline(cfg)
    for shard in cache_dir.rglob("*"):
        shard.chmod(0o500 if shard.is_dir() else 0o400)
    (cache_dir / next(iter(os.listdir(cache_dir)))).chmod(0o500)
    try:
        sample = pipe(Entry("a", str(clip), "hello"))
    finally:
        for shard in cache_dir.rglob("*"):
            shard.chmod(0o700)
    assert sample.mel is not None and pipe.counters.cache_errors >= 1


def test_a_failing_cache_write_costs_the_cache_not_the_sample(tmp_path: Path) -> None:
    """ENOSPC, EACCES or EIO mid-write: the sample is delivered, the next put opens a
    fresh shard. Works as root too: the write itself is made to fail."""
    cfg = replace(Config(), features={"cache_dir": str(tmp_path / "cache")})
    clip = write_audio(tmp_path / "a.wav", "tone", 0.5)
    pipe = SamplePipeline(cfg)

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    pipe.features.cache.put = full_disk  # the disk's answer, not a mock of our logic
    sample = pipe(Entry("a", str(clip), "hello"))
    assert sample.mel is not None and pipe.counters.cache_errors == 1


def test_an_unexpected_exception_is_described_with_type_stage_and_place() -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        text = describe(exc, "features")
    assert text.startswith("unexpected KeyError in features at test_sample_isolation.py:")
    assert "'missing'" in text and len(describe(ValueError("x" * 10_000), "text")) <= 400
