"""The consumer secret: who may be a run's consumer.

The stager draws a random secret when it starts and writes it to
``<run dir>/consumer.secret``, readable by this user only (0600). The batch
client reads it and presents it in its CONSUMER_HELLO; a hello without it is
dropped and counted ("unauthorized"), so no other peer (another local user, a
remote producer, a stray script) can take the consumer role, restart the plan
or end the run. Remote peers can never be the consumer: the batch ring is
local shared memory.

One consumer at a time: a consumer's ZeroMQ identity carries its pid
(:func:`consumer_identity`), so the stager can tell a live consumer, busy or
idle, from a dead one (consumer/stager/consumer_side.py).

Where the run is: run_root is relative to the working directory, so a client
started elsewhere with the same config would look for the secret in another
folder. The stager also records its run directory (absolute) and pid in the
user's private runtime directory, by run id (:func:`write_run_record`); a
client whose config does not lead to the secret finds the live run there
(:func:`find_run_dir`). The record goes when the stager ends.

A run nobody starts: a client of a run id that no live stager recorded and no process
is starting (:func:`run_starting`: the launcher starts the stager before its clients,
so a client it starts finds its stager's process) is told so within seconds, with the
runs there are (:func:`live_runs`), instead of waiting out its connect timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from pathlib import Path

from ringfeed.shared.config.environment import USER_PREFIX, runtime_dir
from ringfeed.shared.memory.segments import owner_alive, pid_alive

FILE = "consumer.secret"


def consumer_identity(name: str, pid: int, nonce: int) -> bytes:
    """A consumer socket's ZeroMQ identity, "name:pid:nonce" (nonce: new per socket)."""
    return f"{name}:{pid}:{nonce}".encode()


def consumer_pid(identity: bytes) -> int | None:
    """The pid a consumer identity carries, or None for an identity of another form (a
    peer chooses its own: this is a claim, only ever trusted from a secret's holder)."""
    parts = identity.rsplit(b":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or len(parts[1]) > 10:
        return None
    return int(parts[1])


def write_consumer_secret(run_dir: Path) -> str:
    """Draw a new secret and write it atomically with mode 0600; returns it."""
    secret = secrets.token_hex(32)
    tmp = run_dir / f".{FILE}.{os.getpid()}"
    tmp.unlink(missing_ok=True)  # O_EXCL: never inherit the mode of a file left there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    os.replace(tmp, run_dir / FILE)
    return secret


def read_consumer_secret(run_dir: Path) -> str:
    """The run's secret, or "" while the stager has not written it yet."""
    try:
        return (run_dir / FILE).read_text().strip()
    except FileNotFoundError:
        return ""


def run_record(run_id: str) -> Path:
    """The stager's record of where run `run_id` is, in the user's runtime directory."""
    return runtime_dir() / f"{USER_PREFIX}{run_id}.run"


def write_run_record(run_id: str, run_dir: Path) -> Path:
    """Record run_dir (absolute), this process's pid and when, for run_id, atomically;
    the stager calls it at start, and removes the file at its end (a stager killed
    with SIGKILL leaves it: :func:`remove_dead_run_records`)."""
    path = run_record(run_id)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    record = {"run_dir": str(run_dir.absolute()), "pid": os.getpid(), "created_s": time.time()}
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path


def find_run_dir(run_id: str) -> Path | None:
    """The run directory a live stager of run_id recorded, or None (no record, an
    unreadable one, or its stager is gone: its pid dead, or now another process's)."""
    try:
        record = json.loads(run_record(run_id).read_text())
        run_dir, pid = Path(record["run_dir"]), int(record["pid"])
        created_s = float(record.get("created_s", 0.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    alive = owner_alive(pid, created_s) if created_s else pid_alive(pid)
    return run_dir if alive else None


def remove_dead_run_records(run_id: str | None = None) -> list[str]:
    """Unlink the run records (and a record's temporary file) of stagers that are gone,
    of run_id or of every run: a stager killed with SIGKILL leaves its record, whose
    pid another process may take later. Returns their names."""
    removed = []
    pattern = f"{USER_PREFIX}{run_id}.run" if run_id else f"{USER_PREFIX}*.run"
    for path in runtime_dir().glob(pattern):
        try:
            before = os.stat(path)
        except FileNotFoundError:
            continue
        if find_run_dir(path.name[len(USER_PREFIX) : -len(".run")]) is not None:
            continue
        # Not a record a restarted stager of the run put there meanwhile (os.replace).
        with contextlib.suppress(FileNotFoundError):
            now = os.stat(path)
            if (now.st_ino, now.st_mtime_ns) == (before.st_ino, before.st_mtime_ns):
                path.unlink()
                removed.append(path.name)
    for tmp in runtime_dir().glob(f".{pattern}.*"):  # a writer killed before its rename
        pid = tmp.name.rsplit(".", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp.name)
    return removed


def live_runs() -> list[str]:
    """The run ids this user's live stagers recorded here, sorted."""
    suffix = ".run"
    ids = [
        p.name[len(USER_PREFIX) : -len(suffix)]
        for p in runtime_dir().glob(f"{USER_PREFIX}*{suffix}")
    ]
    return sorted(run_id for run_id in ids if find_run_dir(run_id) is not None)


# Verbs whose process starts a run's stager, and the entries a command line runs them by.
STARTING_VERBS = (b"stager", b"run")
ENTRIES = (b"ringfeed", b"ringfeed.scripts.cli", b"launch.sh")


def run_starting(run_id: str) -> bool:
    """Whether a process of this user is starting run_id's stager before it records the
    run (imports, the corpus index): `ringfeed stager` or `ringfeed run` with --run-id
    ID, as the launcher (scripts/runner.py) and launch.sh start it, or a training
    worker's, whose run id is ID-wK. One read of /proc/<pid>/cmdline for each of this
    user's processes."""
    uid = os.getuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if _starts(argv, run_id.encode()):
            return True
    return False


def _starts(argv: list[bytes], run_id: bytes) -> bool:
    """Does this command line start the stager of run_id (run_starting)?"""
    if not any(os.path.basename(a) in ENTRIES for a in argv):
        return False
    if not any(a in STARTING_VERBS for a in argv):
        return False
    for k, arg in enumerate(argv):
        value = argv[k + 1] if arg == b"--run-id" and k + 1 < len(argv) else b""
        value = arg.removeprefix(b"--run-id=") if arg.startswith(b"--run-id=") else value
        if value and (run_id == value or re.fullmatch(re.escape(value) + rb"-w\d+", run_id)):
            return True
    return False
