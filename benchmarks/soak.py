"""Soak: a stager, a producer pool and a consumer for minutes, producers SIGKILLed at random.

    .venv/bin/python benchmarks/soak.py [--seconds 600] [--seed 0] [--workers 2]

Data: ``data.format: synthetic`` (2,000 items, 2 ms of sleep per sample, so
the producers, not the consumer, set the pace; no dataset or cache needed).
Finite epochs (``stager.epochs`` far beyond what the time allows); this
process is the consumer (consumer.batch_client.BatchClient) and checks every
completed epoch against its plan: the items in plan order, each exactly once.
Every 0.5-3 s (seeded) one random producer worker gets SIGKILL; the pool
restarts it at once (``producers.restart_backoff_s: 0``: the pool's backoff
doubles with each crash in a row, up to 30 s, and resets only after a worker
ran 60 s healthy, which kills every few seconds never allow).

Reported at the end: delivered and skipped items (the stager's counters),
lost and duplicated items over the completed epochs, kills done, restarts the
pool logged, the RSS of every process after warm-up and at the end with its
growth, and the run's /dev/shm segments before and after. Targets: RSS growth
< 5 % after warm-up for the long-lived processes, segments equal, 0 lost or
duplicated. Workers are replaced by the kills, so their row compares the mean
of the live workers, not one process.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from consumer.batch_client import BatchClient  # noqa: E402
from consumer.slot_manager import EpochPlan  # noqa: E402
from shared.config import config_from_dict  # noqa: E402
from shared.ring import list_segments  # noqa: E402
from tests.test_transport_e2e import worker_pids  # noqa: E402

N_ITEMS = 2000
RSS_TARGET_PCT = 5.0
EXIT_WAIT_S = 20.0
# No batch for this long is a stall: the soak stops and reports it.
STALL_S = 30.0
# The pool exits on its own once the stager's SHUTDOWN reached every worker.
POOL_GRACE_S = 5.0


def soak_config(root: Path, workers: int) -> dict:
    return {
        "data": {"format": "synthetic", "synthetic_items": N_ITEMS, "synthetic_delay_s": 0.002},
        "features": {"max_frames": 64, "cache": False},
        "text": {"max_text_len": 32},
        "ring": {"slots": 16, "lease_s": 1.0, "heartbeat_s": 0.2},
        "stager": {"batch_size": 8, "epochs": 100_000},
        "producers": {"workers": workers, "restart_backoff_s": 0.0, "max_restarts": 10**6},
        "run": {"root": str(root / "runs")},
    }


def rss_kb(pid: int) -> int:
    """VmRSS of a live process in KiB (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return next((int(s.split()[1]) for s in text.splitlines() if s.startswith("VmRSS:")), 0)


def live_workers(pool_pid: int) -> list[int]:
    try:
        return worker_pids(pool_pid)
    except (FileNotFoundError, ProcessLookupError):
        return []  # a worker exited while /proc was read: try again next time


def rss_table(stager: int, pool: int) -> dict[str, float]:
    workers = [r for r in map(rss_kb, live_workers(pool)) if r]
    return {
        "stager": rss_kb(stager),
        "pool": rss_kb(pool),
        "workers (mean)": sum(workers) / max(1, len(workers)),
        "consumer": rss_kb(os.getpid()),
    }


class EpochCheck:
    """Items in delivery order, checked against the plan one completed epoch at a time."""

    def __init__(self, seed: int) -> None:
        self.plan = EpochPlan(N_ITEMS, seed)
        self.pending: list[int] = []
        self.epochs = self.lost = self.duplicated = self.out_of_order = 0

    def add(self, items: list[int]) -> None:
        self.pending.extend(items)
        while len(self.pending) >= N_ITEMS:
            got, self.pending = self.pending[:N_ITEMS], self.pending[N_ITEMS:]
            want = self.plan.permutation(self.epochs).tolist()
            counts = collections.Counter(got)
            self.lost += len(set(want) - set(counts))
            self.duplicated += sum(c - 1 for c in counts.values() if c > 1)
            self.out_of_order += got != want and counts == collections.Counter(want)
            self.epochs += 1


def wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """Exit code, or None if it still runs after timeout_s."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def start(verb: str, cfg_path: Path, run_id: str, log_dir: Path) -> subprocess.Popen:
    with (log_dir / f"{verb}.log").open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "scripts.cli", verb, str(cfg_path), "--run-id", run_id],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def soak(args: argparse.Namespace, tmp: Path) -> int:
    raw = soak_config(tmp, args.workers)
    cfg_path = tmp / "soak.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = config_from_dict(raw)
    run_id = f"soak-{uuid.uuid4().hex[:6]}"
    shm_before = sorted(p.name for p in list_segments())
    stager = start("stager", cfg_path, run_id, tmp)
    pool = start("producers", cfg_path, run_id, tmp)
    client = BatchClient(cfg, run_id, "soak")
    rng, check = random.Random(args.seed), EpochCheck(cfg.stager.seed)
    kills, rss0, stalled = 0, None, None
    warmup_s = min(30.0, args.seconds / 6)
    try:
        client.connect(timeout_s=60)
        t0 = time.monotonic()
        next_kill = t0 + rng.uniform(0.5, 3.0)
        while (now := time.monotonic()) - t0 < args.seconds:
            try:
                batch = client.next(timeout_s=STALL_S)
            except TimeoutError:
                stalled = now - t0
                break
            if batch is None:
                break
            check.add(batch.arrays["items"][: batch.n_valid].tolist())
            client.free(batch)
            if rss0 is None and now - t0 >= warmup_s:
                rss0 = rss_table(stager.pid, pool.pid)
            if now >= next_kill:
                pids = live_workers(pool.pid)
                if pids:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
                next_kill = now + rng.uniform(0.5, 3.0)
        rss1 = rss_table(stager.pid, pool.pid)
    finally:
        client.close(finished=True)
        codes = {"stager": wait(stager, EXIT_WAIT_S), "producers": wait(pool, POOL_GRACE_S)}
        if codes["producers"] is None:
            # A worker restarted after the stager's SHUTDOWN waits ORPHAN_S (30 s) before
            # it gives up; a launcher SIGTERMs the pool instead (scripts/launch.sh).
            pool.send_signal(signal.SIGTERM)
            codes["producers"] = wait(pool, EXIT_WAIT_S)
        for name, proc in (("stager", stager), ("producers", pool)):
            if proc.poll() is None:  # never leave a process behind, whatever failed above
                proc.kill()
                proc.wait()
                codes[name] = "SIGKILLed"
    summary = json.loads((tmp / "runs" / run_id / "stager.json").read_text())
    restarts = (tmp / "producers.log").read_text().count("died (signal SIGKILL)")
    shm_after = sorted(p.name for p in list_segments())
    if stalled is not None:
        print(f"STALL: no batch for {STALL_S:.0f} s after {stalled:.1f} s of soak")
    shm = (shm_before, shm_after)
    code = report(args, check, summary, kills, restarts, rss0 or rss1, rss1, codes, shm)
    return 1 if stalled is not None else code


def report(args, check, summary, kills, restarts, rss0, rss1, codes, shm) -> int:
    """Print the summary table; returns 0 when every target is met."""
    c = summary["counters"]
    print(f"soak: {args.seconds:.0f} s, seed {args.seed}, {args.workers} workers, synthetic data")
    print(f"delivered {c['delivered']}  skipped {c['skipped']}  epochs checked {check.epochs}")
    print(
        f"lost {check.lost}  duplicated {check.duplicated}  out of plan order {check.out_of_order}"
    )
    print(f"kills {kills}  restarts logged by the pool {restarts}  stager: {json.dumps(c)}")
    print(f"dropped messages {json.dumps(summary['dropped'])}  exit codes {codes}")
    print(f"{'process':16s} {'RSS warm KiB':>13s} {'RSS end KiB':>12s} {'growth':>8s}")
    ok = True
    for name in rss1:
        growth = 100.0 * (rss1[name] - rss0[name]) / max(1.0, rss0[name])
        ok &= name.startswith("workers") or growth < RSS_TARGET_PCT
        print(f"{name:16s} {rss0[name]:13.0f} {rss1[name]:12.0f} {growth:7.1f}%")
    before, after = shm
    print(f"/dev/shm ringfeed segments before {len(before)} {before}, after {len(after)} {after}")
    ok &= check.lost == check.duplicated == check.out_of_order == 0 and before == after
    ok &= codes == {"stager": 0, "producers": 0}
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ringfeed-soak-"))
    code = soak(args, tmp)
    if code == 0:
        shutil.rmtree(tmp)
    else:
        print(f"logs and stager.json kept in {tmp}")
    return code


if __name__ == "__main__":
    sys.exit(main())
