"""One pass of preparation over a corpus's items, in parallel, with progress, resumable.

Called by the passes of `ringfeed prepare` (the text and header pass,
producer/prepare/lengths.py; the prosody pass, producer/prepare/prosody_pass.py)::

    run_pass(Pass(...), cfg, todo, workers)

The items to do go in chunks to a process per core (spawned, each with its math
libraries on producers.math_threads and its own corpus index, mapped), their results
merged in this process as they come back (`merge`), in whatever order; a pass whose
result depends on that order is wrong. A progress line every PROGRESS_S says items
done, the rate and the time left. What is merged is saved every SAVE_S and when the pass
stops early (Ctrl-C, an error: `save`), so the pass run again does only what is left
(each pass keeps its own partial file). Fewer items than `min_parallel` are done in
this process: spawning costs ~1 s a process of imports.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.producer.process.threads import pin_math_threads
from ringfeed.shared.config import Config
from ringfeed.shared.memory.disk import disk_error, is_full

log = logging.getLogger(__name__)

PROGRESS_S = 2.0
SAVE_S = 10.0


@dataclass(frozen=True)
class Pass:
    """what: its name in progress lines; start(cfg): a process's set-up (module state,
    picklable); work(items) -> a chunk's result (a module-level function, picklable);
    merge(result): that result taken in; save(): what is merged, kept for a resume;
    chunk: items a task; min_parallel: fewer items are done in this process."""

    what: str
    start: Callable[[Config], None]
    work: Callable[[np.ndarray], Any]
    merge: Callable[[Any], None]
    save: Callable[[], None]
    chunk: int = 256
    min_parallel: int = 20_000


def save_partial(path: Path, arrays: dict[str, np.ndarray]) -> bool:
    """A pass's partial file, written whole (a temporary file, then renamed); False when
    the disk is full (said once, here: the pass goes on, but cannot resume if it stops),
    so that its caller stops saving. Any other OSError is raised."""
    tmp = path.with_name(f".{path.name}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if not is_full(exc):
            raise
        log.warning(
            "%s: the pass goes on, but cannot resume if it stops", disk_error(exc, path.parent)
        )
        return False
    return True


def host_cores() -> int:
    """The cores this process may run on: a pass's processes by default."""
    return len(os.sched_getaffinity(0))


def run_pass(p: Pass, cfg: Config, todo: np.ndarray, workers: int = 0) -> None:
    """p over the items `todo` (int64, any order), by `workers` processes (0: one per
    core); saved when it stops, finished or not."""
    if not len(todo):
        return
    workers = workers or host_cores()
    chunks = [todo[k : k + p.chunk] for k in range(0, len(todo), p.chunk)]
    t0 = last_log = last_save = time.monotonic()
    done = 0
    finished = False
    try:
        for result in _results(p, cfg, chunks, workers if len(todo) >= p.min_parallel else 1):
            p.merge(result)
            done += len(result[0])
            now = time.monotonic()
            if now - last_log > PROGRESS_S:
                last_log = now
                rate = done / (now - t0)
                log.info(
                    "%s: %d of %d items (%.0f%%), %.0f items/s, ~%.0f s left",
                    p.what,
                    done,
                    len(todo),
                    100 * done / len(todo),
                    rate,
                    (len(todo) - done) / max(rate, 1e-9),
                )
            if now - last_save > SAVE_S:
                last_save = now
                p.save()
        finished = True
    finally:
        if not finished:
            p.save()
            log.warning(
                "%s: stopped after %d of %d items; what is done is kept: run it again to go on",
                p.what,
                done,
                len(todo),
            )


def _results(p: Pass, cfg: Config, chunks: list[np.ndarray], workers: int) -> Iterator[Any]:
    if workers <= 1:
        p.start(cfg)
        yield from map(p.work, chunks)
        return
    with mp.get_context("spawn").Pool(workers, _start, (p.start, cfg)) as pool:
        yield from pool.imap_unordered(p.work, chunks)


def _start(start: Callable[[Config], None], cfg: Config) -> None:
    """A pass process's start: its math libraries at producers.math_threads, then p.start."""
    pin_math_threads(cfg.producers.math_threads)
    start(cfg)
