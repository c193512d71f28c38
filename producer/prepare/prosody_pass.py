"""The one pass over the corpus for the per-speaker prosody statistics: `ringfeed stats
CONFIG` (the table: shared/run/prosody_table.py).

Each clip is decoded as a producer decodes it (its segment, its tar or Parquet member,
cut to the slot: producer/features/mel.py fit_length), its pitch and energy computed as
the sample fields are (producer/features/prosody.py pitch, producer/features/mel.py
log_mel_energy), and its moments summed in float64: log-f0 over voiced frames, energy
over every frame. A clip that does not decode counts in no speaker's moments (the
table says how many). Chunks of CHUNK items go to `workers` spawned processes, each
with its math libraries on producers.math_threads; what is done is saved beside the
table every SAVE_S (``prosody-<key>.partial.npz``), so an interrupted pass resumes
where it stopped. Progress is logged every PROGRESS_S.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.producer.audio.decode import load_clip
from ringfeed.producer.features.mel import fit_length, log_mel_energy
from ringfeed.producer.features.prosody import PROSODY_VERSION, pitch
from ringfeed.producer.sample import SkipSample
from ringfeed.producer.threads import pin_math_threads
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.clips import ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.prosody_table import (
    moments,
    read_table,
    table_key,
    table_path,
    write_table,
)

log = logging.getLogger(__name__)

CHUNK = 32
SAVE_S = 10.0
PROGRESS_S = 2.0
N_SUMS = 7  # shared/run/prosody_table.py moments: the order of a clip's sums


def clip_sums(entry: Entry, cfg: Config, clips: ClipReader) -> np.ndarray:
    """float64 [N_SUMS] of one clip; SkipSample when it does not read or decode."""
    wave, _ = load_clip(clips, entry, cfg)
    wave, _ = fit_length(wave, cfg, entry.audio_path)
    _, energy = log_mel_energy(wave, cfg)
    f0, _ = pitch(wave, len(energy), cfg)
    log_f0 = np.log(f0[f0 > 0].astype(np.float64))
    e = energy.astype(np.float64)
    return np.array([log_f0.sum(), np.square(log_f0).sum(), len(log_f0), e.sum(),
                     np.square(e).sum(), len(e), 1.0])  # fmt: skip


class _Worker:
    """A pass worker's state (one per process): the index, a clip reader."""

    cfg: Config
    index: CorpusIndex
    clips: ClipReader


def _start(cfg: Config) -> None:
    pin_math_threads(cfg.producers.math_threads)
    _Worker.cfg, _Worker.index = cfg, open_corpus(cfg)
    _Worker.clips = ClipReader(cfg)


def _chunk(items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(items, their sums [len, N_SUMS]: zeros for a clip that does not decode)."""
    out = np.zeros((len(items), N_SUMS), np.float64)
    for k, item in enumerate(items):
        try:
            out[k] = clip_sums(_Worker.index.entry(int(item)), _Worker.cfg, _Worker.clips)
        except SkipSample:
            continue  # counted in the table's "skipped": a clip that trains nobody's pitch
    return items, out


def _load_partial(path: Path, n_items: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path) as saved:
            sums, done = saved["sums"], saved["done"]
        if sums.shape == (n_items, N_SUMS) and done.shape == (n_items,):
            log.info("prosody statistics: resuming, %d of %d clips done", done.sum(), n_items)
            return sums.copy(), done.copy()
    except (OSError, ValueError, KeyError):
        pass
    return np.zeros((n_items, N_SUMS), np.float64), np.zeros(n_items, bool)


def _save_partial(path: Path, sums: np.ndarray, done: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}")
    with open(tmp, "wb") as f:
        np.savez(f, sums=sums, done=done)
    tmp.replace(path)


def _results(cfg: Config, chunks: list[np.ndarray], workers: int) -> Iterator[tuple]:
    if workers <= 1:  # in this process (tests, one core): no spawn
        _start(cfg)
        yield from map(_chunk, chunks)
        return
    with mp.get_context("spawn").Pool(workers, _start, (cfg,)) as pool:
        yield from pool.imap_unordered(_chunk, chunks)


def compute_table(cfg: Config, workers: int = 0) -> tuple[Path, dict[str, Any]]:
    """The prosody table of cfg's corpus: read when current, else computed (resuming a
    pass that stopped) and written. workers: processes (0: producers.workers)."""
    index = open_corpus(cfg)
    path = table_path(cfg, index.digest)
    table = read_table(path)
    if table is not None and table.get("prosody_version") == PROSODY_VERSION:
        return path, table
    partial = path.with_name(path.name.replace(".json", ".partial.npz"))
    sums, done = _load_partial(partial, index.n_items)
    todo = np.flatnonzero(~done)
    chunks = [todo[k : k + CHUNK] for k in range(0, len(todo), CHUNK)]
    t0 = last_log = last_save = time.monotonic()
    try:
        for items, got in _results(cfg, chunks, workers or cfg.producers.workers):
            sums[items], done[items] = got, True
            now = time.monotonic()
            if now - last_log > PROGRESS_S:
                last_log = now
                rate = (done.sum() - index.n_items + len(todo)) / (now - t0)
                log.info("prosody statistics: %d/%d clips, %.0f clips/s", done.sum(),
                         index.n_items, rate)  # fmt: skip
            if now - last_save > SAVE_S:
                last_save = now
                _save_partial(partial, sums, done)
    finally:
        if not done.all():
            _save_partial(partial, sums, done)
    table = tabulate(cfg, index, sums)
    write_table(path, table)
    partial.unlink(missing_ok=True)
    log.info("prosody statistics: %d clips in %.1f s -> %s", len(todo), time.monotonic() - t0, path)
    return path, table


def tabulate(cfg: Config, index: CorpusIndex, sums: np.ndarray) -> dict[str, Any]:
    """The table of per-clip sums [n_items, N_SUMS]: per speaker and over the corpus."""
    speaker_ids = np.asarray(index.speaker_ids)
    per = np.zeros((len(index.speakers), N_SUMS), np.float64)
    np.add.at(per, speaker_ids, sums)
    return {
        "prosody_version": PROSODY_VERSION,
        "key": table_key(cfg, index.digest),
        "corpus": index.digest,
        "skipped": int((sums[:, 6] == 0).sum()),
        "global": moments(sums.sum(axis=0)),
        "speakers": {name: moments(per[k]) for k, name in enumerate(index.speakers)},
    }
