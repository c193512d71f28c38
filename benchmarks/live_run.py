"""A real stager and producer pool for a benchmark, consumed by the benchmark itself.

    with live_run(raw, tmp) as client:      # raw: a config mapping, as YAML gives
        batch = client.next(timeout_s=30)

On exit the client says BYE (the stager then ends the run and stops the
producers) and the processes are waited for, killed after timeout_s.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml

from consumer.batch_client import BatchClient
from shared.config import config_from_dict

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def live_run(raw: dict, tmp: Path, timeout_s: float = 60.0) -> Iterator[BatchClient]:
    cfg = config_from_dict(raw)
    run_id = f"bench-{uuid.uuid4().hex[:6]}"
    cfg_path = tmp / f"{run_id}.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "scripts.cli", verb, str(cfg_path), "--run-id", run_id],
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )
        for verb in ("stager", "producers")
    ]
    client = BatchClient(cfg, run_id, "bench")
    try:
        client.connect(timeout_s=timeout_s)
        yield client
    finally:
        client.close(finished=True)
        for proc in procs:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
