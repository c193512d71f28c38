"""Several replicas (MirroredStrategy on two logical CPU devices): the global batch's
loss and update equal one device's on the same batches, one XLA trace per shape per
replica, with two length buckets (consumer/trainer/replicas.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

# Float rounding of a sum split in two, over a few Adam steps.
TOLERANCE = 1e-4


@pytest.mark.slow
def test_two_replicas_train_as_one_device_on_the_same_global_batches() -> None:
    # 5 rows: the replicas get 3 and 2 (one empty row padded in); two bucket shapes
    # (buckets off is one shape through the same code).
    cases = ["5:1:3"]
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.replica_steps", *cases],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases)
    for result, shapes in zip(results, (2,), strict=True):
        assert result["devices"] == 2
        assert result["traces"] == shapes * 2, "one trace per shape per replica"
        single, replicas = result["single"], result["replicas"]
        assert len(single) == len(replicas) == 3
        assert max(abs(a - b) for a, b in zip(single, replicas, strict=True)) < TOLERANCE
        assert single[-1] < single[0], "the steps train: the comparison is not of no-ops"
