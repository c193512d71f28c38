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

Memory: the grouping is two int32 arrays over the items (8 bytes a clip: 80 MB
for 10 M clips), built once per producer from the index's speakers when
features.reference is on, and nothing otherwise.
"""

from __future__ import annotations

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.dataset import DatasetIndex


class SpeakerClips:
    """Items grouped by speaker: which other clips a speaker has."""

    def __init__(self, index: DatasetIndex) -> None:
        names = [e.speaker for e in index.entries]
        _, codes = np.unique(np.asarray(names, dtype=object), return_inverse=True)
        self.code = codes.astype(np.int32)  # item -> speaker code
        self.order = np.argsort(self.code, kind="stable").astype(np.int32)  # items by speaker
        counts = np.bincount(self.code, minlength=int(self.code.max(initial=-1)) + 1)
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
