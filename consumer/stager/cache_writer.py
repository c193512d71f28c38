"""The mels the stager computes, kept in this host's feature cache off its loop, so the
next epoch of a run with stager mels (features.device: stager) skips the FFT as a run
with producer mels does.

A part of the stager (consumer/stager/stager.py) that the intake and the assembly
share. The intake notes the key a local producer sent with each waveform row (its
READY's cache_keys: the clip's key as the producer looked it up before it read the
clip), by the row's spare place and generation: the stager cannot take the key itself,
as a stat later than the producer's read could name an edited file by the old clip's
mel. The assembly hands each batch's mels of such rows here, and a thread of this
part's appends them to the cache (shared/corpus/feature_cache.py: a writer of its own,
one shard pair, no index read). Only local producers' keys are noted: a remote peer's
host has a cache of its own, and what a remote peer claims must never be kept here
(a liar's mel would be every later run's).

Never in the stager's way: the queue holds MAX_QUEUED batches, and a batch that finds
it full is not kept; nor is any mel once the cache could not be opened or stopped
writing (a full disk: said once, by the cache). close() waits CLOSE_WAIT_S at most for
what is queued; what is left is not kept. All of it counted: mels_kept, mels_not_kept.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.feature_cache import FeatureCache
from ringfeed.shared.run.process import POLL_S
from ringfeed.shared.wire.bounds import CACHE_KEY_BYTES

log = logging.getLogger(__name__)

# Batches of mels waiting for the disk: a batch is at most stager.batch_frames x n_mels
# float32 (8 MiB at 32 x 800 x 80), so 64 MiB at most; a disk this far behind loses mels,
# never the stager's time.
MAX_QUEUED = 8
# At the stager's exit, how long the thread may take to write what is queued, seconds.
CLOSE_WAIT_S = 5.0
# ... when the run was stopped by a signal: the launcher kills what is still running
# RINGFEED_GRACE_S (8 s) after its SIGTERM, and these mels are only the cache's.
STOPPED_WAIT_S = 1.0

# One batch's mels to keep: keys uint8 [n, 16], the clips' marks [n], mels float32
# [n, frames, n_mels], their frames [n].
Job = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class CacheWriter:
    """The stager's mels into this host's feature cache (module docstring)."""

    def __init__(self, *, cfg: Config, n_places: int) -> None:
        """n_places: the spare ring's slots, where every waveform row lies."""
        self.cfg = cfg
        self.keys = np.zeros((n_places, CACHE_KEY_BYTES), np.uint8)
        self.generations = np.full(n_places, -1, np.int64)  # -1: no key noted there
        self.clip_marks = np.zeros(n_places, np.int64)
        self.queue: queue.Queue[Job] = queue.Queue(MAX_QUEUED)
        self.stopping = threading.Event()
        self.stop_by = float("inf")  # close(): the thread leaves what is queued after it
        self.off = False  # the cache could not be opened, or it stopped writing
        # Each counter has one writer: the stager's loop (dropped), the thread (the rest).
        self.dropped = self.kept = self.failed = 0
        self.thread = threading.Thread(target=self._run, name="cache-writer", daemon=True)
        self.thread.start()

    def noted(
        self,
        places: np.ndarray,
        generation: int,
        keys: bytes,
        clip_marks: list[int],
        rows: np.ndarray,
    ) -> None:
        """A local producer's READY for spare places `places` (int [n]) of `generation`:
        the mels of rows (bool [n]: waveforms it still held) are to be kept under keys
        (CACHE_KEY_BYTES each, zeros: none) with the clips' marks (clip_marks [n])."""
        k = np.frombuffer(keys, np.uint8).reshape(-1, CACHE_KEY_BYTES)
        rows = rows & np.logical_or.reduce(k != 0, axis=1)
        at = places[rows]
        self.keys[at] = k[rows]
        self.generations[at] = generation
        self.clip_marks[at] = np.asarray(clip_marks, np.int64)[rows]

    def keep(
        self, places: np.ndarray, generations: np.ndarray, mel: np.ndarray, mel_lens: np.ndarray
    ) -> None:
        """Mels the assembly computed, of rows from spare places `places` (int [n]; -1: a
        row from no spare) accepted under `generations` [n]: mel float32 [n, frames,
        n_mels], mel_lens [n]. Those whose place has a key noted under that generation
        are queued (copied); never blocks."""
        rows = (places >= 0).nonzero()[0]
        rows = rows[self.generations[places[rows]] == generations[rows]]
        if not len(rows):
            return
        at = places[rows]
        self.generations[at] = -1  # kept once
        if self.off:
            self.dropped += len(rows)
            return
        job = (self.keys[at], self.clip_marks[at], mel[rows], mel_lens[rows].copy())
        try:
            self.queue.put_nowait(job)
        except queue.Full:  # the disk is behind: these mels are computed again next epoch
            self.dropped += len(rows)

    def counters(self) -> dict[str, int]:
        """mels_kept (written), mels_not_kept (the queue full, the cache off or failing,
        left at exit)."""
        return {"mels_kept": self.kept, "mels_not_kept": self.dropped + self.failed}

    def close(self, wait_s: float | None = None) -> None:
        """Write what is queued, for wait_s (CLOSE_WAIT_S) at most, and stop the thread
        (again: a no-op)."""
        wait_s = CLOSE_WAIT_S if wait_s is None else wait_s
        if not self.stopping.is_set():
            self.stop_by = time.monotonic() + wait_s
            self.stopping.set()
        self.thread.join(wait_s + POLL_S)
        if self.thread.is_alive():
            log.warning(
                "the feature cache took over %.0f s to keep the stager's last mels: the "
                "rest are not kept",
                wait_s,
            )

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        """Until stopping and the queue is empty, or stop_by."""
        try:
            cache = FeatureCache(self.cfg, reads=False)
        except OSError as exc:  # a cache folder it cannot make: the run goes on without
            log.warning("the stager keeps no mels in the feature cache: %s", exc)
            self.off = True
            cache = None
        try:
            while not (self.stopping.is_set() and time.monotonic() > self.stop_by):
                try:
                    job = self.queue.get(timeout=POLL_S)
                except queue.Empty:
                    if self.stopping.is_set():
                        return
                    continue
                self._write(cache, job)
        except Exception:  # a cache's own bug costs the cache, never the run: said once
            log.exception("the stager's feature cache writer failed; it keeps no more mels")
            self.off = True
        finally:
            self.failed += sum(len(job[0]) for job in _drained(self.queue))
            if cache is not None:
                cache.close()

    def _write(self, cache: FeatureCache | None, job: Job) -> None:
        keys, marks, mels, lens = job
        for i in range(len(keys)):
            if cache is None or not cache.writing:
                self.off = True
                self.failed += len(keys) - i
                return
            try:
                if cache.put(keys[i].tobytes(), mels[i, : lens[i]], int(marks[i])):
                    self.kept += 1
                else:
                    self.failed += 1
            except OSError:  # a full or failing disk costs the cache, never the run: the
                self.failed += 1  # cache says so itself, once (feature_cache.py)
            except Exception:  # its own bug: this job's rest is not kept either (_run)
                self.failed += len(keys) - i
                raise


def _drained(q: queue.Queue[Job]) -> list[Job]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
