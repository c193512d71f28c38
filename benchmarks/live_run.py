"""A real stager and producer pool for a benchmark, consumed by the benchmark itself.

    with live_run(raw, tmp) as client:      # raw: a config mapping, as YAML gives
        batch = client.next(timeout_s=30)

The processes are scripts.runner.Run's. On exit the client says BYE (the
stager then ends the run and stops the producers), the processes are waited
for, and Run stops whatever is left and removes the run's segments.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.scripts.runner import Run


@contextlib.contextmanager
def live_run(raw: dict, tmp: Path, timeout_s: float = 60.0) -> Iterator[BatchClient]:
    run_id = f"bench-{uuid.uuid4().hex[:6]}"
    cfg_path = tmp / f"{run_id}.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    with Run(cfg_path, run_id, log_dir=tmp) as run:
        run.start("stager")
        run.start("producers")
        client = run.client("bench", timeout_s=timeout_s)
        try:
            yield client
        finally:
            client.close(finished=True)
            for proc in run.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout_s)
