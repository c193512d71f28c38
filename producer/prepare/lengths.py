"""Measures the length table (shared/corpus/lengths.py): `ringfeed lengths CONFIG`.

Per item: mel frames from the audio file's header (soundfile.info, no decode),
as the producer would compute them after resampling (an upper bound: trimming
only shortens), and the token count from the producers' own text encoder.
Items already measured with the same settings and an unchanged file are
reused. 13,100 LJSpeech items take a few seconds; progress is logged every
PROGRESS_S. The stager runs this as a subprocess when it needs buckets and the
table is missing or stale.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from ringfeed.producer.audio.decode import read_header
from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text.encoder import TextEncoder
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.clips import ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.lengths import (
    UNKNOWN,
    Lengths,
    load_lengths,
    save_lengths,
)
from ringfeed.shared.corpus.open import open_corpus

log = logging.getLogger(__name__)

PROGRESS_S = 2.0


def header_frames(clips: ClipReader, entry: Entry, cfg: Config) -> int:
    """Mel frames of the entry's clip (or its segment) at audio.sample_rate, from its
    header (shared/corpus/clips.py read_clip; a member read whole, as libsndfile takes a
    WAV's length from its header only while the bytes hold it: never a decode); UNKNOWN
    if unreadable."""
    try:
        with clips.read_clip(entry) as clip:
            info = read_header(clip)
    except Exception:  # noqa: BLE001 - any reader failure means "not known from the header"
        return UNKNOWN
    if info.frames <= 0 or info.samplerate <= 0:
        return UNKNOWN
    frames, segment = info.frames, entry.segment
    if segment is not None:
        start = round(segment[0] * info.samplerate)
        frames = max(0, frames - start)
        if segment[1]:  # at least one sample: a duration that rounds to 0 is not "to the end"
            frames = min(frames, max(1, round(segment[1] * info.samplerate)))
        if frames <= 0:
            return UNKNOWN
    n = math.ceil(frames * cfg.audio.sample_rate / info.samplerate)
    return 1 + n // cfg.features.hop_length


def text_tokens(encoder: TextEncoder, text: str, language: str = "en") -> int:
    """Tokens of the text as the producers encode it; 0 for a text they would skip."""
    try:
        tokens, _ = encoder.encode(text, "", language)
    except SkipSample:
        return 0  # the producer will skip it too
    except Exception:  # noqa: BLE001 - costs this text only (docs/design.md#contract-9)
        log.exception("length table: cannot encode a text in %r; counted as 0 tokens",
                      language)  # fmt: skip
        return 0
    return len(tokens)


def measure_lengths(cfg: Config, index: CorpusIndex | None = None) -> Lengths:
    """Measure the items the index's length table lacks, keep them in it, return the
    whole table."""
    index = index if index is not None else open_corpus(cfg)
    lengths, stale = load_lengths(cfg, index)
    if not stale.any():
        return lengths
    frames, text = lengths.frames, lengths.text  # the current items are kept as they are
    todo = np.flatnonzero(stale)
    log.info("length table: measuring %d items (%d reused) -> %s",
             len(todo), index.n_items - len(todo), index.location)  # fmt: skip
    encoder = TextEncoder(cfg)
    clips = ClipReader(cfg)
    t0 = last = time.monotonic()
    for done, i in enumerate(todo, 1):
        entry = index.entry(int(i))
        frames[i] = header_frames(clips, entry, cfg)
        text[i] = text_tokens(encoder, entry.text, entry.language)
        if time.monotonic() - last > PROGRESS_S:
            last = time.monotonic()
            share = 100 * done / len(todo)
            log.info("length table: %d/%d items (%.0f%%)", done, len(todo), share)
    encoder.close()
    skipped = int((text[todo] == 0).sum())
    if skipped:
        log.warning("length table: %d texts the producers will skip (0 tokens)", skipped)
    save_lengths(cfg, index, lengths)
    log.info("length table: %d items in %.1f s", len(todo), time.monotonic() - t0)
    return lengths
