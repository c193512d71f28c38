"""The prosody pass of preparation: the per-speaker prosody statistics (the table:
shared/run/prosody_table.py), when features.pitch_norm asks (`ringfeed prepare`), or
alone (`ringfeed stats CONFIG`).

Each clip is read and decoded as a producer decodes it (read_clip: its file, segment,
tar or Parquet member; cut to the slot: producer/features/mel.py fit_length), its pitch
and energy computed as the sample fields are (producer/features/prosody.py pitch,
producer/features/mel.py log_mel_energy), and its moments summed in float64: log-f0
over voiced frames, energy over every frame. A clip that does not decode counts in no
speaker's moments (the table says how many). Chunks of CHUNK items go to a process per
core (producer/prepare/passes.py: progress lines, resumable), and what is done is saved
beside the table (``prosody-<key>.partial.npz``), so an interrupted pass resumes where
it stopped.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.producer.audio.decode import load_clip
from ringfeed.producer.features.mel import fit_length, log_mel_energy
from ringfeed.producer.features.prosody import PROSODY_VERSION, pitch
from ringfeed.producer.prepare.passes import Pass, run_pass, save_partial
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.clips import ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.open import open_prepared
from ringfeed.shared.run.prosody_table import (
    keep_table,
    moments,
    read_table,
    table_key,
    table_path,
)

log = logging.getLogger(__name__)

CHUNK = 32
N_SUMS = 7  # shared/run/prosody_table.py moments: the order of a clip's sums


def clip_sums(entry: Entry, cfg: Config, clips: ClipReader) -> np.ndarray:
    """float64 [N_SUMS] of one clip; SkipSample when it does not read or decode."""
    wave, _ = load_clip(clips, entry, cfg)
    wave, _ = fit_length(wave, cfg, entry.audio_path)
    _, energy = log_mel_energy(wave, cfg)
    f0, _ = pitch(wave, len(energy), cfg)
    log_f0 = np.log(f0[f0 > 0].astype(np.float64))
    e = energy.astype(np.float64)
    return np.array(
        [
            log_f0.sum(),
            np.square(log_f0).sum(),
            len(log_f0),
            e.sum(),
            np.square(e).sum(),
            len(e),
            1.0,
        ]
    )


class _Part:
    """A pass process's state (one per process): its config, index and clip reader."""

    cfg: Config
    index: CorpusIndex
    clips: ClipReader


def _start(cfg: Config) -> None:
    _Part.cfg, _Part.index, _Part.clips = cfg, open_prepared(cfg), ClipReader(cfg)


def _chunk(items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(items, their sums [len, N_SUMS]: zeros for a clip that does not decode)."""
    out = np.zeros((len(items), N_SUMS), np.float64)
    for k, item in enumerate(items):
        try:
            out[k] = clip_sums(_Part.index.entry(int(item)), _Part.cfg, _Part.clips)
        except SkipSample:
            continue  # counted in the table's "skipped": a clip that trains nobody's pitch
    return items, out


class _Sums:
    """The pass's merged state: every clip's sums, the clips done, the partial file."""

    def __init__(self, path: Path, n_items: int) -> None:
        self.path, self.saving = path, True
        self.sums, self.done = np.zeros((n_items, N_SUMS), np.float64), np.zeros(n_items, bool)
        try:
            with np.load(path) as saved:
                if saved["sums"].shape == self.sums.shape and saved["done"].shape == (n_items,):
                    self.sums[:], self.done[:] = saved["sums"], saved["done"]
                    log.info(
                        "prosody statistics: resuming, %d of %d clips done",
                        self.done.sum(),
                        n_items,
                    )
        except (OSError, ValueError, KeyError):
            pass

    def merge(self, result: tuple[np.ndarray, np.ndarray]) -> None:
        items, sums = result
        self.sums[items], self.done[items] = sums, True

    def save(self) -> None:
        if not self.saving:
            return
        self.saving = save_partial(self.path, {"sums": self.sums, "done": self.done})


def current_table(cfg: Config, index: CorpusIndex) -> dict[str, Any] | None:
    """The corpus's table when it is current (its key, this pitch estimator), or None."""
    table = read_table(table_path(cfg, index.digest))
    return table if table is not None and table.get("prosody_version") == PROSODY_VERSION else None


def compute_table(cfg: Config, index: CorpusIndex, workers: int = 0) -> tuple[Path, dict[str, Any]]:
    """The prosody table of cfg's corpus: read when current, else computed (resuming a
    pass that stopped) and kept (in memory on a full disk). workers: processes (0: one
    per core)."""
    path = table_path(cfg, index.digest)
    table = current_table(cfg, index)
    if table is not None:
        return path, table
    state = _Sums(path.with_name(path.name.replace(".json", ".partial.npz")), index.n_items)
    todo = np.flatnonzero(~state.done)
    t0 = time.monotonic()
    run_pass(
        Pass("prosody statistics", _start, _chunk, state.merge, state.save, CHUNK, 64),
        cfg,
        todo,
        workers,
    )
    table = tabulate(cfg, index, state.sums)
    where = keep_table(path, table)
    state.path.unlink(missing_ok=True)
    log.info(
        "prosody statistics: %d clips in %.1f s -> %s", len(todo), time.monotonic() - t0, where
    )
    return where, table


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
