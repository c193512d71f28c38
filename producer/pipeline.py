"""Everything a producer does to one sample: entry -> tokens + mel (or waveform).

Called in producer processes by the worker loop::

    pipe = SamplePipeline(cfg)
    pipe.warm_up()              # before reporting ready
    sample = pipe(entry)        # Sample, or raises SkipSample(reason, path)

Text goes first because it is cheap and may reject the sample before any
audio is decoded. On a feature-cache hit no audio is decoded and no mel is
computed; ``counters`` says how often each stage really ran. A clip whose audio the
decode marked near-silent or clipped (producer/audio/decode.py judge_audio; the marks are
cached with its features, so a hit knows them too) is skipped with stage "outlier"
under data.outliers: skip, and delivered with its marks in its READY under flag.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringfeed.producer.audio.decode import Segment, load_judged
from ringfeed.producer.features.cache import FeatureCache
from ringfeed.producer.features.durations import read_durations
from ringfeed.producer.features.extra_fields import ExtraFields
from ringfeed.producer.features.mel import fit_length, log_mel, log_mel_energy
from ringfeed.producer.features.prosody import PROSODY_VERSION, pitch
from ringfeed.producer.features.references import SpeakerClips, cut_reference, reference_candidates
from ringfeed.producer.sample import Sample, SkipSample
from ringfeed.producer.start_check import (
    FieldsRefused,
    durations_problem,
    first_clip_problem,
    probe_overrides,
)
from ringfeed.producer.text.encoder import TextEncoder
from ringfeed.shared.config import Config, ConfigError, replace
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.members import MemberReader
from ringfeed.shared.memory.disk import DiskFull
from ringfeed.shared.run.prosody_table import normalized_pitch, required_table
from ringfeed.shared.sample import marks as m

log = logging.getLogger(__name__)

WARM_UP_S = 0.5


@dataclass
class PipelineCounters:
    """How many times each stage ran in this process (cache hits skip decode and mel)."""

    samples: int = 0
    skipped: int = 0
    decoded: int = 0
    mels: int = 0
    # Samples whose optional fields (pitch, energy, the user's) were computed, not cached.
    extras: int = 0
    # Samples whose speaker has no other clip that reads: its own reference
    # (features.single_clip: own).
    reference_own: int = 0
    # Reference candidates that could not be read (each remembered, tried once here).
    reference_failed: int = 0
    cache_hits: int = 0
    cache_errors: int = 0
    # Samples not written to the cache because it stopped writing after repeated failures.
    cache_writes_off: int = 0


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
    (producer/pool.py)."""
    if cfg.features.device == "producer":
        log_mel(warm_up_wave(cfg), cfg)


class SamplePipeline:
    """Per-sample work of one producer process: text, audio, features, cache."""

    def __init__(self, cfg: Config, cache: FeatureCache | None = None, index: Any = None) -> None:
        """index: the dataset's (DatasetIndex or the mapped corpus index), for
        features.reference (another clip of the speaker)."""
        self.cfg = cfg
        self.text = TextEncoder(cfg)
        self.counters = PipelineCounters()
        if cache is None and cfg.features.cache:
            try:
                cache = FeatureCache(cfg)
            except OSError as exc:
                self._cache_error("cannot open", exc)
        self.cache = cache
        self.extras = ExtraFields(cfg)
        self.index = index
        self.clips = SpeakerClips(index) if cfg.features.reference and index else None
        self.prosody = prosody_table(cfg, index)
        self.bad_references: set[int] = set()  # candidates that did not read, this process
        self._members: MemberReader | None = None  # tar shard reads, made on first use
        # Where the sample in progress is: the stage of a quarantine entry.
        self.stage = "start"

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
        wave float32 [n_samples], the optional fields); raises SkipSample with the reason
        and the audio path. item, epoch: the entry's item and plan epoch (features.reference)."""
        try:
            sample = self._process(entry)
            if self.cfg.features.reference:
                sample.fields["ref_mel"] = self._reference(item, epoch)
        except SkipSample as skip:
            skip.stage = skip.stage or self.stage
            self.counters.skipped += 1
            raise
        self.counters.samples += 1
        return sample

    def _process(self, entry: Entry) -> Sample:
        self.stage = "text"
        tokens, text_truncated = self.text.encode(entry.text, entry.audio_path, entry.language)
        fields: dict[str, np.ndarray] = {}
        if self.extras.active:
            array, marks, fields = self._with_extras(entry, len(tokens))
        else:
            array, marks = self._features(entry.audio_path, entry.segment, entry.member)
        marks = self._judge(marks, entry.audio_path)
        truncated = text_truncated or bool(marks & m.TRUNCATED)
        sample = Sample(entry.item_id, tokens, truncated=truncated, marks=marks & m.AUDIO)
        sample.fields = fields
        if self.prosody is not None and "pitch" in fields:
            self.stage = "pitch"
            mode = self.cfg.features.pitch_norm
            moments = self.prosody["global"] if mode == "global" else (
                self.prosody["speakers"][entry.speaker])  # fmt: skip
            fields["pitch"] = normalized_pitch(fields["pitch"], moments)
        if self.cfg.features.durations_dir:
            self.stage = "durations"
            frames = len(array) if self.cfg.features.device == "producer" else (
                1 + len(array) // self.cfg.features.hop_length)  # fmt: skip
            fields["durations"] = read_durations(self.cfg.features.durations_dir,
                                                 entry.item_id, len(tokens), frames)  # fmt: skip
        if self.cfg.features.device == "producer":
            sample.mel = array
        else:
            sample.wave = array
        return sample

    def _judge(self, marks: int, path: str) -> int:
        """The clip's marks as data.outliers takes them: its audio marks dropped with keep;
        with skip a marked clip is skipped (stage "outlier"). Not a work counter: a
        heartbeat holds at most MAX_WORK_KEYS (shared/wire/bounds.py), all taken; the
        stager counts what it delivers flagged, the quarantine what is skipped."""
        policy = self.cfg.data.outliers
        if policy == "keep":
            return marks & ~m.AUDIO
        if marks & m.AUDIO and policy == "skip":
            raise SkipSample(f"audio {m.describe_audio(marks)}: check the recording, or "
                             "set data.outliers: flag or keep", path, "outlier")  # fmt: skip
        return marks

    def _features(
        self, path: str, segment: Segment = None, member: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, int]:
        """-> (mel [n_frames, n_mels] or wave [n_samples], its marks: shared/sample/marks.py),
        from cache if possible;
        segment: (offset_s, duration_s) of a clip that is part of its file; member: (byte
        offset, size) of its audio when path is a tar shard."""
        key, hit = self._cache_get(path, segment, member)
        if hit is not None:
            return hit
        self.stage = "audio"
        data = self._member_bytes(path, member) if member is not None else None
        wave, marks = load_judged(path, self.cfg, segment, data)
        self.counters.decoded += 1
        self.stage = "features"
        wave, truncated = fit_length(wave, self.cfg, path)
        marks |= m.TRUNCATED if truncated else 0
        if self.cfg.features.device == "producer":
            array = log_mel(wave, self.cfg)
            self.counters.mels += 1
        else:
            array = wave
        if key is not None:
            self.stage = "cache"
            try:
                if not self.cache.put(key, array, marks):
                    self.counters.cache_writes_off += 1
            except OSError as exc:  # a full or read-only disk costs the cache, not the sample
                self._cache_error("cannot write", exc)
        return array, marks

    def _reference(self, item: int, epoch: int) -> np.ndarray:
        """The log-mel of another clip of item's speaker, cut to reference_frames: the
        first candidate that reads (producer/features/references.py), from the feature cache when
        there; a candidate that does not read costs itself, never this item."""
        if self.clips is None or self.index is None or item < 0:
            raise ValueError("features.reference needs the dataset index and the item")
        candidates, rng = reference_candidates(self.clips, item, epoch, self.cfg)
        for ref in candidates:
            array = self._reference_features(ref) if ref not in self.bad_references else None
            if array is not None:
                return self._cut_reference(array, rng)
        if self.cfg.features.single_clip == "skip":
            tried = f" that reads (tried {len(candidates)})" if candidates else ""
            raise SkipSample(f"its speaker has no other clip{tried} for a reference "
                             "(features.single_clip: skip; own uses the clip itself)",
                             stage="reference")  # fmt: skip
        self.counters.reference_own += 1
        entry = self.index.entry(item)
        array, _ = self._features(entry.audio_path, entry.segment, entry.member)
        return self._cut_reference(array, rng)

    def _reference_features(self, ref: int) -> np.ndarray | None:
        """Candidate ref's features, or None when it does not read, whatever the reason
        (remembered and counted; the plan quarantines it when it reaches ref itself)."""
        try:
            entry = self.index.entry(ref)
            array, marks = self._features(entry.audio_path, entry.segment, entry.member)
            if marks & (m.NEAR_SILENT | m.CLIPPED) and self.cfg.data.outliers != "keep":
                # Its audio is no example of the voice (a near-silent clip normalized up is
                # loud hiss). A speaking-rate outlier is: the rate judges its text, not it.
                raise SkipSample(f"its audio is {m.describe_audio(marks)} (data.outliers)")
            return array
        except Exception as exc:  # noqa: BLE001 - one candidate's failure costs that candidate
            self.bad_references.add(ref)
            self.counters.reference_failed += 1
            why = exc.reason if isinstance(exc, SkipSample) else f"{type(exc).__name__}: {exc}"
            log.warning("reference candidate %d does not read (%s): the next one is tried",
                        ref, why[:200])  # fmt: skip
            return None

    def _cut_reference(self, array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        self.stage = "reference"
        mel = array if self.cfg.features.device == "producer" else log_mel(array, self.cfg)
        return cut_reference(mel, self.cfg.features.reference_frames, rng)

    def _with_extras(
        self, entry: Entry, n_tokens: int
    ) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
        """(mel or wave, its marks, optional fields) from the cache when every part is
        there, else all computed from one decode (and the missing parts cached)."""
        key, hit = self._cache_get(entry.audio_path, entry.segment, entry.member)
        if hit is not None:
            fields = self.extras.from_cache(self.cache.get, key, entry)
            if fields is not None:
                return hit[0], hit[1], fields
        self.stage = "audio"
        data = self._member_bytes(entry.audio_path, entry.member) if entry.member else None
        wave, marks = load_judged(entry.audio_path, self.cfg, entry.segment, data)
        self.counters.decoded += 1
        self.stage = "features"
        wave, truncated = fit_length(wave, self.cfg, entry.audio_path)
        marks |= m.TRUNCATED if truncated else 0
        fields: dict[str, np.ndarray] = {}
        mel = None
        frames = 1 + len(wave) // self.cfg.features.hop_length
        if self.cfg.features.device == "producer":
            if self.extras.energy:
                mel, fields["energy"] = log_mel_energy(wave, self.cfg)
            else:
                mel = log_mel(wave, self.cfg)
            self.counters.mels += 1
        if self.extras.pitch:
            self.stage = "pitch"
            fields["pitch"], fields["voiced"] = pitch(wave, frames, self.cfg)
        if self.extras.user is not None:
            self.stage = "user"  # an exception of the user's function: a sample of stage user
            fields.update(self.extras.call_user(wave, mel, frames, n_tokens, entry))
        self.counters.extras += 1
        array = mel if mel is not None else wave
        if key is not None:
            self.stage = "cache"
            try:
                if hit is None and not self.cache.put(key, array, marks):
                    self.counters.cache_writes_off += 1
                self.extras.to_cache(self.cache.put, key, entry, fields, truncated)
            except OSError as exc:  # a full or read-only disk costs the cache, not the sample
                self._cache_error("cannot write", exc)
        return array, marks, fields

    def _member_bytes(self, path: str, member: tuple[int, int]) -> bytes:
        """A shard member's bytes (shared/corpus/members.py: one ranged read; a remote shard through
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
        """Tar shard reads of this process (shared/corpus/members.py MemberReader.counters)."""
        return self._members.counters() if self._members is not None else {}

    def _cache_get(
        self, path: str, segment: Segment = None, member: tuple[int, int] | None = None
    ) -> tuple[bytes | None, tuple[np.ndarray, int] | None]:
        """(cache key, hit (array, marks) or None); a cache that cannot be read is a miss."""
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
        if isinstance(exc, DiskFull) and what == "cannot write":
            return  # the cache said so, once, and writes no more (producer/features/cache.py)
        if n <= 3 or n % 1000 == 0:  # one per sample on a full disk: keep the log short
            log.warning("feature cache %s (%d so far): %s; samples go on without it",
                        what, n, exc)  # fmt: skip

    def close(self) -> None:
        self.text.close()
        if self.cache is not None:
            self.cache.close()


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
