"""The length manifest: each item's mel frames and token count, for length buckets.

Built by the producer side (producer/manifest.py, ``ringfeed manifest CONFIG``):
mel frames from each audio file's header (never a decode) as an upper bound of
what the producer will compute, tokens from the same text encoder the producers
use. Read by the stager (consumer/stager/buckets.py) to plan batches by length.

It lives in the corpus index (shared/corpus_index.py: arrays frames and text,
mapped by the stager like the rest), tagged with a key that hashes every setting
a length depends on (dataset path and format, sample rate, hop, text settings,
slot size): a changed setting measures every item again, and an index rebuilt
for a changed metadata file keeps the lengths of the items it had (by id), so
only new items are measured (:func:`load_manifest` says which). No file is
statted to decide: a clip whose audio changed under the same metadata is caught
by the stager when its mel comes out longer than its bucket (intake.py).

Synthetic data and an index held in memory (a cache folder that cannot be
written) keep the older form, ``lengths-<key>.npz`` beside the feature cache,
with each item's audio file's size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.dataset import DatasetIndex

# Frames of an item whose length could not be read from its header: the producer may
# still decode it (another decoder), so it goes to the largest bucket, which fits all.
UNKNOWN = -1
# Frames of an item not measured yet (in the corpus index: a new item, or a new index).
NOT_MEASURED = -2


@dataclass(frozen=True)
class Manifest:
    """frames: int32 [n_items] mel frames (upper bound; UNKNOWN if unreadable);
    text: int32 [n_items] tokens (0 if the text is unusable: the producer skips it)."""

    frames: np.ndarray
    text: np.ndarray


def settings_key(cfg: Config) -> str:
    """A hash of every setting an item's lengths depend on."""
    d, a, f = cfg.data, cfg.audio, cfg.features
    settings = {
        "data": [str(Path(d.path).absolute()), d.format, d.text_column, d.synthetic_items,
                 d.synthetic_lengths],
        "audio": [a.sample_rate],
        "features": [f.hop_length, f.max_frames, f.device],
        "text": cfg.to_dict()["text"],
        # 2: producer/normalize.py NORMALIZER_VERSION 3 (clock times, phone numbers) changed
        # token counts; bump it with every text rule that changes them.
        "version": 2,
    }  # fmt: skip
    return hashlib.blake2b(json.dumps(settings).encode(), digest_size=8).hexdigest()


def manifest_path(cfg: Config) -> Path:
    return Path(cfg.features.cache_dir) / f"lengths-{settings_key(cfg)}.npz"


def file_stamps(index: DatasetIndex) -> np.ndarray:
    """int64 [n_items, 2]: (size, mtime_ns) of each item's audio file; -1 if missing."""
    stamps = np.full((index.n_items, 2), -1, np.int64)
    for i, entry in enumerate(index.entries):
        try:
            st = os.stat(entry.audio_path)
        except OSError:
            continue
        stamps[i] = st.st_size, st.st_mtime_ns
    return stamps


def load_manifest(cfg: Config, index: DatasetIndex) -> tuple[Manifest, np.ndarray]:
    """(the lengths on disk of the items that are current, UNKNOWN and 0 for the others;
    bool [n_items] of the items that need measuring). The manifest is usable as it is
    only when nothing is stale; a missing or unreadable file makes every item stale."""
    if hasattr(index, "lengths_key"):  # the mapped corpus index
        return _indexed_lengths(cfg, index)
    stale = np.ones(index.n_items, bool)
    out = Manifest(np.full(index.n_items, UNKNOWN, np.int32), np.zeros(index.n_items, np.int32))
    try:
        with np.load(manifest_path(cfg), allow_pickle=False) as z:
            ids, stamps = z["ids"], z["stamps"]
            frames, text = z["frames"], z["text"]
    except (OSError, KeyError, ValueError):
        return out, stale
    known = {item_id: k for k, item_id in enumerate(ids.tolist())}
    now = file_stamps(index)
    for i in range(index.n_items):
        k = known.get(index.item_id(i))
        if k is not None and (stamps[k] == now[i]).all():
            stale[i] = False
            out.frames[i], out.text[i] = frames[k], text[k]
    return out, stale


def save_manifest(cfg: Config, index: DatasetIndex, manifest: Manifest) -> Path:
    """Write atomically (a reader never sees half a file); returns the path."""
    if hasattr(index, "lengths_key"):
        from ringfeed.shared.corpus_index import save_lengths

        save_lengths(index, manifest.frames, manifest.text, settings_key(cfg))
        return index.file.path
    path = manifest_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.npz")
    np.savez(
        tmp,
        ids=np.array([index.item_id(i) for i in range(index.n_items)], dtype=str),
        stamps=file_stamps(index),
        frames=manifest.frames.astype(np.int32),
        text=manifest.text.astype(np.int32),
    )
    os.replace(tmp, path)
    return path


def _indexed_lengths(cfg: Config, index: Any) -> tuple[Manifest, np.ndarray]:
    """load_manifest of a mapped corpus index: its newest file's lengths (`ringfeed
    manifest` writes the index again beside the one this process mapped)."""
    from ringfeed.shared.corpus_index import MappedIndex

    path = index.file.path
    try:
        newest = MappedIndex(path)
    except (OSError, ValueError, KeyError):
        newest = index
    if newest.digest != index.digest:  # the corpus itself changed: not this run's lengths
        newest = index
    n = index.n_items
    if newest.lengths_key != settings_key(cfg):
        return Manifest(np.full(n, UNKNOWN, np.int32), np.zeros(n, np.int32)), np.ones(n, bool)
    frames = np.array(newest.frames, np.int32)
    stale = frames == NOT_MEASURED
    frames[stale] = UNKNOWN
    return Manifest(frames, np.array(newest.text, np.int32)), stale
