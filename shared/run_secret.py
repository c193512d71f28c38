"""The consumer secret: who may be a run's consumer.

The stager draws a random secret when it starts and writes it to
``<run dir>/consumer.secret``, readable by this user only (0600). The batch
client reads it and presents it in its CONSUMER_HELLO; a hello without it is
dropped and counted ("unauthorized"), so no other peer (another local user, a
remote producer, a stray script) can take the consumer role, restart the plan
or end the run. Remote peers can never be the consumer: the batch ring is
local shared memory.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE = "consumer.secret"


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
