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

from producer.audio import load_audio
from producer.cache import FeatureCache
from producer.dataset import DatasetEntry
from producer.features import fit_length, log_mel
from producer.sample import Sample, SkipSample
from producer.text import TextEncoder
from shared.config import Config

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


class SamplePipeline:
    """Per-sample work of one producer process: text, audio, features, cache."""

    def __init__(self, cfg: Config, cache: FeatureCache | None = None) -> None:
        self.cfg = cfg
        self.text = TextEncoder(cfg)
        if cache is None and cfg.features.cache:
            cache = FeatureCache(cfg)
        self.cache = cache
        self.counters = PipelineCounters()

    def warm_up(self) -> None:
        """Run every library once on a short synthetic signal.

        librosa's first call costs ~1-2 s (numba and scipy imports, filterbank);
        paying it here keeps it out of the first grant's lease.
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
        except SkipSample:
            self.counters.skipped += 1
            raise
        self.counters.samples += 1
        return sample

    def _process(self, entry: DatasetEntry) -> Sample:
        tokens, text_truncated = self.text.encode(entry.text, entry.audio_path)
        array, audio_truncated = self._features(entry.audio_path)
        sample = Sample(entry.item_id, tokens, truncated=text_truncated or audio_truncated)
        if self.cfg.features.device == "producer":
            sample.mel = array
        else:
            sample.wave = array
        return sample

    def _features(self, path: str) -> tuple[np.ndarray, bool]:
        """-> (mel [n_frames, n_mels] or wave [n_samples], truncated), from cache if possible."""
        key = None
        if self.cache is not None:
            try:
                key = self.cache.key(path)
            except FileNotFoundError:
                raise SkipSample("audio file not found", path) from None
            hit = self.cache.get(key)
            if hit is not None:
                self.counters.cache_hits += 1
                return hit
        wave = load_audio(path, self.cfg)
        self.counters.decoded += 1
        wave, truncated = fit_length(wave, self.cfg, path)
        if self.cfg.features.device == "producer":
            array = log_mel(wave, self.cfg)
            self.counters.mels += 1
        else:
            array = wave
        if key is not None:
            self.cache.put(key, array, truncated)
        return array, truncated

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
