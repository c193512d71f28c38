"""Attacks: honest producers beside one CURVE key (or a second consumer) that attacks.

    .venv/bin/python benchmarks/attacks.py [--items 3000] [--repeats 3] [--crash-per-s 2000]
        [--attacks all-at-once,second-consumer] [--no-bans]

Data: ``data.format: synthetic`` (5 ms of work per sample, so the producers set
the pace), one epoch, 2 honest local workers, a tcp socket with CURVE keys. Each
attack is a kind of run of its own (tests/support/liars.py):

- all-at-once: one key (a compromised producer host) runs four strategies at once:
  a malformed READY per grant with HELLO again after each; a fast remote producer
  whose every READY has the right rows and a wrong checksum; 30 identities that
  join, ask for grants, heartbeat and never deliver; CRASH reports of 16 KiB with
  terminal escapes, ``--crash-per-s`` a second;
- second-consumer: a second BatchClient in the consumer's own process (another
  thread, the run's secret) tries to take the run every 0.2 s;
- name-squatting: the key joins first under the names the honest pool will use
  (honest-0, honest-1: the pool starts with --name honest) and heartbeats;
- undecodable-flood: the key sends undecodable messages as fast as its socket takes
  them, never a HELLO;
- mute-identities: 30 identities of the key join, ask for grants, heartbeat and never
  deliver;
- charge-laundering: 4 identities of the key take grants and fall silent past the
  lease, again and again, alone for three rounds before the honest pool joins (each
  such lease would charge its item: 3 of them quarantined innocent items);
- slow-walker: the key answers every grant validly, but at 85 % of its lease;
- made-up-content: the key answers every grant at once with another item's valid rows,
  hashed as an honest producer would (every check but an audit passes);
- skips-everything: the key answers every grant at once with a SKIP (unreadable audio).

Runs, ``--repeats`` times each, interleaved: no attacker (the baseline), then each
attack, and with ``--no-bans`` all-at-once with ``ring.max_strikes: 0`` (fair share
per key, shrinking grant limits and rate-limited logs alone). Reported per kind: the
median honest throughput (items of the epoch delivered per second) and its ratio
to the baseline, items quarantined (none is bad), the stager log's size, strikes,
bans, the attacker's refusals and the stager's CPU seconds. Every row of every batch
is checked against its item, each item delivered once. Targets: throughput ratio >=
0.8, 0 items quarantined, stager log < 10 MiB.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.consumer.stager.quarantine import read_quarantine  # noqa: E402
from ringfeed.scripts.runner import Run  # noqa: E402
from ringfeed.shared.config import load_config  # noqa: E402
from ringfeed.shared.wire.keys import generate  # noqa: E402
from tests.support.checks import assert_exactly_once, consume  # noqa: E402
from tests.support.fault_sources import inject_faults  # noqa: E402
from tests.support.liars import (  # noqa: E402
    bad_checksums,
    crash_flood,
    in_thread,
    lie_per_grant,
    made_up,
    name_squatter,
    second_consumers,
    silent_holders,
    silent_identities,
    skips_all,
    slow_walker,
    undecodable_flood,
)
from tests.support.ports import free_port  # noqa: E402

NO_BANS = "all-at-once, no bans"


def write_config(tmp: Path, items: int, max_strikes: int) -> tuple[Path, str, str]:
    keys, port = tmp / "keys", free_port()
    bundle = generate(keys, "attacker")
    raw = {
        "data": {"format": "synthetic", "synthetic_items": items},
        "features": {"max_frames": 64, "cache": False},
        "text": {"max_text_len": 32},
        "ring": {"lease_s": 1.0, "heartbeat_s": 0.2, "max_strikes": max_strikes},
        "stager": {"batch_size": 8, "epochs": 1},
        "producers": {"workers": 2},
        "transport": {"kind": "tcp", "host": "127.0.0.1", "port": port, "keys_dir": str(keys)},
        "run_root": str(tmp / "runs"),
    }
    path = tmp / "attack.yaml"
    path.write_text(yaml.safe_dump(raw))
    inject_faults(path, delay_s=0.005)
    return path, str(bundle), f"tcp://127.0.0.1:{port}"


def all_at_once(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    """Every producer strategy of the one key; returns their (thread, tally) pairs."""
    return [
        in_thread(lie_per_grant, cfg, endpoint, key, stop, "malformed"),
        in_thread(bad_checksums, cfg, endpoint, key, stop),
        in_thread(silent_identities, cfg, endpoint, key, stop, 30),
        in_thread(crash_flood, cfg, endpoint, key, stop, args.crash_per_s),
    ]


def second_consumer(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    return [in_thread(second_consumers, cfg, run_id, stop)]


def name_squatting(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    names = [f"{HONEST}-{k}" for k in range(cfg.producers.workers)]
    return [in_thread(name_squatter, cfg, endpoint, key, stop, names)]


def flood(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    return [in_thread(undecodable_flood, cfg, endpoint, key, stop)]


def mute(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    return [in_thread(silent_identities, cfg, endpoint, key, stop, 30)]


def laundering(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    pairs = [in_thread(silent_holders, cfg, endpoint, key, stop, 4)]
    time.sleep(3 * 2.5 * cfg.ring.lease_s)  # alone: three rounds of silent leases
    return pairs


def walker(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    return [in_thread(slow_walker, cfg, endpoint, key, stop)]


def making_up(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    return [in_thread(made_up, cfg, endpoint, key, stop, "another")]


def skipping(
    cfg, run_id: str, endpoint: str, key: str, stop: threading.Event, args: argparse.Namespace
) -> list:
    return [in_thread(skips_all, cfg, endpoint, key, stop)]


ATTACKS = {
    "all-at-once": all_at_once,
    "second-consumer": second_consumer,
    "name-squatting": name_squatting,
    "undecodable-flood": flood,
    "mute-identities": mute,
    "charge-laundering": laundering,
    "slow-walker": walker,
    "made-up-content": making_up,
    "skips-everything": skipping,
}
# The honest pool's name prefix: its workers are honest-0, honest-1, ...
HONEST = "honest"


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process pid has used so far, seconds (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(kind: str, args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="ringfeed-attack-"))
    cfg_path, key, endpoint = write_config(tmp, args.items, 0 if kind == NO_BANS else 3)
    cfg, run_id, stop = load_config(cfg_path), f"atk-{uuid.uuid4().hex[:6]}", threading.Event()
    with Run(cfg_path, run_id, tmp) as run:
        run.start("stager")
        client = run.client("attacks", timeout_s=60)
        strategy = ATTACKS.get(kind.removesuffix(", no bans"))
        liars = strategy(cfg, run_id, endpoint, key, stop, args) if strategy else []
        time.sleep(1.0)  # the attacker first: it holds the ring when the honest ones join
        t0 = time.monotonic()
        run.start("producers", "--name", HONEST)
        items = consume(client, timeout_s=300)
        elapsed = time.monotonic() - t0
        cpu_s = cpu_seconds(run.procs["stager"].pid)
        stop.set()
        for thread, _ in liars:
            thread.join(5)
        client.close()
        run.wait("stager", 30)
        run.wait("producers", 30)
        log_bytes = sum(f.stat().st_size for f in tmp.glob(f"{run_id}-stager-*.log"))
    assert_exactly_once(items, cfg, args.items)  # every row checked, each item once
    summary = run.json("stager.json")
    errors = [e for _, tally in liars for e in tally.errors]
    return {
        "items_per_s": args.items / elapsed,
        "quarantined": len(read_quarantine(tmp / "runs" / run_id / "quarantine.jsonl")),
        "log_mib": log_bytes / 2**20,
        "strikes": summary["counters"]["strikes"],
        "banned": summary["counters"]["peers_banned"],
        "dropped": dict(summary["dropped"]),
        "lies": sum(tally.lies for _, tally in liars),
        "refusals": sum(tally.refusals for _, tally in liars),
        "stager_cpu_s": cpu_s,
        "errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--crash-per-s", type=int, default=2000)
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="which, by name")
    parser.add_argument("--no-bans", action="store_true", help="also run without bans")
    args = parser.parse_args()
    kinds = ["baseline", *args.attacks.split(",")] + ([NO_BANS] if args.no_bans else [])
    unknown = set(kinds) - {"baseline", NO_BANS, *ATTACKS}
    if unknown:
        parser.error(f"--attacks: unknown {sorted(unknown)}; known: {', '.join(ATTACKS)}")
    results: dict[str, list[dict]] = collections.defaultdict(list)
    for r in range(args.repeats):
        for kind in kinds:
            results[kind].append(one_run(kind, args))
            print(f"repeat {r} {kind}: {results[kind][-1]}", flush=True)
    base = statistics.median(x["items_per_s"] for x in results["baseline"])
    print(
        f"\n{'run':22} {'items/s':>8} {'ratio':>6} {'quarantined':>11} {'log MiB':>8} "
        f"{'strikes':>7} {'banned':>6} {'lies':>8} {'refused':>8} {'cpu s':>6}"
    )
    failed = False
    for kind in kinds:
        runs = results[kind]
        rate = statistics.median(x["items_per_s"] for x in runs)
        worst_log = max(x["log_mib"] for x in runs)
        quarantined = max(x["quarantined"] for x in runs)
        print(
            f"{kind:22} {rate:8.1f} {rate / base:6.2f} {quarantined:11d} {worst_log:8.2f} "
            f"{statistics.median(x['strikes'] for x in runs):7.0f} "
            f"{statistics.median(x['banned'] for x in runs):6.0f} "
            f"{statistics.median(x['lies'] for x in runs):8.0f} "
            f"{statistics.median(x['refusals'] for x in runs):8.0f} "
            f"{statistics.median(x['stager_cpu_s'] for x in runs):6.1f}"
        )
        # Without bans nothing bounds a key that lies: its row is shown, not a target.
        failed |= kind != NO_BANS and (rate / base < 0.8 or quarantined > 0 or worst_log > 10)
        failed |= any(x["errors"] for x in runs)
    for kind in kinds[1:]:
        print(f"dropped ({kind}, last run): {results[kind][-1]['dropped']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
