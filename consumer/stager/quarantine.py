"""The quarantine report: one JSON line per input that was not used, with its reason,
the stage that gave up on it and that stage's cause.

Written by the stagers of the run only (one, or one per training worker: see
below; `ringfeed quarantine --clear` edits it only while no stager of the run holds
its lock); read by the run summary, the
inspector, `ringfeed quarantine` and tests. JSON lines so a crash loses at most the
last line and ``grep``/``jq`` work on a live run. An item's line decides what a
resumed run skips, so it is fsynced when written (lines are rare: one per bad input);
a bad metadata line is found again at every start and is only flushed.

Causes (docs/faults-and-security.md#causes-not-items). A line's cause is what decided
its verdict: the stage's code versions and config values in the producer that judged
it (producer/causes.py), "" for a stage without one. At a start, the items quarantined
earlier in the run are settled when the first producer joins, before any grant
(:meth:`QuarantineWriter.settle`): an item whose line holds that producer's cause of
its stage is skipped without a try, as before; one whose cause differs (a fixed user
function under a new user_version, another normalizer) is tried again, its line
dropped from the file so that its new verdict is written. A line without a cause (a
file of a ringfeed before causes) for a stage that has one today is tried again too:
that its cause still holds cannot be shown, and a wrong skip loses the item for the
run while a wrong retry costs one try. Stages without a cause (lease, the stager's
content and bucket checks, computed items) stay skipped; metadata lines are found
again at every start.

One file per run. Training workers (`--worker K/N`) have run directories of their
own (R-wK), and the run's quarantine lives in the run directory R, linked from
each of theirs (:func:`run_quarantine`): a run resumed with another number of
workers never tries again an item an earlier worker quarantined. Several stagers
then append to one file (each line one write of the append mode) under the shared
lock; settle rewrites it only while no other stager holds it, else the new verdict
of an item tried again follows its old line (readers take an input's last line).
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.memory.disk import disk_error

# The run's quarantine file, in its run directory (workers' directories link to it).
QUARANTINE_FILE = "quarantine.jsonl"
# The stage of a clip data.outliers skips: out of its speaking-rate band (the stager, at
# start) or near-silent or clipped (the producer that decoded it).
OUTLIER_STAGE = "outlier"


class QuarantineBusy(RuntimeError):
    """A stager of the run holds its quarantine file: it may not be edited now."""


class QuarantineWriter:
    """Appends ``{"item_id", "path", "reason", "stage", "cause", "time"}`` lines,
    line-buffered, holding the file's lock (shared: `ringfeed quarantine --clear`
    waits for no stager) from open to close.

    One line per input per run: a record already in the file (a stager restarted
    into the same run directory) is not written again, unless :meth:`settle` dropped
    it. An item's key is its id; a bad metadata line's (stage "metadata") is its
    file:line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()  # a worker's link: the run's file, and its lock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = lock(self.path, fcntl.LOCK_SH)  # before reading: no edit half-seen
        self.earlier = read_quarantine(self.path)
        self._seen = {_key(r["item_id"], r["path"], r["stage"]) for r in self.earlier}
        new = not self.path.exists()
        self._file = self._open()
        if new:  # the file's name lives in the directory: make it survive a power loss too
            _fsync_dir(self.path.parent)
        if _ends_torn(self.path):  # a crash cut the last line: the next one starts fresh
            self._file.write("\n")
        self.count = 0
        self.settled = False
        self.causes: dict[str, str] = {}  # the first producer's of this start (settle)
        self._stages = collections.Counter(r["stage"] for r in latest(self.earlier))

    def _open(self) -> Any:
        # buffering=1: each record reaches the file when written, so a reader sees it live.
        return open(self.path, "a", buffering=1, encoding="utf-8")

    def write(self, item_id: str, path: str, reason: str, stage: str, cause: str = "") -> bool:
        """stage: where it was rejected ("metadata", "text", "audio", "features", "lease",
        "outlier", ...); cause: what decided it there (producer/causes.py), "" if nothing;
        False if this input is already in the file. DiskFull, naming the file, on a full
        disk: a skip whose reason cannot be kept must not pass silently."""
        key = _key(item_id, path, stage)
        if key in self._seen:
            return False
        # The stager's own verdicts on a producer stage (a lease: its producers died on it)
        # carry the cause the producers of this start judge that stage by.
        cause = cause or self.causes.get(stage, "")
        self._seen.add(key)
        record = {
            "item_id": item_id,
            "path": path,
            "reason": reason,
            "stage": stage,
            "cause": cause,
            "time": time.time(),
        }
        try:
            self._file.write(json.dumps(record) + "\n")
            if stage != "metadata":
                os.fsync(self._file.fileno())  # line-buffered: the line is in the file already
        except OSError as exc:  # DiskFull: the stager ends the run saying where and why
            raise disk_error(exc, self.path) from None
        self._stages[stage] += 1
        self.count += 1
        return True

    def by_stage(self) -> dict[str, int]:
        """The inputs in the file (one each, earlier starts included), by stage."""
        return {stage: n for stage, n in self._stages.items() if n > 0}

    def settle(
        self, index: CorpusIndex, causes: dict[str, str]
    ) -> tuple[dict[int, tuple[str, str]], collections.Counter[str]]:
        """Once a start, when the first producer joins (causes: its HELLO's): (item ->
        (reason, stage) of the items quarantined earlier that are skipped without a try,
        stage -> items tried again because their cause changed). The lines of the items
        tried again leave the file (atomically), so their new verdicts are written."""
        self.settled = True
        self.causes = dict(causes)
        skips: dict[int, tuple[str, str]] = {}
        retried: collections.Counter[str] = collections.Counter()
        records = latest(read_quarantine(self.path))  # with this start's metadata lines
        kept = []
        for r in records:
            if r["stage"] != "metadata" and stale(r, causes):
                retried[r["stage"]] += 1
                self._stages[r["stage"]] -= 1
                self._seen.discard(_key(r["item_id"], r["path"], r["stage"]))
                continue
            kept.append(r)
            item = index.find(r["item_id"]) if r["stage"] != "metadata" else None
            if item is not None:
                skips[item] = (str(r.get("reason", "")), r["stage"])
        if retried:
            self._rewrite_alone(kept)
        return skips, retried

    def _rewrite_alone(self, kept: list[dict[str, Any]]) -> None:
        """The file holds `kept`, if no other stager of the run holds it now (its appends
        would go to the replaced file); else it stays, and the new verdicts of the items
        tried again follow their old lines."""
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another worker's stager: leave the lines
            pass
        else:
            self._file.close()
            replace_lines(self.path, kept)
        # A failed conversion may have dropped the shared lock (flock(2)): take it again,
        # and reopen, in case a `--clear` replaced the file meanwhile.
        fcntl.flock(self._lock, fcntl.LOCK_SH)
        self._file.close()
        self._file = self._open()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._lock >= 0:
            os.close(self._lock)  # and so the lock
            self._lock = -1

    def __enter__(self) -> QuarantineWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def run_quarantine(directory: Path, run_directory: Path) -> Path:
    """The run's quarantine file, in `run_directory` (the run's, without a worker's
    suffix), linked from this worker's run directory `directory`. A file the worker's
    directory holds itself (written before the quarantine was one per run) joins the
    run's first."""
    path = run_directory.resolve() / QUARANTINE_FILE
    if directory.resolve() == run_directory.resolve():
        return path
    run_directory.mkdir(parents=True, exist_ok=True)
    mine = directory / QUARANTINE_FILE
    if mine.is_symlink() and mine.resolve() == path:
        return path
    if mine.exists() and not mine.is_symlink():
        with QuarantineWriter(path) as run:
            for r in latest(read_quarantine(mine)):
                run.write(
                    r["item_id"],
                    r["path"],
                    str(r.get("reason", "")),
                    r["stage"],
                    str(r.get("cause", "")),
                )
    mine.unlink(missing_ok=True)
    mine.symlink_to(path)
    return path


def stale(record: dict[str, Any], causes: dict[str, str]) -> bool:
    """Would a start whose producers judge by `causes` try this line's item again? Yes
    when its stage has a cause today and the line holds another one, or none."""
    stage = record["stage"]
    return stage in causes and record.get("cause", "") != causes[stage]


def latest(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last record of each input, in file order (the writer keeps one line per
    input; a file edited by hand may hold more)."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for r in reversed(list(records)):
        last.setdefault(_key(r["item_id"], r["path"], r["stage"]), r)
    return list(reversed(last.values()))


def clear_stage(path: str | os.PathLike[str], stage: str) -> int:
    """Remove every line of `stage` from a run's quarantine file, atomically; returns how
    many. QuarantineBusy while a stager of the run holds the file (it reads the file
    only at its start, and appends to it: an edit under it would be lost or torn)."""
    path = Path(path).resolve()  # a worker's link: the run's file
    try:
        fd = lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise QuarantineBusy(
            f"a stager of this run is running (it holds {path}): stop the run, then clear; "
            "its next start reads the file again"
        ) from None
    try:
        records = read_quarantine(path)
        kept = [r for r in records if r["stage"] != stage]
        if len(kept) < len(records):
            replace_lines(path, kept)
        return len(records) - len(kept)
    finally:
        os.close(fd)


def lock(path: Path, how: int) -> int:
    """An open descriptor of the file's lock file (beside it, never replaced: the file
    itself is, by settle and clear), flocked `how`; closing it lets go."""
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
    except OSError:
        os.close(fd)
        raise
    return fd


def replace_lines(path: Path, records: list[dict[str, Any]]) -> None:
    """The file holds exactly these records, whatever happens meanwhile (a crash leaves
    the old file or the new one, never half of one: write aside, fsync, rename)."""
    aside = path.with_name(path.name + ".new")
    with open(aside, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(aside, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ends_torn(path: Path) -> bool:
    """True if the file's last byte is not a newline (its last line was cut short)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def _key(item_id: str, path: str, stage: str) -> tuple[str, str]:
    return ("line", path) if stage == "metadata" else ("item", item_id)


def read_quarantine(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of a quarantine file, in order; a torn last line (a crash) is skipped.
    A record of a ringfeed before causes has no "cause" (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # only a line cut short by a crash can be malformed
            continue
        if isinstance(record, dict) and {"item_id", "path", "stage"} <= record.keys():
            records.append(record)
    return records
