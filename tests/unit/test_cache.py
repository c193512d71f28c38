"""The feature cache in this process: a second pass decodes nothing, corrupt entries
recompute, changed settings or files miss (several processes: tests/process/test_cache.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.feature_cache import FeatureCache, settings_hash
from ringfeed.shared.corpus.open import read_corpus
from ringfeed.shared.sample import marks
from tests.support.configs import clips_cfg

N_CLIPS = 4


def _short_entries(cfg: Config) -> list:
    entries = [e for e in read_corpus(cfg)[0] if os.path.getsize(e.audio_path) < 250_000]
    return entries[:N_CLIPS]


def test_second_pass_skips_decode_and_mel(tmp_path: Path) -> None:
    cfg = clips_cfg(tmp_path)
    entries = _short_entries(cfg)
    first = SamplePipeline(cfg)
    mels = [first(e).mel.copy() for e in entries]
    assert first.counters.decoded == first.counters.mels == N_CLIPS
    first.close()
    second = SamplePipeline(cfg)  # a new process would start exactly like this
    for entry, mel in zip(entries, mels, strict=True):
        np.testing.assert_array_equal(second(entry).mel, mel)
    assert (second.counters.decoded, second.counters.mels) == (0, 0)
    assert second.features.cache.stats.hits == N_CLIPS


def test_corrupt_and_truncated_entries_recompute(tmp_path: Path) -> None:
    cfg = clips_cfg(tmp_path)
    entries = _short_entries(cfg)[:2]
    pipe = SamplePipeline(cfg)
    for entry in entries:
        pipe(entry)
    pipe.close()
    (shard,) = pipe.features.cache.directory.glob("*.bin")
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # flip a byte of the first entry
    shard.write_bytes(bytes(data[: len(data) - 8]))  # and cut the second one short
    again = SamplePipeline(cfg)
    for entry in entries:
        assert again(entry).mel.shape[1] == cfg.features.n_mels
    assert again.counters.decoded == 2 and again.features.cache.stats.corrupt == 2
    third = SamplePipeline(cfg)  # the recomputed copies are found next time
    for entry in entries:
        third(entry)
    assert third.counters.decoded == 0


def test_settings_change_misses(tmp_path: Path) -> None:
    cfg = clips_cfg(tmp_path)
    assert settings_hash(cfg) == settings_hash(replace(cfg, features={"cache_dir": "x"}))
    for section, change in [
        ("features", {"n_mels": 64}),
        ("audio", {"trim_silence": True}),
    ]:
        changed = replace(cfg, **{section: change})
        assert settings_hash(changed) != settings_hash(cfg)
    # The cache holds the log-mel whichever process computes it, under the name the
    # producers' caches always had (an old producer-mode cache stays warm).
    assert settings_hash(replace(cfg, features={"device": "stager"})) == settings_hash(cfg)
    entry = _short_entries(cfg)[0]
    SamplePipeline(cfg)(entry)
    other = SamplePipeline(replace(cfg, features={"n_mels": 64}))
    assert other(entry).mel.shape[1] == 64 and other.counters.decoded == 1


def test_edited_file_misses(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    path.write_bytes(b"abc")
    key = FeatureCache.key(Entry("a", str(path), ""))
    path.write_bytes(b"abcd")
    assert FeatureCache.key(Entry("a", str(path), "")) != key
    with pytest.raises(FileNotFoundError):
        FeatureCache.key(Entry("m", str(tmp_path / "missing.wav"), ""))


def test_the_keys_are_those_every_cache_was_written_under(tmp_path: Path) -> None:
    """The key of a clip is the hash it always was (a changed key silently invalidates
    every user's cache): a file's path, size and mtime_ns; a store's URL; the member's
    place; the segment."""
    path = tmp_path / "a.wav"
    path.write_bytes(b"abc")
    st = path.stat()

    def old(identity: str) -> bytes:
        return hashlib.blake2b(identity.encode(), digest_size=16).digest()

    file = f"{path}\0{st.st_size}\0{st.st_mtime_ns}"
    assert FeatureCache.key(Entry("a", str(path), "")) == old(file)
    segment = Entry("a", str(path), "", offset_s=0.5, duration_s=1.25)
    assert FeatureCache.key(segment) == old(f"{file}\0{0.5!r}\0{1.25!r}")
    member = Entry("a", str(path), "", member=(1536, 40960))
    assert FeatureCache.key(member) == old(f"{file}\0member 1536 40960")
    url = "s3://bucket/shard-0.tar"
    remote = Entry("a", url, "", member=(512, 1024))
    assert FeatureCache.key(remote) == old(f"{url}\0remote\0member 512 1024")


def test_a_stager_mode_producer_keeps_no_waveform_and_sends_a_hit_as_its_mel(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """features.device: stager. A miss is the waveform, never kept, with the key the
    stager keeps its mel under; once that mel is in the cache (as the stager's writer
    puts it), the clip comes as its mel, flattened in the wave field, marked MEL, and
    nothing is decoded. Where a mel cannot fit the wave field (n_mels > hop_length) a hit
    is not used, said once."""
    cfg = clips_cfg(tmp_path, device="stager")
    entries = _short_entries(cfg)[:2]
    cold = SamplePipeline(cfg)
    waves = [cold(e) for e in entries]
    assert len(FeatureCache(cfg)) == 0  # no waveform kept
    producer_mels = SamplePipeline(replace(cfg, features={"device": "producer", "cache": False}))
    writer = FeatureCache(cfg, reads=False)
    for sample, entry in zip(waves, entries, strict=True):
        assert sample.mel is None and sample.wave.ndim == 1 and not sample.marks & marks.MEL
        assert sample.cache_key == FeatureCache.key(entry) and len(sample.cache_key) == 16
        writer.put(sample.cache_key, producer_mels(entry).mel, sample.clip_marks)
    writer.close()
    warm = SamplePipeline(cfg)
    for sample, entry in zip(waves, entries, strict=True):
        hit = warm(entry)
        assert hit.marks & marks.MEL and hit.cache_key == b""
        mel = producer_mels(entry).mel
        np.testing.assert_array_equal(hit.wave, mel.reshape(-1))
        assert hit.tokens.tolist() == sample.tokens.tolist()
    assert warm.counters.decoded == 0 and warm.counters.cache_hits == 2
    wide = replace(cfg, features={"n_mels": 80, "hop_length": 64, "n_fft": 256, "win_length": 256})
    FeatureCache(wide).put(FeatureCache.key(entries[0]), np.zeros((5, 80), np.float32), 0)
    with caplog.at_level("WARNING"):
        too_wide = SamplePipeline(wide)
        sample = too_wide(entries[0])
    assert not sample.marks & marks.MEL and too_wide.counters.decoded == 1
    assert caplog.text.count("a cached mel does not fit") == 1
