"""The length table: each item's mel frames and token count, for length buckets.

Measured by the producer side (producer/prepare/lengths.py, ``ringfeed lengths CONFIG``):
mel frames from each audio file's header (never a decode) as an upper bound of
what the producer will compute, tokens from the same text encoder the producers
use. Read by the stager (consumer/stager/plan/buckets.py) to plan batches by length.

It lives in the corpus index (shared/corpus/index.py: arrays frames and text,
mapped by the stager like the rest; a synthetic corpus computes it), tagged with
a key that hashes every setting a length depends on (corpus path and format,
sample rate, hop, text settings, slot size): a changed setting measures every
item again, and an index rebuilt for a changed metadata file keeps the lengths
of the items it had (by id), so only new items are measured (:func:`load_lengths`
says which). No file is statted to decide: a clip whose audio changed under the
same metadata is caught by the stager when its mel comes out longer than its
bucket (consumer/stager/intake.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ringfeed.shared.config import Config

if TYPE_CHECKING:
    from ringfeed.shared.corpus.index import CorpusIndex

# Frames of an item whose length could not be read from its header: the producer may
# still decode it (another decoder), so it goes to the largest bucket, which fits all.
UNKNOWN = -1
# Frames of an item not measured yet (in the corpus index: a new item, or a new index).
NOT_MEASURED = -2


@dataclass(frozen=True)
class Lengths:
    """frames: int32 [n_items] mel frames (upper bound; UNKNOWN if unreadable);
    text: int32 [n_items] tokens (0 if the text is unusable: the producer skips it)."""

    frames: np.ndarray
    text: np.ndarray


def lengths_key(cfg: Config) -> str:
    """A hash of every setting an item's lengths depend on."""
    d, a, f = cfg.data, cfg.audio, cfg.features
    settings = {
        "data": [
            str(Path(d.path).absolute()),
            d.format,
            d.text_column,
            d.synthetic_items,
            d.synthetic_lengths,
        ],
        "audio": [a.sample_rate],
        "features": [f.hop_length, f.max_frames, f.device],
        "text": cfg.to_dict()["text"],
        # 3: producer/text/normalize.py NORMALIZER_VERSION 4 (years, ordinals, decimals, money
        # as said) changed token counts; bump it with every text rule that changes them.
        "version": 3,
    }
    return hashlib.blake2b(json.dumps(settings).encode(), digest_size=8).hexdigest()


def load_lengths(cfg: Config, index: CorpusIndex) -> tuple[Lengths, np.ndarray]:
    """(the lengths of the items measured under this config's key, UNKNOWN and 0 for the
    others; bool [n_items] of the items that need measuring)."""
    n = index.n_items
    stored = index.stored_lengths(lengths_key(cfg))
    if stored is None:
        return Lengths(np.full(n, UNKNOWN, np.int32), np.zeros(n, np.int32)), np.ones(n, bool)
    frames, text = stored
    stale = frames == NOT_MEASURED
    frames[stale] = UNKNOWN
    return Lengths(frames, text), stale


def save_lengths(cfg: Config, index: CorpusIndex, lengths: Lengths) -> str:
    """Keep the measured lengths in the index; returns where."""
    index.save_lengths(lengths.frames, lengths.text, lengths_key(cfg))
    return index.location
