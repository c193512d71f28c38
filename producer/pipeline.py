"""Everything a producer does to one sample: entry -> tokens + mel (or waveform).

Called in producer processes by the worker loop::

    pipe = SamplePipeline(cfg)
    pipe.warm_up()              # before reporting ready
    sample = pipe(entry)        # Sample, or raises SkipSample(reason, path)

Text goes first because it is cheap and may reject the sample before any
audio is decoded. On a feature-cache hit no audio is decoded and no mel is
computed; ``counters`` says how often each stage really ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ringfeed.producer.audio import Segment, load_audio
from ringfeed.producer.cache import FeatureCache
from ringfeed.producer.features import fit_length, log_mel
from ringfeed.producer.sample import Sample, SkipSample
from ringfeed.producer.text import TextEncoder
from ringfeed.shared.config import Config
from ringfeed.shared.dataset import DatasetEntry
from ringfeed.shared.shards import MemberReader

log = logging.getLogger(__name__)

WARM_UP_S = 0.5


@dataclass
class PipelineCounters:
    """How many times each stage ran in this process (cache hits skip decode and mel)."""

    samples: int = 0
    skipped: int = 0
    decoded: int = 0
    mels: int = 0
    cache_hits: int = 0
    cache_errors: int = 0
    # Samples not written to the cache because it stopped writing after repeated failures.
    cache_writes_off: int = 0


class SamplePipeline:
    """Per-sample work of one producer process: text, audio, features, cache."""

    def __init__(self, cfg: Config, cache: FeatureCache | None = None) -> None:
        self.cfg = cfg
        self.text = TextEncoder(cfg)
        self.counters = PipelineCounters()
        if cache is None and cfg.features.cache:
            try:
                cache = FeatureCache(cfg)
            except OSError as exc:
                self._cache_error("cannot open", exc)
        self.cache = cache
        self._members: MemberReader | None = None  # tar shard reads, made on first use
        # Where the sample in progress is: the stage of a quarantine entry.
        self.stage = "start"

    def warm_up(self) -> None:
        """Run every stage once on a short synthetic signal, before the first grant.

        The mel is numpy (producer/features.py) and costs milliseconds here; only
        audio.trim_silence needs librosa, whose first call costs ~2 s on a 2-core
        host (scipy.signal and numba imports): paying it here keeps it out of the
        first grant's lease.
        """
        sr = self.cfg.audio.sample_rate
        t = np.arange(int(WARM_UP_S * sr), dtype=np.float32) / sr
        wave = (0.5 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32)
        self.text.clean("Dr. Smith paid $3.50 on May 1st, 1999.")
        if self.cfg.audio.trim_silence:
            import librosa

            librosa.effects.trim(wave, top_db=self.cfg.audio.trim_top_db)
        if self.cfg.features.device == "producer":
            log_mel(wave, self.cfg)

    def __call__(self, entry: DatasetEntry) -> Sample:
        """entry -> Sample(tokens int32 [n_tokens], mel float32 [n_frames, n_mels] or
        wave float32 [n_samples]); raises SkipSample with the reason and the audio path."""
        try:
            sample = self._process(entry)
        except SkipSample as skip:
            skip.stage = skip.stage or self.stage
            self.counters.skipped += 1
            raise
        self.counters.samples += 1
        return sample

    def _process(self, entry: DatasetEntry) -> Sample:
        self.stage = "text"
        tokens, text_truncated = self.text.encode(entry.text, entry.audio_path, entry.language)
        array, audio_truncated = self._features(entry.audio_path, entry.segment, entry.member)
        sample = Sample(entry.item_id, tokens, truncated=text_truncated or audio_truncated)
        if self.cfg.features.device == "producer":
            sample.mel = array
        else:
            sample.wave = array
        return sample

    def _features(
        self, path: str, segment: Segment = None, member: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, bool]:
        """-> (mel [n_frames, n_mels] or wave [n_samples], truncated), from cache if possible;
        segment: (offset_s, duration_s) of a clip that is part of its file; member: (byte
        offset, size) of its audio when path is a tar shard."""
        key, hit = self._cache_get(path, segment, member)
        if hit is not None:
            return hit
        self.stage = "audio"
        data = self._member_bytes(path, member) if member is not None else None
        wave = load_audio(path, self.cfg, segment, data)
        self.counters.decoded += 1
        self.stage = "features"
        wave, truncated = fit_length(wave, self.cfg, path)
        if self.cfg.features.device == "producer":
            array = log_mel(wave, self.cfg)
            self.counters.mels += 1
        else:
            array = wave
        if key is not None:
            self.stage = "cache"
            try:
                if not self.cache.put(key, array, truncated):
                    self.counters.cache_writes_off += 1
            except OSError as exc:  # a full or read-only disk costs the cache, not the sample
                self._cache_error("cannot write", exc)
        return array, truncated

    def _member_bytes(self, path: str, member: tuple[int, int]) -> bytes:
        """A shard member's bytes (shared/shards.py: one ranged read; a remote shard through
        the local shard cache); a shard that cannot be read costs this sample."""
        if self._members is None:
            self._members = MemberReader(self.cfg)
        try:
            return self._members.read(path, *member)
        except FileNotFoundError:
            raise SkipSample("audio file not found (its tar shard)", path, "audio") from None
        except OSError as exc:
            raise SkipSample(f"unreadable tar shard member ({exc})", path, "audio") from None

    def member_counters(self) -> dict[str, int]:
        """Tar shard reads of this process (shared/shards.py MemberReader.counters)."""
        return self._members.counters() if self._members is not None else {}

    def _cache_get(
        self, path: str, segment: Segment = None, member: tuple[int, int] | None = None
    ) -> tuple[bytes | None, tuple[np.ndarray, bool] | None]:
        """(cache key, hit or None); a cache that cannot be read is a miss."""
        if self.cache is None:
            return None, None
        self.stage = "cache"
        try:
            key = self.cache.key(path, segment, member)
        except FileNotFoundError:
            raise SkipSample("audio file not found", path, "audio") from None
        try:
            hit = self.cache.get(key)
        except OSError as exc:
            self._cache_error("cannot read", exc)
            return key, None
        if hit is not None:
            self.counters.cache_hits += 1
        return key, hit

    def _cache_error(self, what: str, exc: OSError) -> None:
        self.counters.cache_errors += 1
        n = self.counters.cache_errors
        if n <= 3 or n % 1000 == 0:  # one per sample on a full disk: keep the log short
            log.warning("feature cache %s (%d so far): %s; samples go on without it",
                        what, n, exc)  # fmt: skip

    def close(self) -> None:
        self.text.close()
        if self.cache is not None:
            self.cache.close()
