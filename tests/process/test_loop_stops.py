"""A loop of one's own over ringfeed.torch, stopped by a signal: it ends at a batch
boundary, its checkpoint code runs, and a second run resumes exactly there.

- With the data side started by the loader: SIGHUP (a closed terminal) in its fourth
  step; the two runs train every position of two epochs once, in order, and leave no
  child process and no segment.
- Under the launcher (`ringfeed run CONFIG -- python loop.py`): SIGHUP to the whole
  process group, as a dropped ssh session sends it; the launcher names the checkpoint
  the loop wrote and the command that resumes, and nothing is left in /dev/shm.
Every row is checked against its item."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.configs import SYNTHETIC, write_config
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.processes import CLI
from tests.support.runs import rid, shm_segments

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

N = 24

# argv: config, checkpoint file, the step at which it signals itself (0: never), whether
# to start the data side (else the launcher's run), and the epochs to train (a step takes
# 10 ms more with many: the launcher's test signals a loop still running). One JSON line.
LOOP = """
import json, os, signal, sys, time
import torch
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.torch import RingLoader

config, ckpt, hup_at, own = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "own"
epochs = int(sys.argv[5])
state = torch.load(ckpt) if os.path.exists(ckpt) else None
positions = []
with RingLoader(config if own else None, progress_every=0) as loader:
    if state:
        loader.load_state_dict(state["data"])
    for epoch in range(loader.epoch, epochs):
        for batch in loader:
            arrays = {name: t.numpy() for name, t in batch.items()}
            check_synthetic_rows(arrays, int(arrays["valid"].sum()), loader.cfg)
            positions += arrays["position"][arrays["valid"]].tolist()
            open(ckpt + ".step", "w").write(str(len(positions)))
            if len(positions) == hup_at:
                os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.01 if epochs > 2 else 0)
        if loader.stopped:
            break
    torch.save({"data": loader.state_dict()}, ckpt)
print(json.dumps({"run": loader.run_id, "stopped": loader.stopped, "positions": positions}))
"""


def config(tmp_path: Path) -> Path:
    data = {"format": "synthetic", "synthetic_items": N}
    raw = SYNTHETIC | {"data": data, "producers": {"workers": 1}}
    return write_config(tmp_path, raw | {"stager": {"batch_size": 4, "epochs": 0}})


def loop(tmp_path: Path, *argv: str) -> dict:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    argv = [sys.executable, str(script), *argv]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    return out


def test_sighup_ends_the_loop_at_a_batch_and_the_next_run_resumes_there(tmp_path: Path) -> None:
    cfg, ckpt = config(tmp_path), str(tmp_path / "ckpt.pt")
    first = loop(tmp_path, str(cfg), ckpt, "12", "own", "2")
    assert (
        first["stopped"] == "SIGHUP"
        and "SIGHUP: the loop ends at the next batch" in (first["stderr"])
    )
    second = loop(tmp_path, str(cfg), ckpt, "0", "own", "2")
    assert first["positions"] == list(range(12)), "three batches of 4, the step's last kept"
    assert first["positions"] + second["positions"] == list(range(2 * N))
    for run in (first["run"], second["run"]):
        assert shm_segments(run) == []
        assert not any(run in name for name in os.listdir("/dev/shm"))


def test_sighup_to_the_launchers_group_stops_the_run_and_names_the_loops_checkpoint(
    tmp_path: Path,
) -> None:
    cfg, ckpt, run_id = config(tmp_path), tmp_path / "ckpt.pt", rid("hup")
    (tmp_path / "loop.py").write_text(LOOP)
    script = str(tmp_path / "loop.py")
    command = [sys.executable, script, str(cfg), str(ckpt), "0", "launcher", "1000"]
    launcher = subprocess.Popen(
        [*CLI, "run", str(cfg), "--run-id", run_id, "--", *command],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    try:
        step = Path(f"{ckpt}.step")
        wait_for(lambda: step.is_file() and int(step.read_text() or 0) >= 8, 90, "two steps")
        os.killpg(launcher.pid, signal.SIGHUP)
        out, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 0, out
    assert f"the checkpoint your command wrote last is {ckpt}" in out, out
    assert f"resume it with: cd {tmp_path}" in out and f"--run-id {run_id}" in out, out
    time.sleep(0.2)
    assert shm_segments(run_id) == []
