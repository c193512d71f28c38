"""A clip's arrays: its mel (or wave), its audio marks and its optional fields, by one
path for plain and optional fields alike.

Called in producer processes, by the sample pipeline (producer/pipeline.py) for each
sample's own clip and by the reference stage (producer/features/references.py) for a
candidate's mel. Its steps are stages of their own, each named as a quarantine line
names it (producer/sample.py run_stage):

    cache     the feature cache looked up (shared/corpus/feature_cache.py): with every
              part there (the mel or wave with its marks, and each optional field's
              group, producer/features/extra_fields.py) nothing below runs
    audio     the clip read where it lives (shared/corpus/clips.py read_clip) and
              decoded, resampled, judged and normalized (producer/audio/decode.py)
    features  fitted to the slot and its log-mel computed, with its energy when asked
              (producer/features/mel.py)
    pitch     f0 and voicing (producer/features/prosody.py)
    user      the user's fields (producer/features/extra_fields.py)
    cache     what was computed kept; a full or read-only disk costs the cache, never
              the sample

The optional fields are cached under keys of their own beside the mel's, so turning
one on or off keeps the mels; a hit of the mel with a group missing decodes once and
computes everything again, keeping only what was missing.

The cache holds the clip's log-mel whatever features.device (shared/corpus/feature_cache.py).
With features.device: stager a hit is the mel, sent as it is (marks MEL: the stager
computes no mel for it), and a miss is the waveform, which is never cached: the stager
keeps the mel it computes under the key looked up here (Clip.key, sent in the READY),
so the next epoch's hit skips the FFT too.
"""

from __future__ import annotations

import logging

import numpy as np

from ringfeed.producer.audio.decode import load_clip
from ringfeed.producer.features.extra_fields import ExtraFields
from ringfeed.producer.features.mel import fit_length, log_mel, log_mel_energy
from ringfeed.producer.features.prosody import pitch
from ringfeed.producer.sample import PipelineCounters, SkipSample, Work, run_stage
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.clips import ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.feature_cache import FeatureCache
from ringfeed.shared.memory.disk import DiskFull
from ringfeed.shared.sample import marks as m

log = logging.getLogger(__name__)

# (mel [n_frames, n_mels] or wave [n_samples], its marks, the optional fields by name)
Arrays = tuple[np.ndarray, int, dict[str, np.ndarray]]
NO_KEY = b""


class ClipFeatures:
    """The stages from the feature cache to the feature cache (module docstring), for one
    producer process: its cache, its clip reader, its optional fields."""

    name = "features"

    def __init__(
        self, cfg: Config, counters: PipelineCounters, cache: FeatureCache | None = None
    ) -> None:
        self.cfg, self.counters = cfg, counters
        if cache is None and cfg.features.cache:
            try:
                cache = FeatureCache(cfg)
            except OSError as exc:
                self._cache_error("cannot open", exc)
        self.cache = cache
        self.extras = ExtraFields(cfg)
        self.clips = ClipReader(cfg)
        self.on_producer = cfg.features.device == "producer"
        # With stager mels a cached mel goes in the wave field: only where it fits there.
        self.mel_hits = self.on_producer or cfg.schema.mels_fit_waves
        if not self.mel_hits and cache is not None:
            log.warning(
                "features.n_mels=%d > features.hop_length=%d: a cached mel does not fit "
                "the waveform's field, so the stager computes every mel (the cache keeps "
                "the optional fields and the references' mels)",
                cfg.features.n_mels,
                cfg.features.hop_length,
            )

    def __call__(self, work: Work) -> None:
        """The sample's own clip, with every optional field; work.cache_key: where the
        stager keeps the mel it computes of it (b'' when none is to be kept)."""
        assert work.tokens is not None
        arrays, work.cache_key = self._arrays(work.entry, len(work.tokens), True, False)
        work.array, work.marks, work.fields = arrays
        work.clip_marks = work.marks & m.ALL

    def arrays(self, entry: Entry, n_tokens: int = 0, extras: bool = True) -> Arrays:
        """The clip's arrays; extras False: the log-mel, whatever features.device, and
        its marks alone (a reference candidate). n_tokens: the sample's, for the user's
        fields."""
        return self._arrays(entry, n_tokens, extras, not extras)[0]

    def _arrays(self, entry: Entry, n_tokens: int, extras: bool, mel: bool) -> tuple[Arrays, bytes]:
        """(the clip's arrays: the mel, or with stager mels a wave unless cached or `mel`;
        the marks, MEL where a stager-mode sample's array is its mel; the key under which
        the stager is to keep the mel it computes of the wave, or NO_KEY)."""
        extras = extras and self.extras.active
        mel = mel or self.on_producer  # the mel is computed here
        key, hit, fields = run_stage("cache", self._look_up, entry, extras, mel)
        if hit is not None and fields is not None:
            return (hit[0], hit[1] | (0 if mel else m.MEL), fields), NO_KEY
        wave, marks = run_stage("audio", load_clip, self.clips, entry, self.cfg)
        self.counters.decoded += 1
        wave, truncated = run_stage("features", fit_length, wave, self.cfg, entry.audio_path)
        marks |= m.TRUNCATED if truncated else 0
        array, fields = run_stage("features", self._mel, wave, extras, mel)
        if extras:
            frames = 1 + len(wave) // self.cfg.features.hop_length
            if self.extras.pitch:
                fields["pitch"], fields["voiced"] = run_stage(
                    "pitch", pitch, wave, frames, self.cfg
                )
            if self.extras.user is not None:  # an exception of the user's: stage user
                fields.update(
                    run_stage(
                        "user",
                        self.extras.call_user,
                        wave,
                        array if mel else None,
                        frames,
                        n_tokens,
                        entry,
                    )
                )
            self.counters.extras += 1
        if key is None:
            return (array, marks, fields), NO_KEY
        fresh = hit is None and mel  # a waveform is never kept: the stager keeps its mel
        run_stage("cache", self._keep, key, entry, (array, marks, fields), fresh, truncated)
        return (array, marks, fields), key if hit is None and not mel else NO_KEY

    def _look_up(
        self, entry: Entry, extras: bool, mel: bool
    ) -> tuple[bytes | None, tuple | None, dict | None]:
        """(cache key, hit (mel, marks) or None, the optional fields when every group is
        cached, else None); a cache that cannot be read is a miss, and so is a mel that
        cannot go where a stager-mode sample's wave goes (not mel, not mel_hits)."""
        if self.cache is None:
            return None, None, None
        try:
            key = self.cache.key(entry)
        except FileNotFoundError:
            raise SkipSample("audio file not found", entry.audio_path, "audio") from None
        try:
            hit = self.cache.get(key)
        except OSError as exc:
            self._cache_error("cannot read", exc)
            return key, None, None
        if hit is None or not (mel or self.mel_hits):
            return key, None, None
        self.counters.cache_hits += 1
        fields = self.extras.from_cache(self.cache.get, key, entry) if extras else {}
        return key, hit, fields

    def _mel(
        self, wave: np.ndarray, extras: bool, mel: bool
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(the log-mel of the fitted wave, or, not `mel`, the wave itself; energy among
        the fields when asked)."""
        fields: dict[str, np.ndarray] = {}
        if not mel:
            return wave, fields
        if extras and self.extras.energy:
            mel, fields["energy"] = log_mel_energy(wave, self.cfg)
        else:
            mel = log_mel(wave, self.cfg)
        self.counters.mels += 1
        return mel, fields

    def _keep(self, key: bytes, entry: Entry, arrays: Arrays, fresh: bool, truncated: bool) -> None:
        """What was computed into the cache: the mel when it was not there (fresh), and
        every optional field's group."""
        array, marks, fields = arrays
        assert self.cache is not None
        try:
            if fresh and not self.cache.put(key, array, marks):
                self.counters.cache_writes_off += 1
            if fields:
                self.extras.to_cache(self.cache.put, key, entry, fields, truncated)
        except OSError as exc:  # a full or read-only disk costs the cache, not the sample
            self._cache_error("cannot write", exc)

    def _cache_error(self, what: str, exc: OSError) -> None:
        self.counters.cache_errors += 1
        n = self.counters.cache_errors
        if isinstance(exc, DiskFull) and what == "cannot write":
            return  # the cache said so, once, and writes no more (shared/corpus/feature_cache.py)
        if n <= 3 or n % 1000 == 0:  # one per sample on a full disk: keep the log short
            log.warning("feature cache %s (%d so far): %s; samples go on without it", what, n, exc)

    def counters_of_reads(self) -> dict[str, int]:
        """Tar shard and object reads of this process (ClipReader.counters)."""
        return self.clips.counters()

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
