"""Producers as Ray actors: `ringfeed producers CONFIG --ray ADDRESS --connect tcp://HEAD:PORT`.

Ray does what a cluster engine is for: it places one producer process per
actor on the cluster's nodes (``producers.per_node`` per node, or one per CPU
the node offers), restarts an actor whose process dies or whose node is lost
(on another node: the placement is a soft affinity), and this driver gives
nodes that join while the run goes on their producers too. ringfeed keeps its
own data plane: each actor is a remote producer (producer/process/worker.py) that
connects to the stager's tcp endpoint with CURVE and sends its samples as
payload frames; nothing of a sample passes through Ray's object store.

Environment. Actors do not inherit the driver's environment (a raylet starts
them), so the driver hands them the one variable a producer reads from it, the
source hook (shared/config/config.py source_hook_env), as Ray's runtime_env.

Keys. The driver reads the client key bundle (``transport.keys_dir`` on its
host) and hands the keys to each actor as a task argument, so no one copies
files to the nodes. That goes over Ray's own channels, which are not
encrypted unless the cluster runs with TLS (RAY_USE_TLS=1 and its
certificates); docs/scaling-out.md#on-a-ray-cluster says which set-ups are safe.

The driver ends when every actor's producer has ended for good (the stager said
the run is over, went silent, or refused it: producer/process/session.py ENDINGS; such an
actor is not replaced), with producer/process/session.py pool_exit_code's code, and
stops its actors on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from ringfeed.producer.process.session import ENDINGS, EXIT_FINISHED, pool_exit_code
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import source_hook_env
from ringfeed.shared.run.process import POLL_S, StopFlag, Stopped
from ringfeed.shared.wire.keys import ClientKeys, load_client

log = logging.getLogger(__name__)

# How often the driver looks for new nodes and finished actors, seconds.
WATCH_S = 1.0
# One producer per actor, one CPU each; Ray restarts a failed actor and retries its run.
ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "max_restarts": -1, "max_task_retries": -1}


class ProducerActor:
    """One remote producer in a Ray actor process (decorated with ray.remote at use)."""

    def run(self, cfg_yaml: str, endpoint: str, keys: dict[str, bytes] | None) -> int:
        import ray

        from ringfeed.producer.process.worker import run_worker
        from ringfeed.shared.config import config_from_yaml
        from ringfeed.shared.run.process import setup_logging

        setup_logging()
        cfg = config_from_yaml(cfg_yaml)
        ctx = ray.get_runtime_context()
        actor, node = ctx.get_actor_id()[:12], ctx.get_node_id()[:12]
        name = f"{socket.gethostname()}.ray-{actor}-{os.getpid()}"
        place = f"ray actor {actor} on node {node}"
        client_keys = ClientKeys(**keys) if keys else None
        # Ray owns this process's signals: the stager's SHUTDOWN or ray.kill ends it.
        return run_worker(cfg, name, endpoint, True, None, client_keys, place, StopFlag())


def alive_nodes(nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Node id -> CPUs it offers, for the alive nodes that offer any."""
    return {
        n["NodeID"]: int(n.get("Resources", {}).get("CPU", 0))
        for n in nodes
        if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1
    }


def key_payload(cfg: Config, endpoint: str) -> dict[str, bytes] | None:
    """The client keys to hand to actors, when the endpoint needs CURVE."""
    if not (endpoint.startswith("tcp://") and cfg.transport.keys_dir):
        return None
    keys = load_client(Path(cfg.transport.keys_dir))
    return {"public": keys.public, "secret": keys.secret, "server_public": keys.server_public}


class RayProducers:
    """The driver: places actors on nodes, replaces failed ones, waits for the end."""

    def __init__(self, cfg: Config, endpoint: str) -> None:
        import ray

        self.ray, self.cfg, self.endpoint = ray, cfg, endpoint
        self.actor_class = ray.remote(ProducerActor)
        self.cfg_yaml, self.keys = cfg.to_yaml(), key_payload(cfg, endpoint)
        env = source_hook_env()
        self.options = {**ACTOR_OPTIONS, **({"runtime_env": {"env_vars": env}} if env else {})}
        self.placed: set[str] = set()
        self.running: dict[Any, tuple[str, Any]] = {}  # run ref -> (node id, actor)
        self.endings: list[int] = []  # the exit codes of actors that ended for good

    def start(self, node_id: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = NodeAffinitySchedulingStrategy(node_id, soft=True)
        actor = self.actor_class.options(scheduling_strategy=strategy, **self.options).remote()
        self.running[actor.run.remote(self.cfg_yaml, self.endpoint, self.keys)] = (node_id, actor)

    def place_new_nodes(self) -> None:
        for node_id, cpus in alive_nodes(self.ray.nodes()).items():
            if node_id in self.placed:
                continue
            self.placed.add(node_id)
            n = self.cfg.producers.per_node or cpus
            for _ in range(n):
                self.start(node_id)
            log.info("node %s: %d producer actor(s)", node_id[:12], n)

    def collect(self) -> None:
        """Wait up to WATCH_S for actors that ended; start another for each failure."""
        done, _ = self.ray.wait(list(self.running), num_returns=1, timeout=WATCH_S)
        for ref in done:
            node_id, _ = self.running.pop(ref)
            try:
                code = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                log.warning("a producer actor failed for good (%s); starting another", exc)
                self.start(node_id)
                continue
            if code in ENDINGS:
                self.endings.append(code)
                if code != EXIT_FINISHED:
                    log.error("a producer actor %s; not starting another", ENDINGS[code])
            else:
                log.warning("a producer actor exited with %d; starting another", code)
                self.start(node_id)

    def stop_all(self) -> None:
        for _, actor in self.running.values():
            self.ray.kill(actor)
        self.running.clear()


def main(cfg: Config, address: str, endpoint: str) -> int:
    """Process entry of `ringfeed producers --ray ADDRESS`: 0 when the run is over."""
    try:
        import ray
    except ImportError:
        log.error("--ray needs Ray on this host: pip install 'ringfeed[ray]'")
        return 2
    if not endpoint.startswith("tcp://"):
        log.error("--ray needs --connect tcp://HEAD:PORT (the stager's transport.port)")
        return 2
    stop = StopFlag().install()
    try:
        with stop.raising():  # joining a cluster takes seconds: a stop meanwhile ends it there
            ray.init(address=address, logging_level=logging.WARNING)
    except Stopped as exc:
        log.info("producers: %s", exc)
        ray.shutdown()  # whatever ray.init had set up when the signal came
        return 0
    driver = RayProducers(cfg, endpoint)
    try:
        while not stop.is_set():
            driver.place_new_nodes()
            if not driver.running and driver.endings:
                log.info("every producer actor ended: the run is over")
                return pool_exit_code(driver.endings)
            if not driver.running:
                stop.wait(POLL_S)  # no node offers a CPU yet
                continue
            driver.collect()
        return 0
    finally:
        driver.stop_all()
        ray.shutdown()
