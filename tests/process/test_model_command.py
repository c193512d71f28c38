"""`ringfeed run CONFIG -- COMMAND`: the user's own training command is the run's model
process. It finds its run in RINGFEED_CONFIG and RINGFEED_RUN_ID, every row it takes is
its item, and the run ends with it: at the plan's end by its BYE, or, when it exits
without one, the others are stopped after the grace; nothing is left in /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.configs import small
from tests.support.paths import REPO
from tests.support.processes import CLI
from tests.support.runs import shm_segments

pytestmark = pytest.mark.slow

# The user's loop: the run from the launcher's environment, every row checked; it
# stops after argv[1] batches (0: at the plan's end, then BYE) and prints the items.
USER_LOOP = """
import sys
from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import model_process_run

config, run_id = model_process_run()
cfg, limit, items = load_config(config), int(sys.argv[1]), []
client = BatchClient(cfg, run_id, "user")
client.connect(timeout_s=60)
while (batch := client.next(timeout_s=60)) is not None:
    items += check_synthetic_rows(batch.arrays, batch.meta.n_valid, cfg)
    client.free(batch)
    if len(items) // cfg.stager.batch_size == limit:
        break
client.close(finished=batch is None)
print("ITEMS", sorted(items))
"""


def launch(config: Path, run_id: str, batches: int, grace_s: str = "8") -> tuple[int, str]:
    """`ringfeed run CONFIG --run-id R -- python -c USER_LOOP batches`: exit code, output."""
    command = [sys.executable, "-c", USER_LOOP, str(batches)]
    done = subprocess.run(
        [*CLI, "run", str(config), "--run-id", run_id, "--", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"RINGFEED_GRACE_S": grace_s},
    )
    return done.returncode, done.stdout + done.stderr


def test_a_users_command_consumes_the_run_and_its_bye_ends_it(tmp_path: Path) -> None:
    n = 40
    config, run_id = small(tmp_path, items=n, delay_s=0.0), f"cmd-{uuid.uuid4().hex[:6]}"
    code, out = launch(config, run_id, batches=0)
    assert code == 0, out
    assert f"ITEMS {list(range(n))}" in out, out
    assert shm_segments(run_id) == []


def test_a_command_that_exits_without_bye_ends_the_run_after_the_grace(tmp_path: Path) -> None:
    """An endless plan and a command that takes 3 batches and exits 0 without BYE: the
    stager and the producers are stopped the grace later (2 s here) and the launcher
    exits 0."""
    config = small(tmp_path, items=1000, delay_s=0.0, stager={"epochs": 0})
    run_id = f"cmd-{uuid.uuid4().hex[:6]}"
    code, out = launch(config, run_id, batches=3, grace_s="2")
    assert code == 0, out
    assert "ITEMS" in out and shm_segments(run_id) == []
