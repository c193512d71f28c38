"""Test helpers around scripts.runner.Run: a config file in tmp, the run's segments.

A test wraps a run in ``with Run(config, rid, tmp_path) as run:``; leaving the
block stops every process and removes the run's segments and socket files, so
a failing test leaves nothing behind. ``shm_segments(rid)`` is what the tests
assert empty.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
import zmq

from shared.segments import list_segments


def write_config(tmp_path: Path, raw: dict[str, Any], name: str = "config.yaml") -> Path:
    """Write raw as YAML with run_root in tmp_path; returns the file."""
    raw = {**raw, "run_root": str(tmp_path / "runs")}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def shm_segments(run_id: str) -> list[str]:
    return [p.name for p in list_segments(run_id)]


@contextlib.contextmanager
def peer_socket(endpoint: str) -> Iterator[zmq.Socket]:
    """A DEALER connected to a stager's endpoint, for tests that play a peer by hand."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        yield sock
