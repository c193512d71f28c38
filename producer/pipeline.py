"""Everything a producer does to one sample, as one ordered list of stages: entry ->
tokens + mel (or waveform, or with stager mels a cached mel) + the optional fields.

Called in producer processes by their source (producer/sources.py DatasetSource)::

    pipe = SamplePipeline(cfg, index=index)
    pipe.warm_up()                       # before reporting ready
    sample = pipe(entry, item, epoch)    # Sample; or SkipSample, StageFailed, StageTimeout

The stages, in order, each named as a quarantine line names it (producer/causes.py
says what decides each; a config runs only those it asks for, ``pipe.stages``):

    text       the tokens (producer/text/encoder.py): first, as it is cheap and may
               refuse the sample before any audio is read
    features   the clip's arrays (producer/features/clip_features.py), in stages of
               their own: cache, audio (read_clip, decode), features (fit, mel), pitch,
               user, cache; on a feature-cache hit no audio is read and no mel computed
    outlier    data.outliers on the audio's marks (near-silent, clipped: producer/audio/
               decode.py judge_audio; cached with the features, so a hit knows them):
               skip skips the sample, flag delivers it with its marks in its READY
    pitch      the pitch normalized by the prosody table (features.pitch_norm)
    durations  durations per token from their file (producer/features/durations.py)
    reference  another clip of the speaker, cut (producer/features/references.py)

Each stage reads and writes the sample in progress (producer/sample.py Work), and
:func:`producer.sample.run_stage` names whatever ends it; ``counters`` says how often
each stage really ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ringfeed.producer.features.clip_features import ClipFeatures
from ringfeed.producer.features.durations import read_durations
from ringfeed.producer.features.mel import log_mel
from ringfeed.producer.features.prosody import PROSODY_VERSION, pitch
from ringfeed.producer.features.references import References
from ringfeed.producer.sample import PipelineCounters, Sample, SkipSample, Work, run_stage
from ringfeed.producer.start_check import (
    FieldsRefused,
    durations_problem,
    first_clip_problem,
    probe_overrides,
)
from ringfeed.producer.text.encoder import TextEncoder
from ringfeed.shared.config import Config, ConfigError, replace
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.feature_cache import FeatureCache
from ringfeed.shared.run.prosody_table import normalized_pitch, required_table
from ringfeed.shared.sample import marks as m

WARM_UP_S = 0.5

Stage = tuple[str, Callable[[Work], None]]


def prosody_table(cfg: Config, index: Any) -> dict[str, Any] | None:
    """The prosody table features.pitch_norm applies (shared/run/prosody_table.py), or
    None when it is none; ConfigError when the table is missing (what to run)."""
    if cfg.features.pitch_norm == "none":
        return None
    if index is None:
        raise ConfigError("features.pitch_norm: needs the corpus index (SamplePipeline index=)")
    return required_table(cfg, index.digest, PROSODY_VERSION)


def warm_up_wave(cfg: Config) -> np.ndarray:
    """WARM_UP_S of a 220 Hz tone at the configured rate: what warm-ups run the stages on."""
    t = np.arange(int(WARM_UP_S * cfg.audio.sample_rate), dtype=np.float32)
    return (0.5 * np.sin(2 * np.pi * 220.0 * t / cfg.audio.sample_rate)).astype(np.float32)


def warm_up_shared(cfg: Config) -> None:
    """The part of every producer's warm-up that is the same in all of a host's: the
    mel's filterbank, window and FFT library, for a pool to build once before it forks
    (producer/process/pool.py)."""
    if cfg.features.device == "producer":
        log_mel(warm_up_wave(cfg), cfg)


class SamplePipeline:
    """Per-sample work of one producer process: its stages, in order (module docstring)."""

    def __init__(self, cfg: Config, cache: FeatureCache | None = None, index: Any = None) -> None:
        """index: the dataset's (the mapped corpus index, or one in memory), for
        features.reference (another clip of the speaker) and features.pitch_norm."""
        self.cfg = cfg
        self.index = index
        self.counters = PipelineCounters()
        self.text = TextEncoder(cfg)
        self.features = ClipFeatures(cfg, self.counters, cache)
        self.prosody = prosody_table(cfg, index)
        self.references = (
            References(cfg, index, self.features, self.counters)
            if cfg.features.reference and index
            else None
        )
        self.stages: tuple[Stage, ...] = (
            ("text", self._tokens),
            ("features", self.features),
            ("outlier", self._judge),
            *([("pitch", self._normalize_pitch)] if self.prosody is not None else []),
            *([("durations", self._durations)] if cfg.features.durations_dir else []),
            *([("reference", self.references)] if self.references is not None else []),
        )

    def warm_up(self) -> None:
        """Run every stage once on a short synthetic signal, before the first grant, and
        try the configured fields on a real clip (producer/start_check.py): FieldsRefused
        when one would fail every clip.

        The mel is numpy (producer/features/mel.py) and costs milliseconds here; only
        audio.trim_silence needs librosa, whose first call costs ~2 s on a 2-core
        host (scipy.signal and numba imports): paying it here keeps it out of the
        first grant's lease.
        """
        wave = warm_up_wave(self.cfg)
        self.text.clean("Dr. Smith paid $3.50 on May 1st, 1999.")
        if self.cfg.audio.trim_silence:
            import librosa

            librosa.effects.trim(wave, top_db=self.cfg.audio.trim_top_db)
        if self.cfg.features.device == "producer":
            log_mel(wave, self.cfg)
        if self.cfg.features.pitch:  # pyworld's import, ~0.1 s
            pitch(wave, 1 + len(wave) // self.cfg.features.hop_length, self.cfg)
        if self.index is not None and (problem := fields_problem(self.cfg, self.index)):
            raise FieldsRefused(problem)

    def __call__(self, entry: Entry, item: int = -1, epoch: int = 0) -> Sample:
        """entry -> Sample(tokens int32 [n_tokens], mel float32 [n_frames, n_mels] or
        wave float32 [n_samples], the optional fields); raises SkipSample with the reason,
        the audio path and the stage, or StageFailed (StageTimeout) naming the stage.
        item, epoch: the entry's item and plan epoch (features.reference)."""
        work = Work(entry, item, epoch)
        try:
            for name, stage in self.stages:
                run_stage(name, stage, work)
        except SkipSample:
            self.counters.skipped += 1
            raise
        self.counters.samples += 1
        return self._sample(work)

    def _sample(self, work: Work) -> Sample:
        assert work.tokens is not None and work.array is not None
        truncated = work.text_truncated or bool(work.marks & m.TRUNCATED)
        sample = Sample(
            work.entry.item_id,
            work.tokens,
            truncated=truncated,
            marks=work.marks & (m.AUDIO | m.MEL),
            fields=work.fields,
            cache_key=work.cache_key,
            clip_marks=work.clip_marks,
        )
        if self.cfg.features.device == "producer":
            sample.mel = work.array
        else:  # the waveform, or the cached mel flattened (MEL): the stager's to tell
            sample.wave = work.array.reshape(-1)
        return sample

    # ------------------------------------------------------------ the stages of its own
    def _tokens(self, work: Work) -> None:
        e = work.entry
        work.tokens, work.text_truncated = self.text.encode(e.text, e.audio_path, e.language)

    def _judge(self, work: Work) -> None:
        """The clip's marks as data.outliers takes them: its audio marks dropped with keep;
        with skip a marked clip is skipped. Not a work counter: a heartbeat holds at most
        MAX_WORK_KEYS (shared/wire/bounds.py), all taken; the stager counts what it
        delivers flagged, the quarantine what is skipped."""
        policy = self.cfg.data.outliers
        if policy == "keep":
            work.marks &= ~m.AUDIO
        elif work.marks & m.AUDIO and policy == "skip":
            raise SkipSample(
                f"audio {m.describe_audio(work.marks)}: check the recording, or "
                "set data.outliers: flag or keep",
                work.entry.audio_path,
            )

    def _normalize_pitch(self, work: Work) -> None:
        assert self.prosody is not None
        if "pitch" not in work.fields:
            return
        mode = self.cfg.features.pitch_norm
        moments = (
            self.prosody["global"]
            if mode == "global"
            else (self.prosody["speakers"][work.entry.speaker])
        )
        work.fields["pitch"] = normalized_pitch(work.fields["pitch"], moments)

    def _durations(self, work: Work) -> None:
        assert work.tokens is not None and work.array is not None
        f = self.cfg.features
        is_mel = f.device == "producer" or work.marks & m.MEL
        frames = len(work.array) if is_mel else 1 + len(work.array) // f.hop_length
        work.fields["durations"] = read_durations(
            f.durations_dir, work.entry.item_id, len(work.tokens), frames
        )

    def read_counters(self) -> dict[str, int]:
        """Tar shard and object reads of this process (shared/corpus/clips.py)."""
        return self.features.counters_of_reads()

    def close(self) -> None:
        self.text.close()
        self.features.close()


def fields_problem(cfg: Config, index: Any) -> str:
    """'' or why a configured field would fail every clip of index (producer/start_check.py);
    called by each producer's warm-up and by scripts/preflight.py."""
    problem = durations_problem(cfg)
    if problem or not cfg.features.user_function:
        return problem
    probe = SamplePipeline(replace(cfg, features=probe_overrides()), index=index)
    try:
        return first_clip_problem(probe, index, cfg)
    finally:
        probe.close()
