"""The text and header pass of preparation: the length table (shared/corpus/lengths.py)
and the vocabulary (producer/prepare/vocabulary.py), by one read of every text.

Per item: mel frames from its clip's header (read_clip, shared/corpus/clips.py; no
decode), as the producer would compute them after resampling (an upper bound:
trimming only shortens), and its tokens from the producers' own text encoder; with
the vocabulary, every character of its cleaned text (or phonemes). Items already
measured with the same settings and an unchanged metadata line are reused (the index
keeps their lengths by id); the vocabulary is counted over every text whenever it is
not current, through the text caches. A process per core (producer/prepare/passes.py):
13,100 LJSpeech items take a few seconds; an interrupted pass resumes from its partial
file beside the index (``lengths-<key>.partial.npz``). Called by `ringfeed prepare`
(producer/prepare/prepare.py); `ringfeed lengths` and `ringfeed vocab` run it alone.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.producer.audio.decode import read_header
from ringfeed.producer.prepare.passes import Pass, run_pass, save_partial
from ringfeed.producer.prepare.vocabulary import Tally
from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text.encoder import TextEncoder
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.clips import ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.index import CorpusIndex, index_path
from ringfeed.shared.corpus.lengths import UNKNOWN, Lengths, lengths_key, load_lengths, save_lengths
from ringfeed.shared.corpus.open import open_prepared

log = logging.getLogger(__name__)

# Items a task of the pass; fewer items to do than MIN_PARALLEL are done in this process:
# ~0.2 ms an item (a header read, a text cleaned and cached), against ~1 s of imports a
# spawned process, so a second process pays off past ~20,000 items on 2 cores.
CHUNK = 256
MIN_PARALLEL = 20_000


def header_frames(clips: ClipReader, entry: Entry, cfg: Config) -> int:
    """Mel frames of the entry's clip (or its segment) at audio.sample_rate, from its
    header (read_clip; a member read whole, as libsndfile takes a WAV's length from its
    header only while the bytes hold it: never a decode); UNKNOWN if unreadable."""
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
        log.exception("length table: cannot encode a text in %r; counted as 0 tokens", language)
        return 0
    return len(tokens)


# ------------------------------------------------------------ one process's part
class _Part:
    """A pass process's state (set once by _start): its config, index, encoder, reader,
    which items to measure and whether to count characters."""

    cfg: Config
    index: CorpusIndex
    encoder: TextEncoder
    clips: ClipReader
    measure: np.ndarray
    count: bool


def _start(
    cfg: Config,
    index: CorpusIndex | None = None,
    measure: np.ndarray | None = None,
    count: bool = False,
) -> None:
    _Part.cfg, _Part.index = cfg, index if index is not None else open_prepared(cfg)
    _Part.encoder, _Part.clips = TextEncoder(cfg), ClipReader(cfg)
    if measure is not None:
        _Part.measure, _Part.count = measure, count


def _chunk(items: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, Tally | None]:
    """(items, their frames, their tokens, the characters of their texts when counted)."""
    p = _Part
    frames = np.full(len(items), UNKNOWN, np.int32)
    text = np.zeros(len(items), np.int32)
    tally = Tally() if p.count else None
    for k, item in enumerate(items.tolist()):
        entry = p.index.entry(item)
        if p.measure[item]:
            frames[k] = header_frames(p.clips, entry, p.cfg)
            text[k] = text_tokens(p.encoder, entry.text, entry.language)
        if tally is not None:
            tally.add(p.encoder, item, entry)
    p.encoder.flush()  # the producers' first epoch reads these texts from the text cache
    return items, frames, text, tally


# ------------------------------------------------------------ the pass
@dataclass
class TextPass:
    """The pass's merged state: the table being filled, the items done, the tally."""

    lengths: Lengths
    measure: np.ndarray  # bool [n_items]: items whose lengths are measured
    done: np.ndarray  # bool [n_items]
    tally: Tally | None
    partial: Path
    saving: bool = field(default=True)

    def merge(self, result: tuple[np.ndarray, np.ndarray, np.ndarray, Tally | None]) -> None:
        items, frames, text, tally = result
        measured = self.measure[items]
        self.lengths.frames[items[measured]] = frames[measured]
        self.lengths.text[items[measured]] = text[measured]
        self.done[items] = True
        if self.tally is not None and tally is not None:
            self.tally.merge(tally)

    def save(self) -> None:
        """The partial file (a full disk stops the saving, said once: the pass goes on)."""
        if not self.saving:
            return
        tally = json.dumps(self.tally.to_dict() if self.tally is not None else None)
        arrays = {
            "frames": self.lengths.frames,
            "text": self.lengths.text,
            "done": self.done,
            "measure": self.measure,
            "tally": np.array(tally),
        }
        self.saving = save_partial(self.partial, arrays)

    def resume(self) -> None:
        """What an earlier pass of the same items saved, taken back."""
        try:
            with np.load(self.partial) as saved:
                same = saved["done"].shape == self.done.shape and np.array_equal(
                    saved["measure"], self.measure
                )
                tally = json.loads(str(saved["tally"]))
                if not same or (tally is None) != (self.tally is None):
                    return
                self.lengths.frames[:], self.lengths.text[:] = saved["frames"], saved["text"]
                self.done[:] = saved["done"]
        except (OSError, ValueError, KeyError):
            return
        if tally is not None:
            self.tally = Tally.from_dict(tally)
        log.info("length table: resuming, %d of %d items done", self.done.sum(), len(self.done))


def measure_lengths(
    cfg: Config,
    index: CorpusIndex,
    count: bool = False,
    workers: int = 0,
) -> tuple[Lengths, Tally | None, Path]:
    """Measure the items the index's length table lacks, keep them in it (or its memory
    copy: shared/corpus/memory_copies.py); with count, tally every text's characters too.
    Returns (the whole table, the tally or None, where the index is)."""
    lengths, stale = load_lengths(cfg, index)
    if not stale.any() and not count:
        return lengths, None, Path(index.location)
    home = index_path(cfg)
    state = TextPass(
        lengths,
        stale,
        np.zeros(index.n_items, bool),
        Tally() if count else None,
        home.with_name(f"lengths-{lengths_key(cfg)}-{index.digest[:16]}.partial.npz"),
    )
    state.resume()
    todo = np.flatnonzero(~state.done & (stale | count))
    log.info(
        "length table: measuring %d items (%d reused)%s -> %s",
        int(stale.sum()),
        index.n_items - int(stale.sum()),
        ", counting characters" if count else "",
        index.location,
    )
    t0 = time.monotonic()
    in_memory = index.location == "(in memory)"  # no other process can map it
    start = (lambda c: _start(c, index, stale, count)) if in_memory else _starter(stale, count)
    run_pass(
        Pass("length table", start, _chunk, state.merge, state.save, CHUNK, MIN_PARALLEL),
        cfg,
        todo,
        1 if in_memory else workers,
    )
    skipped = int((lengths.text[stale] == 0).sum())
    if skipped:
        log.warning("length table: %d texts the producers will skip (0 tokens)", skipped)
    where = save_lengths(cfg, index, lengths) if stale.any() else index.location
    state.partial.unlink(missing_ok=True)
    log.info("length table: %d items in %.1f s -> %s", len(todo), time.monotonic() - t0, where)
    return lengths, state.tally, Path(where)


def _starter(measure: np.ndarray, count: bool) -> Any:
    """A process's start for the pass: its part of the work's settings (pickled once)."""
    return _Starter(measure, count)


@dataclass(frozen=True)
class _Starter:
    measure: np.ndarray
    count: bool

    def __call__(self, cfg: Config) -> None:
        _start(cfg, None, self.measure, self.count)
