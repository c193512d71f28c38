"""A persistent cache of text work: detected languages, normalized and phonemized texts.

One SQLite file, ``<features.cache_dir>/text-cache.sqlite``, shared by every
process on the host (WAL mode: readers never wait for a writer). Keys hash the
kind of work (with its version), the language and the text, so a changed rule
or another language is another entry. Used by shared/language/detect.py (the
stager and each producer, reading the index) and producer/text/encoder.py (each
producer, per sample).

A cache is an optimization, never a reason to lose a sample: every SQLite error
(locked by another writer past TIMEOUT_S, a full disk, a corrupt file) is a
miss or a dropped write, counted in ``errors``; after MAX_ERRORS the cache turns
itself off for this process. Opening a file another process holds locked (many
producers opening a fresh cache at once) is retried OPEN_TRIES times first.
Writes are batched (WRITE_BATCH puts or FLUSH_S seconds), because a commit per
text would cost more than the work it saves.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "text-cache.sqlite"
TIMEOUT_S = 0.2
WRITE_BATCH = 256
FLUSH_S = 2.0
MAX_ERRORS = 20
# Opening a locked file is tried this many times, the waits doubling from OPEN_BACKOFF_S
# (0.05 + 0.1 + 0.2 + 0.4 s at most, on top of TIMEOUT_S each).
OPEN_TRIES = 5
OPEN_BACKOFF_S = 0.05


def text_key(kind: str, language: str, text: str) -> bytes:
    # surrogatepass: a lone surrogate (legal in JSON) is a key like any other text.
    raw = f"{kind}\0{language}\0{text}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=16).digest()


def _storable(value: str) -> bool:
    """Whether SQLite can take value: a lone surrogate would fail the whole batch."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class TextCache:
    """get/put of strings by (kind, language, text); see the module docstring."""

    def __init__(self, cache_dir: str | Path | None) -> None:
        """cache_dir None: a cache that is off (every get a miss, nothing written)."""
        self.path = Path(cache_dir or ".") / FILE_NAME
        self.errors = 0
        self.hits = 0
        self.misses = 0
        self._pending: dict[bytes, str] = {}
        self._last_flush = time.monotonic()
        self._db: sqlite3.Connection | None = None
        if cache_dir is not None:
            self._open()

    def _open(self) -> None:
        """Open (and on first use create) the file, retrying while another process holds
        its lock: 1 in 40 of processes opening a fresh cache at once met "database is
        locked" on the switch to WAL and then ran with the cache off for life."""
        for attempt in range(OPEN_TRIES):
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, timeout=TIMEOUT_S, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=OFF")  # a lost write is a later miss
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS texts (key BLOB PRIMARY KEY, value TEXT NOT NULL)"
                )
                return
            except sqlite3.OperationalError as exc:
                self._discard()
                if attempt + 1 == OPEN_TRIES or "locked" not in str(exc):
                    self._error("cannot open", exc)
                    return
                time.sleep(OPEN_BACKOFF_S * 2**attempt)
            except (sqlite3.Error, OSError) as exc:
                self._discard()
                self._error("cannot open", exc)  # a file that cannot be opened is not read
                return

    def _discard(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    @property
    def enabled(self) -> bool:
        return self._db is not None

    def _error(self, what: str, exc: Exception) -> None:
        self.errors += 1
        if self.errors <= 3:
            log.warning("text cache %s %s: %s; going on without it", what, self.path, exc)
        if self.errors >= MAX_ERRORS or self._db is None:
            self.close()

    def get(self, kind: str, language: str, text: str) -> str | None:
        key = text_key(kind, language, text)
        value = self._pending.get(key)
        if value is None and self._db is not None:
            try:
                row = self._db.execute("SELECT value FROM texts WHERE key = ?", (key,)).fetchone()
                value = row[0] if row else None
            except sqlite3.Error as exc:
                self._error("cannot read", exc)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, kind: str, language: str, text: str, value: str) -> None:
        if self._db is None or not _storable(value):
            return
        self._pending[text_key(kind, language, text)] = value
        if len(self._pending) >= WRITE_BATCH or time.monotonic() - self._last_flush > FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write the pending entries in one transaction (kept for a later try if locked)."""
        self._last_flush = time.monotonic()
        if self._db is None or not self._pending:
            return
        try:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT OR IGNORE INTO texts VALUES (?, ?)", list(self._pending.items())
                )
            self._pending.clear()
        except sqlite3.Error as exc:
            self._error("cannot write", exc)
            if len(self._pending) > 16 * WRITE_BATCH:
                self._pending.clear()  # bounded memory while the file stays locked

    def close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        if self._pending:
            try:
                with db:
                    db.execute("BEGIN")
                    db.executemany(
                        "INSERT OR IGNORE INTO texts VALUES (?, ?)", list(self._pending.items())
                    )
            except sqlite3.Error:
                pass  # closing anyway: the entries are recomputed next time
        self._pending.clear()
        db.close()
