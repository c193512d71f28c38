"""Speaker reference clips (features.reference): another clip of the same speaker.

Called in producer processes by the sample pipeline. XTTS-style models encode a
reference clip into a speaker latent; a reference that is the target clip itself
lets the model copy instead of learn (DL-Art-School#10), so the reference is a
different clip of the same speaker, chosen deterministically from
(stager.seed, epoch, item): a resumed run sees the same references, and each
epoch another one. Its log-mel (from the feature cache when there) is cut to
features.reference_frames from an offset drawn from the same generator, or kept
whole when shorter (the batch's ref_mel_lens says how long).

A reference that cannot be read costs itself, never the clip that drew it
(docs/design.md#contract-9): the candidates are the speaker's other clips in a
deterministic order from (seed, epoch, item) (:func:`reference_candidates`: the
first is the one drawn, then the next ones in the speaker's list), and the first
that reads is the reference. The bad one is remembered by the producer (tried
once a process, counted as ``reference_failed``) and quarantined with its own
reason when the plan reaches it as an item. A speaker with no other clip, or none
that reads within MAX_REFERENCE_TRIES, uses the clip itself (features.single_clip:
own, counted as ``reference_own``) or skips the item (single_clip: skip;
quarantined with stage "reference").

Memory: the items sorted by speaker, one int32 array (4 bytes a clip: 40 MB for
10 M clips), sorted once per producer at start from the index's speaker ids
(shared/corpus/index.py maps them) when features.reference is on; nothing
otherwise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from ringfeed.producer.features.mel import log_mel
from ringfeed.producer.sample import PipelineCounters, SkipSample, Work, error_of
from ringfeed.shared.config import Config
from ringfeed.shared.sample import marks as m

if TYPE_CHECKING:
    from ringfeed.producer.features.clip_features import ClipFeatures

log = logging.getLogger(__name__)


class SpeakerClips:
    """Items grouped by speaker: which other clips a speaker has. The index's speaker id
    of each item (speaker_ids: mapped for a corpus index) stays where it is; only the
    items sorted by speaker are held."""

    def __init__(self, index: Any) -> None:
        """index: the corpus index (speaker_ids, n_items)."""
        self.code = index.speaker_ids  # item -> speaker id (int32, maybe mapped)
        codes = np.asarray(self.code[0 : index.n_items], dtype=np.int32)
        self.order = np.argsort(codes, kind="stable").astype(np.int32)  # items by speaker
        counts = np.bincount(codes, minlength=int(codes.max(initial=-1)) + 1)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def clips_of(self, item: int) -> np.ndarray:
        """Every item of item's speaker, ascending (item among them)."""
        c = int(self.code[item])
        return self.order[self.starts[c] : self.starts[c + 1]]


# Other clips of a speaker tried for one reference before the item falls back to
# features.single_clip: each failed try costs a decode attempt (and is remembered).
MAX_REFERENCE_TRIES = 16


def reference_candidates(
    clips: SpeakerClips, item: int, epoch: int, cfg: Config
) -> tuple[list[int], np.random.Generator]:
    """(the speaker's other clips in the order to try them: the one drawn first, then
    the next ones in the speaker's list, wrapping, at most MAX_REFERENCE_TRIES; empty
    when it has none; the generator that then draws the cut's offset)."""
    rng = np.random.default_rng([cfg.stager.seed, epoch, item])
    group = clips.clips_of(item)
    if len(group) < 2:
        return [], rng
    others = np.delete(group, int(np.searchsorted(group, item)))  # items ascending
    j = int(rng.integers(len(others)))
    tries = min(len(others), MAX_REFERENCE_TRIES)
    return [int(others[(j + k) % len(others)]) for k in range(tries)], rng


def choose_reference(
    clips: SpeakerClips, item: int, epoch: int, cfg: Config
) -> tuple[int, np.random.Generator]:
    """(the reference when every clip reads: the first candidate, or item itself when
    its speaker has no other clip; the generator that also draws the cut's offset)."""
    candidates, rng = reference_candidates(clips, item, epoch, cfg)
    return (candidates[0] if candidates else item), rng


def cut_reference(mel: np.ndarray, frames: int, rng: np.random.Generator) -> np.ndarray:
    """mel [n, n_mels] -> its frames [offset, offset + frames) (offset drawn from rng),
    or the whole mel when n <= frames."""
    n = mel.shape[0]
    if n <= frames:
        return mel
    offset = int(rng.integers(n - frames + 1))
    return mel[offset : offset + frames]


class References:
    """The reference stage (features.reference): the log-mel of another clip of the
    item's speaker, cut to reference_frames: the first candidate that reads, its mel by
    the same path as any clip's (producer/features/clip_features.py, from the feature
    cache when there); a candidate that does not read costs itself, never this item."""

    name = "reference"

    def __init__(
        self, cfg: Config, index: Any, features: ClipFeatures, counters: PipelineCounters
    ) -> None:
        """index: the corpus index (entries, speaker ids); features: the clip path of
        the pipeline it is a stage of; counters: that pipeline's."""
        self.cfg, self.index, self.features, self.counters = cfg, index, features, counters
        self.speakers = SpeakerClips(index)
        self.bad: set[int] = set()  # candidates that did not read, this process

    def __call__(self, work: Work) -> None:
        if work.item < 0:
            raise ValueError("features.reference needs the dataset index and the item")
        candidates, rng = reference_candidates(self.speakers, work.item, work.epoch, self.cfg)
        for ref in candidates:
            array = self._candidate(ref) if ref not in self.bad else None
            if array is not None:
                work.fields["ref_mel"] = self._cut(array, rng)
                return
        if self.cfg.features.single_clip == "skip":
            tried = f" that reads (tried {len(candidates)})" if candidates else ""
            raise SkipSample(
                f"its speaker has no other clip{tried} for a reference "
                "(features.single_clip: skip; own uses the clip itself)"
            )
        self.counters.reference_own += 1
        assert work.array is not None
        work.fields["ref_mel"] = self._cut(work.array, rng)

    def _candidate(self, ref: int) -> np.ndarray | None:
        """Candidate ref's mel (from the feature cache when there, else computed here and
        kept, whatever features.device), or None when it does not read, whatever the
        reason (remembered and counted; the plan quarantines it when it reaches ref)."""
        try:
            array, marks, _ = self.features.arrays(self.index.entry(ref), extras=False)
            if marks & (m.NEAR_SILENT | m.CLIPPED) and self.cfg.data.outliers != "keep":
                # Its audio is no example of the voice (a near-silent clip normalized up is
                # loud hiss). A speaking-rate outlier is: the rate judges its text, not it.
                raise SkipSample(f"its audio is {m.describe_audio(marks)} (data.outliers)")
            return array
        except Exception as exc:  # noqa: BLE001 - one candidate's failure costs that candidate
            self.bad.add(ref)
            self.counters.reference_failed += 1
            error = error_of(exc)
            why = (
                error.reason
                if isinstance(error, SkipSample)
                else (f"{type(error).__name__}: {error}")
            )
            log.warning(
                "reference candidate %d does not read (%s): the next one is tried", ref, why[:200]
            )
            return None

    def _cut(self, array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A mel [frames, n_mels], or a stager-mode sample's own wave [n], cut."""
        mel = array if array.ndim == 2 else log_mel(array, self.cfg)
        return cut_reference(mel, self.cfg.features.reference_frames, rng)
