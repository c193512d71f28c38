"""ringfeed.torch's loader against real runs: two ranks of a torch.distributed job each
consume their worker's share of one global plan, with their data sides started by hand
(`ringfeed run --worker K/N --consumer none`) and under torchrun with none (each rank's
loader starts its own), a user's loop SIGKILLed mid-step leaves the run to end as
it does for any consumer of one's own (docs/faults-and-security.md#nothing-waits-for-ever),
and one SIGKILLed while its copies still read every batch slot gives them back to the
consumer that comes next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.run.share import Share
from tests.support.checks import consume
from tests.support.configs import BUCKETS, SYNTHETIC, small, write_config
from tests.support.paths import REPO
from tests.support.processes import CLI
from tests.support.runs import Run, finish, rid, shm_segments

torch = pytest.importorskip("torch")

from ringfeed.torch import RingLoader  # noqa: E402

pytestmark = pytest.mark.slow

STAGER_NO_CONSUMER = 6  # consumer/stager/stager.py: no consumer for stager.consumer_wait_s


def data_side(config: Path, run_id: str, worker: str) -> subprocess.Popen:
    """`ringfeed run CONFIG --run-id R --worker K/N --consumer none`, its output piped."""
    argv = [*CLI, "run", str(config), "--run-id", run_id, "--worker", worker, "--consumer", "none"]
    return subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_two_ranks_take_disjoint_shares_of_every_global_batch(tmp_path: Path) -> None:
    n = BUCKETS["data"]["synthetic_items"]
    raw = SYNTHETIC | BUCKETS | {"stager": BUCKETS["stager"] | {"epochs": 1}}
    config, base = write_config(tmp_path, raw), rid("rank")
    sides = [data_side(config, base, f"{k}/2") for k in range(2)]
    try:
        loaders = [RingLoader(config, base, rank=k, world_size=2) for k in range(2)]
        assert [loader.run_id for loader in loaders] == [Share(k, 2).run_id(base) for k in (0, 1)]
        steps: list[list[dict]] = [[], []]
        for k, loader in enumerate(loaders):
            for batch in loader:  # to the plan's end: each says BYE, its run ends
                arrays = {name: t.numpy() for name, t in batch.items()}
                check_synthetic_rows(arrays, int(arrays["valid"].sum()), loader.cfg)
                steps[k].append(arrays)
        outs = [side.communicate(timeout=60)[0] for side in sides]
    finally:
        for side in sides:
            if side.poll() is None:
                side.kill()
    assert [side.returncode for side in sides] == [0, 0], outs
    assert len(steps[0]) == len(steps[1]) > 1, "one batch each per global batch"
    seen: list[int] = []
    for zero, one in zip(*steps, strict=True):
        assert zero["mel"].shape[1] == one["mel"].shape[1], "the same bucket at every step"
        mine = [set(b["items"][b["valid"]].tolist()) for b in (zero, one)]
        assert not mine[0] & mine[1], "disjoint shares"
        seen += [*mine[0], *mine[1]]
    assert len(seen) == len(set(seen)) and len(seen) > n - 2 * len(steps[0]), "the epoch, once"
    assert all(shm_segments(Share(k, 2).run_id(base)) == [] for k in (0, 1))


# Each rank of a torchrun job: two epochs of per-rank batches of 2, as JSON.
RANK_LOOP = """
import json, sys
import torch.distributed as dist
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.torch import RingLoader

dist.init_process_group("gloo")
out = {"passes": []}
with RingLoader(sys.argv[1], batch_size=2, progress_every=0) as loader:
    out |= {"run": loader.run_id, "batch": loader.batch_size, "global": loader.global_batch_size}
    for epoch in range(2):
        out["passes"].append({"len": len(loader), "batches": []})
        for batch in loader:
            arrays = {name: t.numpy() for name, t in batch.items()}
            valid = int(arrays["valid"].sum())
            items = check_synthetic_rows(arrays, valid, loader.cfg)
            out["passes"][-1]["batches"].append([arrays["mel"].shape[0], items])
with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def test_two_torchrun_ranks_start_their_own_shares_and_take_every_item_once_an_epoch(
    tmp_path: Path,
) -> None:
    """No data side started by hand: rank K's loader starts the stager of share K/2 and
    its producers; per-rank batches of 2 (a global batch of 4); each epoch, the ranks'
    batches are disjoint and together every item once; nothing is left behind."""
    n = 24
    raw = SYNTHETIC | {"data": {"format": "synthetic", "synthetic_items": n}}
    config = write_config(tmp_path, raw | {"producers": {"workers": 1}})
    script = tmp_path / "ranks.py"
    script.write_text(RANK_LOOP)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    done = subprocess.run(
        [*argv, "2", str(script), str(config), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert [r["run"].rsplit("-", 1)[1] for r in ranks] == ["w0", "w1"]
    assert [(r["batch"], r["global"]) for r in ranks] == [(2, 4), (2, 4)]
    for epoch in (0, 1):
        passes = [r["passes"][epoch] for r in ranks]
        assert [len(p["batches"]) for p in passes] == [p["len"] for p in passes] == [n // 4] * 2
        mine = [[item for _, items in p["batches"] for item in items] for p in passes]
        assert not set(mine[0]) & set(mine[1]), "disjoint shares"
        assert sorted(mine[0] + mine[1]) == list(range(n)), f"epoch {epoch}: every item once"
        assert {rows for p in passes for rows, _ in p["batches"]} == {2}
    assert all(shm_segments(r["run"]) == [] for r in ranks)


# A user's loop over ringfeed.torch that is SIGKILLed in its fourth step.
KILLED_LOOP = """
import os, signal, sys
from ringfeed.torch import RingLoader
loader = RingLoader(sys.argv[1], sys.argv[2])
for step, batch in enumerate(loader):
    if step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_loop_killed_mid_step_leaves_the_run_to_end_after_consumer_wait_s(
    tmp_path: Path,
) -> None:
    """As for a TensorFlow loop of one's own under --consumer none: the stager ends the
    run consumer_wait_s (3 s here) later with exit code 6, and nothing is left."""
    config = small(tmp_path, items=100_000, stager={"epochs": 0, "consumer_wait_s": 3.0})
    run_id = rid("killed")
    launcher = subprocess.Popen(
        [*CLI, "run", str(config), "--run-id", run_id, "--consumer", "none"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        loop = subprocess.run(
            [sys.executable, "-c", KILLED_LOOP, str(config), run_id],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if loop.returncode != -9:  # the launcher may have said why first
            launcher.kill()
            said = launcher.communicate(timeout=10)[0]
            raise AssertionError(f"{loop.stderr}\nthe launcher said:\n{said[-3000:]}")
        killed = time.monotonic()
        out, _ = launcher.communicate(timeout=60)
        took_s = time.monotonic() - killed
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == STAGER_NO_CONSUMER, out
    assert "none came for 3 s (stager.consumer_wait_s)" in out and took_s < 3 + 15, out
    assert shm_segments(run_id) == []
    assert not any(run_id in name for name in os.listdir("/dev/shm"))


# A loop whose copies to the device never end: each slot it is sent stays read, as a
# registered slot whose copy is in flight (consumer/client/batch_stream.py SlotReads),
# when the process is SIGKILLed; it says which slot its one batch came in.
HOLDING_LOOP = """
import os, signal, sys, threading
from ringfeed.torch import RingLoader

class Unending:
    def query(self):
        return False

    def synchronize(self):
        threading.Event().wait()

class Holding(RingLoader):
    def place(self, arrays):
        return super().place(arrays)[0], Unending()

loader = Holding(sys.argv[1], sys.argv[2], progress_every=0)
next(iter(loader))
print(loader.last_meta.slot, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_loop_killed_holding_every_slot_gives_them_back_to_the_next_consumer(
    tmp_path: Path,
) -> None:
    """The killed loop never freed its batch, and the stager had sent it as many more as
    a consumer may hold (stager.batch_slots): those slots are SENT to a dead process.
    The next consumer (a relaunch from a checkpoint at the start) is taken at once,
    the slots come back to the stager (the held one carries batches again), each item
    arrives once, and the run ends with nothing of it in /dev/shm."""
    config = small(tmp_path, items=48, delay_s=0.0, stager={"batch_size": 4})
    with Run(config, rid("held"), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        loop = subprocess.run(
            [sys.executable, "-c", HOLDING_LOOP, str(config), run.run_id],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert loop.returncode == -9, loop.stderr
        held = int(loop.stdout.split()[0])
        client = run.client("relaunched")
        slots: list[int] = []
        real_next = client.next

        def next_batch(timeout_s: float):
            batch = real_next(timeout_s)
            if batch is not None:
                slots.append(batch.meta.slot)
            return batch

        client.next = next_batch
        items = consume(client, timeout_s=30)
        client.close(finished=True)
        finish(run, "producers")  # each exits 0, and no segment of the run is left
    assert sorted(items) == list(range(48)), "each item once, from the relaunch's start"
    assert held in slots, f"slot {held} never came back: {slots}"
