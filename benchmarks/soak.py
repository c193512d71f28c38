"""Soak: a run under every fault at once, for minutes; every row of every batch checked.

    .venv/bin/python benchmarks/soak.py [--seconds 600] [--seed 0] [--workers 2] [--drop 0.002]
                                        [--fields]

Data: ``data.format: synthetic`` (2,000 items, 2 ms of sleep per sample, so
the producers, not the consumer, set the pace; no dataset or cache needed),
finite epochs far beyond what the time allows. ``--fields`` declares every kind of
optional sample field (docs/sample-fields.md: a reference clip, pitch, voiced,
energy, durations and fields of the user's own of each length kind), synthesized
per item, so they too travel as payload frames through the lossy link and are
checked row by row. The faults, all at once:

- the producers are remote (payloads as TCP frames) and reach the stager
  through scripts/lossy_link.py, which drops ``--drop`` of the messages each
  way, whole (GRANTs, READYs with their payload, HELLOs, WELCOMEs, REQUESTs);
- item POISON_RAISE raises an unexpected exception in the producer's work,
  and item POISON_EXIT ends its worker with exit code 3 (injected with the
  sleep through the source hook, tests/support/fault_sources.py);
- every 0.5-3 s (seeded) one random producer worker gets SIGKILL.

This process is the consumer (BatchClient). It checks every row of every batch
against the item it claims to be (producer.sources.check_synthetic_rows: a torn
or misplaced row counts as torn), and every completed epoch against its plan:
the items in plan order, each exactly once, the two poison items never.

Reported at the end: delivered, skipped, lost, duplicated and torn; kills; the
poison items' quarantine lines (one each per run); messages the link dropped
and the stager's counters; the RSS of every process after warm-up and at the
end; the run's /dev/shm segments before and after. Targets: 0 lost,
duplicated or torn; each poison item quarantined once; RSS growth < 5 % after
warm-up for the long-lived processes; segments equal. Workers are replaced by
the kills, so their row compares the mean of the live workers.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.consumer.stager.plan.plan import Plan  # noqa: E402
from ringfeed.consumer.stager.plan.shuffle import Shuffle  # noqa: E402
from ringfeed.consumer.stager.quarantine import read_quarantine  # noqa: E402
from ringfeed.producer.sources import RowMismatch, check_synthetic_rows  # noqa: E402
from ringfeed.scripts.lossy_link import LossyLink  # noqa: E402
from ringfeed.scripts.runner import Run, worker_pids  # noqa: E402
from ringfeed.shared.config import Config, config_from_dict  # noqa: E402
from ringfeed.shared.memory.segments import list_segments  # noqa: E402
from tests.support.fault_sources import inject_faults  # noqa: E402

N_ITEMS = 2000
POISON_RAISE, POISON_EXIT = 7, 1234
RSS_TARGET_PCT = 5.0
EXIT_WAIT_S = 20.0
# No batch for this long is a stall: the soak stops and reports it.
STALL_S = 30.0
# The pool exits on its own once the stager's SHUTDOWN reached every worker.
POOL_GRACE_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --fields: every kind of optional field (synthesized: the user function is never called).
FIELDS = {
    "reference": True,
    "reference_frames": 16,
    "pitch": True,
    "energy": True,
    "durations_dir": "unused-with-synthetic-data",
    "user_function": "unused:synthetic",
    "user_version": "soak",
    "user_fields": [
        {"name": "emotion", "dtype": "int32", "shape": [2], "length": "none"},
        {"name": "style", "dtype": "float32", "shape": [4, 3], "length": "own", "pad": -1.0},
        {"name": "loudness", "dtype": "float32", "shape": [], "length": "frames"},
    ],
}


def soak_config(root: Path, workers: int, port: int, fields: bool = False) -> dict:
    return {
        "data": {"format": "synthetic", "synthetic_items": N_ITEMS},
        "features": {"max_frames": 64, "cache": False, **(FIELDS if fields else {})},
        "text": {"max_text_len": 32},
        # Every producer remote: nothing local to audit them with (docs/faults-and-
        # security.md#audits), so no audit waits for one.
        "ring": {
            "lease_s": 1.0,
            "heartbeat_s": 0.2,
            "audit_first": 0,
            "audit_fraction": 0.0,
        },
        "stager": {"batch_size": 8, "epochs": 100_000},
        "producers": {"workers": workers, "restart_backoff_s": 0.0, "max_restarts": 10**6},
        "transport": {"kind": "tcp", "host": "127.0.0.1", "port": port},
        "run_root": str(root / "runs"),
    }


def rss_kb(pid: int) -> int:
    """VmRSS of a live process in KiB (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return next((int(s.split()[1]) for s in text.splitlines() if s.startswith("VmRSS:")), 0)


def rss_table(stager: int, pool: int) -> dict[str, float]:
    workers = [r for r in map(rss_kb, worker_pids(pool)) if r]
    return {
        "stager": rss_kb(stager),
        "pool": rss_kb(pool),
        "workers (mean)": sum(workers) / max(1, len(workers)),
        "consumer": rss_kb(os.getpid()),
    }


class EpochCheck:
    """Items in delivery order, checked against the plan (less the poison items) one
    completed epoch at a time; every row checked against the item it claims to be."""

    def __init__(self, cfg: Config) -> None:
        self.cfg, self.plan = cfg, Plan(Shuffle(N_ITEMS, cfg.stager.seed))
        self.poison = {POISON_RAISE, POISON_EXIT}
        self.per_epoch = N_ITEMS - len(self.poison)
        self.pending: list[int] = []
        self.epochs = self.lost = self.duplicated = self.out_of_order = self.torn = 0
        self.first_torn = ""

    def add(self, arrays: dict, n_valid: int) -> None:
        try:
            items = check_synthetic_rows(arrays, n_valid, self.cfg)
        except RowMismatch as exc:
            self.torn += 1
            self.first_torn = self.first_torn or str(exc)
            items = [int(i) for i in arrays["items"][:n_valid]]
        self.pending.extend(items)
        while len(self.pending) >= self.per_epoch:
            got, self.pending = self.pending[: self.per_epoch], self.pending[self.per_epoch :]
            want = [i for i in self.plan.layout(self.epochs).order.tolist() if i not in self.poison]
            counts = collections.Counter(got)
            self.lost += len(set(want) - set(counts))
            self.duplicated += sum(c - 1 for c in counts.values() if c > 1)
            self.out_of_order += got != want and counts == collections.Counter(want)
            self.epochs += 1


@dataclass
class Outcome:
    check: EpochCheck
    kills: int = 0
    rss0: dict = field(default_factory=dict)
    rss1: dict = field(default_factory=dict)
    stalled: float | None = None


def wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """Exit code, or None if it still runs after timeout_s."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def soak(args: argparse.Namespace, tmp: Path) -> int:
    stager_port, link_port = free_port(), free_port()
    raw = soak_config(tmp, args.workers, stager_port, args.fields)
    cfg_path = tmp / "soak.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    inject_faults(cfg_path, raise_items=[POISON_RAISE], exit_items=[POISON_EXIT], delay_s=0.002)
    cfg = config_from_dict(raw)
    run_id = f"soak-{uuid.uuid4().hex[:6]}"
    shm_before = sorted(p.name for p in list_segments())
    link = LossyLink(link_port, stager_port, args.drop, seed=args.seed)
    with Run(cfg_path, run_id, tmp) as run:
        stager = run.start("stager")
        link.start()
        pool = run.start("producers", "--remote", "--connect", f"tcp://127.0.0.1:{link_port}")
        client = run.client("soak")
        out = soak_loop(args, cfg, client, stager, pool)
        client.close(finished=True)
        codes = {"stager": wait(stager, EXIT_WAIT_S), "producers": wait(pool, POOL_GRACE_S)}
        if codes["producers"] is None:
            # Workers that missed the stager's SHUTDOWN on the lossy link wait for their
            # orphan timeout; a launcher SIGTERMs the pool instead (scripts/runner.py).
            pool.send_signal(signal.SIGTERM)
            codes["producers"] = wait(pool, EXIT_WAIT_S)
        for name, proc in (("stager", stager), ("producers", pool)):
            if proc.poll() is None:  # Run's exit kills it; say so in the table
                codes[name] = "SIGKILLed"
    link.stop.set()
    summary = json.loads((tmp / "runs" / run_id / "stager.json").read_text())
    quarantine = read_quarantine(tmp / "runs" / run_id / "quarantine.jsonl")
    shm = (shm_before, sorted(p.name for p in list_segments()))
    if out.stalled is not None:
        print(f"STALL: no batch for {STALL_S:.0f} s after {out.stalled:.1f} s of soak")
    code = report(args, out, summary, quarantine, link.dropped, codes, shm)
    return 1 if out.stalled is not None else code


def soak_loop(args, cfg: Config, client, stager, pool) -> Outcome:
    """Consume and check while killing workers."""
    rng, out = random.Random(args.seed), Outcome(EpochCheck(cfg))
    warmup_s = min(30.0, args.seconds / 6)
    t0 = time.monotonic()
    next_kill = t0 + rng.uniform(0.5, 3.0)
    while (now := time.monotonic()) - t0 < args.seconds:
        try:
            batch = client.next(timeout_s=STALL_S)
        except TimeoutError:
            out.stalled = now - t0
            break
        if batch is None:
            break
        out.check.add(batch.arrays, batch.meta.n_valid)
        client.free(batch)
        if not out.rss0 and now - t0 >= warmup_s:
            out.rss0 = rss_table(stager.pid, pool.pid)
        if now >= next_kill:
            pids = worker_pids(pool.pid)
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                out.kills += 1
            next_kill = now + rng.uniform(0.5, 3.0)
    out.rss1 = rss_table(stager.pid, pool.pid)
    out.rss0 = out.rss0 or out.rss1
    return out


def report(args, out: Outcome, summary, quarantine, link_dropped, codes, shm) -> int:
    """Print the summary table; returns 0 when every target is met."""
    c, check = summary["counters"], out.check
    print(
        f"soak: {args.seconds:.0f} s, seed {args.seed}, {args.workers} remote workers, "
        f"link drops {args.drop:.1%} of messages, synthetic data"
    )
    print(f"delivered {c['delivered']}  skipped {c['skipped']}  epochs checked {check.epochs}")
    print(
        f"lost {check.lost}  duplicated {check.duplicated}  torn rows {check.torn}  "
        f"out of plan order {check.out_of_order}"
    )
    if check.first_torn:
        print(f"first torn row: {check.first_torn}")
    poison = collections.Counter(r["item_id"] for r in quarantine)
    wanted = {f"synthetic-{i:06d}": 1 for i in (POISON_RAISE, POISON_EXIT)}
    print(f"quarantine {dict(poison)} (want {wanted})")
    print(f"kills {out.kills}  messages dropped by the link {link_dropped}")
    print(f"stager: {json.dumps(c)}  dropped {json.dumps(summary['dropped'])}")
    print(f"exit codes {codes}")
    print(f"{'process':16s} {'RSS warm KiB':>13s} {'RSS end KiB':>12s} {'growth':>8s}")
    ok = True
    for name in out.rss1:
        growth = 100.0 * (out.rss1[name] - out.rss0[name]) / max(1.0, out.rss0[name])
        ok &= name.startswith("workers") or growth < RSS_TARGET_PCT
        print(f"{name:16s} {out.rss0[name]:13.0f} {out.rss1[name]:12.0f} {growth:7.1f}%")
    before, after = shm
    print(f"/dev/shm ringfeed segments before {len(before)} {before}, after {len(after)} {after}")
    ok &= check.lost == check.duplicated == check.out_of_order == check.torn == 0
    ok &= before == after and dict(poison) == wanted
    ok &= codes == {"stager": 0, "producers": 0}
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--drop", type=float, default=0.002, help="fraction of messages lost")
    parser.add_argument("--fields", action="store_true", help="every kind of sample field")
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
