"""Speaker reference clips (features.reference): another clip of the same speaker.

Called in producer processes by the sample pipeline. XTTS-style models encode a
reference clip into a speaker latent; a reference that is the target clip itself
lets the model copy instead of learn (DL-Art-School#10), so the reference is a
different clip of the same speaker, chosen deterministically from
(stager.seed, epoch, item): a resumed run sees the same references, and each
epoch another one. Its log-mel (from the feature cache when there) is cut to
features.reference_frames from an offset drawn from the same generator, or kept
whole when shorter (the batch's ref_mel_lens says how long).

A speaker with a single clip uses that clip (features.single_clip: own, counted
as ``reference_own``) or skips the item (single_clip: skip; quarantined with
stage "reference").

Memory: the items sorted by speaker, one int32 array (4 bytes a clip: 40 MB for
10 M clips), sorted once per producer at start from the index's speaker ids
(shared/corpus/index.py maps them) when features.reference is on; nothing
otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ringfeed.shared.config import Config


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


def choose_reference(
    clips: SpeakerClips, item: int, epoch: int, cfg: Config
) -> tuple[int, np.random.Generator]:
    """(the reference item: another clip of item's speaker, or item itself when it is
    the speaker's only one; the generator that also draws the cut's offset)."""
    rng = np.random.default_rng([cfg.stager.seed, epoch, item])
    group = clips.clips_of(item)
    if len(group) < 2:
        return item, rng
    j = int(rng.integers(len(group) - 1))
    own = int(np.searchsorted(group, item))  # stable sort: items ascending in a group
    return int(group[j + (j >= own)]), rng


def cut_reference(mel: np.ndarray, frames: int, rng: np.random.Generator) -> np.ndarray:
    """mel [n, n_mels] -> its frames [offset, offset + frames) (offset drawn from rng),
    or the whole mel when n <= frames."""
    n = mel.shape[0]
    if n <= frames:
        return mel
    offset = int(rng.integers(n - frames + 1))
    return mel[offset : offset + frames]
