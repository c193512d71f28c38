"""Producers on two Ray nodes against the same producers started by hand, side by side.

    .venv/bin/python benchmarks/ray_producers.py [--rounds 3] [--items 4000]

One Ray cluster on this machine (ray.cluster_utils: a head without CPUs and two
nodes, each its own raylet). Each round runs both variants, alternating, each
a real run: a stager with a tcp endpoint, a consumer in this process, and two
remote producers (synthetic items with 2 ms of work each, so the producers
set the pace):

- hand: two `ringfeed producers --remote --connect tcp://...` processes;
- ray: `ringfeed producers --ray ADDRESS --connect tcp://...` with
  producers.per_node: 1, one actor on each node.

samples/s is counted from 10 % to 90 % of the epoch delivered (start-up and
the tail excluded: the question is what the engine costs while it runs). The table gives the
medians and the ratio ray / hand (target: the engine costs under 5 %).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.scripts.runner import Run  # noqa: E402
from tests.support.fault_sources import inject_faults  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(tmp: Path, items: int, port: int) -> Path:
    raw = {
        "data": {"format": "synthetic", "synthetic_items": items},
        "features": {"max_frames": 200, "cache": False},
        "text": {"max_text_len": 64},
        "stager": {"batch_size": 16, "epochs": 1},
        "producers": {"workers": 1, "per_node": 1},
        "transport": {"kind": "tcp", "host": "127.0.0.1", "port": port},
        "run_root": str(tmp / "runs"),
    }
    path = tmp / f"ray-bench-{port}.yaml"
    path.write_text(yaml.safe_dump(raw))
    # 2 ms of work per sample, through the source hook (Ray actors get it from the driver).
    inject_faults(path, delay_s=0.002)
    return path


def one_run(variant: str, tmp: Path, items: int, address: str) -> float:
    port = free_port()
    cfg_path = config(tmp, items, port)
    connect = ["--connect", f"tcp://127.0.0.1:{port}"]
    with Run(cfg_path, f"rb-{uuid.uuid4().hex[:6]}", tmp) as run:
        run.start("stager")
        if variant == "ray":
            run.procs["ray"] = run.start("producers", "--ray", address, *connect)
        else:
            for k in range(2):
                run.procs[f"hand{k}"] = run.start(
                    "producers", "--remote", "--name", f"hand{k}", *connect
                )
        client = run.client(timeout_s=120)
        marks: dict[int, tuple[float, int]] = {}
        delivered = 0
        while (batch := client.next(timeout_s=120)) is not None:
            delivered += batch.meta.n_valid
            client.free(batch)
            for share in (10, 90):  # the steady middle: start-up and the tail excluded
                if share not in marks and delivered >= items * share // 100:
                    marks[share] = (time.perf_counter(), delivered)
        client.close()
        run.wait_all(60)
    if delivered != items:
        raise RuntimeError(f"{variant}: delivered {delivered} of {items}")
    (t0, n0), (t1, n1) = marks[10], marks[90]
    return (n1 - n0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=4000)
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    store = {"object_store_memory": 80 * 2**20}
    head = {"num_cpus": 0, "include_dashboard": False, **store}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, **store)
        cluster.wait_for_nodes()
        rates: dict[str, list[float]] = {"hand": [], "ray": []}
        with tempfile.TemporaryDirectory(prefix="ringfeed-ray-") as tmp_name:
            for r in range(args.rounds):
                order = ("hand", "ray") if r % 2 == 0 else ("ray", "hand")
                for variant in order:
                    rate = one_run(variant, Path(tmp_name), args.items, cluster.address)
                    rates[variant].append(rate)
                    print(f"round {r + 1} {variant}: {rate:,.0f} samples/s", flush=True)
    finally:
        cluster.shutdown()
    hand, ray_ = statistics.median(rates["hand"]), statistics.median(rates["ray"])
    print(f"\nmedian of {args.rounds} rounds, {args.items} items, 2 producers, 2 ms each")
    print(f"hand  {hand:8,.0f} samples/s")
    print(f"ray   {ray_:8,.0f} samples/s")
    print(f"ray / hand = {ray_ / hand:.3f}")


if __name__ == "__main__":
    main()
