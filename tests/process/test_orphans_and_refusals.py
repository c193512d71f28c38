"""Producers that must end rather than say HELLO forever: a remote pool whose stager was
SIGKILLed, a producer of another protocol version, a pool with another config."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ringfeed.producer.prepare.prepare import prepare
from ringfeed.producer.process.session import EXIT_REFUSED
from ringfeed.scripts.runner import worker_pids
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints
from ringfeed.shared.run.process import POOL_ORPHANED
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small, tcp
from tests.support.corpora import shipped_corpus, shipped_lines
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.processes import CLI, send_signal
from tests.support.runs import Run, finish, rid
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow

# The orphan time these tests give producers (producers.orphan_s), seconds.
ORPHAN_S = 3.0


def tcp_config(folder: Path, port: int, **over: dict) -> Path:
    folder.mkdir(exist_ok=True)
    transport = tcp(port)
    producers = {"workers": 2, "orphan_s": ORPHAN_S}
    return small(folder, items=200, transport=transport, producers=producers, **over)


def start_remote_pool(run: Run, config: Path, port: int, name: str) -> subprocess.Popen:
    """`ringfeed producers CONFIG --remote --connect tcp://...` under the run, as `name`,
    its host's corpus prepared first (as `ringfeed validate --role producer` does)."""
    prepare(load_config(config))
    cmd = [*CLI, "producers", str(config), "--run-id", run.run_id]
    cmd += ["--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", name]
    with (run.log_dir / f"{run.run_id}-{name}.log").open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    run.procs[name] = proc
    return proc


def test_a_remote_pool_exits_when_its_stager_is_sigkilled(tmp_path: Path) -> None:
    """It says HELLO again every lease, which must not keep it alive: ORPHAN_S after the
    stager's last word, each worker exits as an orphan and the pool ends, non-zero."""
    port = free_port()
    config = tcp_config(tmp_path, port)
    cfg, run_id = load_config(config), rid()
    with Run(config, run_id, tmp_path) as run, StatsReader(endpoints(cfg, run_id).stats) as stats:
        run.start("stager")
        pool = start_remote_pool(run, config, port, "far")
        both = lambda s: sum(pr["name"].startswith("far") for pr in s["producers"]) == 2  # noqa: E731
        stats.first(both, 30, "both remote producers joining")
        run.signal("stager", signal.SIGKILL)
        killed_at = time.monotonic()
        run.wait("stager", 10)
        code = pool.wait(30)
        took_s = time.monotonic() - killed_at
        logs = run.logs(tail=100_000)
    assert code == POOL_ORPHANED, logs
    # ORPHAN_S, plus a heartbeat, the pool's grace for its other worker and its exit.
    assert took_s < ORPHAN_S + 8, f"the pool took {took_s:.1f} s\n{logs}"
    assert "saying HELLO again" in logs  # it did keep trying, and still ended
    assert logs.count("lost its stager (no word for producers.orphan_s); not restarting it") >= 1
    assert "restart 1/" not in logs and "restarting it" not in logs.replace("not restarting", "")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_producer_of_another_protocol_version_exits_naming_both(
    tmp_path: Path, where: str
) -> None:
    """A producer of the protocol before grants by the run (6), on this host's socket or
    over tcp as another host's: refused, both versions named."""
    port = free_port()
    config = tcp_config(tmp_path, port) if where == "remote" else small(tmp_path, items=50)
    run_id, old = rid(), p.VERSION - 1
    with Run(config, run_id, tmp_path) as run:
        run.start("stager")
        ends = endpoints(load_config(config), run_id)
        endpoint = f"tcp://127.0.0.1:{port}" if where == "remote" else ends.control
        cmd = [sys.executable, "tests/support/old_producer.py", str(config), endpoint, str(old)]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        logs = run.logs()
    said = out.stdout + out.stderr
    assert out.returncode == EXIT_REFUSED, said
    assert f"protocol version {p.VERSION}, the peer version {old}" in said, said
    assert "run the same ringfeed version on every host" in said
    assert f"protocol version {old}, expected {p.VERSION}" in logs  # counted as malformed


def test_a_pool_with_another_config_is_refused_and_not_restarted(tmp_path: Path) -> None:
    """Another hop and an alphabet of the same size in another order: samples that fit
    the slots and mean something else. The stager refuses each worker, naming the keys;
    the pool ends with exit code 2 and restarts none."""
    port = free_port()
    config = tcp_config(tmp_path, port)
    alphabet = "".join(reversed(load_config(config).text.alphabet))
    other = tcp_config(
        tmp_path / "other", port, features={"hop_length": 128}, text={"alphabet": alphabet}
    )
    with Run(config, rid(), tmp_path) as run:
        run.start("stager")
        pool = start_remote_pool(run, other, port, "odd")
        code = pool.wait(60)
        logs = run.logs(tail=100_000)
    assert code == 2, logs
    refusal = "this producer's config differs from the stager's in text.alphabet, features"
    assert logs.count(refusal) >= 2, logs  # each worker says it, and the stager counts it
    assert "features.hop_length" in logs and "start it with the same config file" in logs
    ended = "was refused, by the stager or by its start check (the logs say why); not restarting"
    assert logs.count(ended) == 2
    assert "restart 1/" not in logs


def test_a_host_whose_corpus_lists_the_clips_in_another_order_is_refused(
    tmp_path: Path,
) -> None:
    """The same clips and item count, metadata in another order: it used to join and
    pair one clip's mel with another clip's text. Now its HELLO's corpus digest differs,
    the stager refuses it saying so, and the pool ends with exit code 2."""
    shipped = shipped_lines()[:3]

    def corpus(name: str, lines: list[str]) -> dict:
        return {"format": "ljspeech", "path": str(shipped_corpus(tmp_path / name, lines))}

    port = free_port()
    config = tcp_config(tmp_path / "head", port, data=corpus("head-data", shipped))
    other = tcp_config(tmp_path / "far", port, data=corpus("far-data", shipped[::-1]))
    with Run(config, rid(), tmp_path) as run:
        run.start("stager")
        pool = start_remote_pool(run, other, port, "far")
        code = pool.wait(60)
        logs = run.logs(tail=100_000)
    assert code == 2, logs
    assert logs.count("this producer's corpus differs from the stager's") >= 2, logs
    assert "config differs" not in logs


def test_the_only_producer_stopped_past_its_orphan_time_comes_back(tmp_path: Path) -> None:
    """SIGSTOP of the run's only producer for longer than producers.orphan_s, then
    SIGCONT: its silence was its own, not the stager's. It says HELLO again instead of
    exiting as an orphan, and the run delivers its epoch exactly once."""
    n = 200
    producers = {"workers": 1, "orphan_s": ORPHAN_S}
    config = small(tmp_path, items=n, delay_s=0.005, producers=producers)
    cfg = load_config(config)
    stopped: list[int] = []

    def stop_once(n_items: int) -> None:
        if stopped:
            return
        (pid,) = worker_pids(pool.pid)
        stopped.append(pid)
        send_signal(pid, signal.SIGSTOP)
        time.sleep(ORPHAN_S + 1.5)  # past its orphan time, and past the stager's lease
        send_signal(pid, signal.SIGCONT)

    with Run(config, rid(), tmp_path) as run:
        run.start("stager")
        pool = run.start("producers")
        client = run.client(timeout_s=30)
        items = consume(client, on_batch=stop_once)
        client.close()
        finish(run, "producers")
        logs = run.logs(tail=100_000)
    assert stopped, "the producer was never stopped"
    assert_exactly_once(items, cfg, n)
    assert "did not run for" in logs and "lost its stager" not in logs, logs


def test_a_pool_orphaned_by_a_paused_stager_is_started_again_and_the_run_completes(
    tmp_path: Path,
) -> None:
    """The stager SIGSTOPped past producers.orphan_s: every worker exits as an orphan
    and the pool exits 1 while the stager still runs. The launcher used to end the run
    (or, before, carry on with no producers); it starts the pool again, and once the
    stager continues the run delivers its epoch."""
    n = 600
    config = small(tmp_path, items=n, producers={"workers": 2, "orphan_s": ORPHAN_S})
    with Run(config, rid(), tmp_path) as run:
        run.verb_args["drain"] = ["--step-s", "0.05"]  # 75 batches: ~4 s of run
        run.start_all("drain")
        stager = run.procs["stager"]

        def pause_the_stager() -> None:
            wait_for(lambda: "joined" in run.logs(tail=100_000), 60, "a producer joined")
            stager.send_signal(signal.SIGSTOP)
            try:  # the workers' orphan time passes, the pool exits, watch starts it again
                wait_for(lambda: run.pool_restarts, ORPHAN_S + 30, "the pool started again")
            finally:
                stager.send_signal(signal.SIGCONT)

        pauser = threading.Thread(target=pause_the_stager)
        pauser.start()
        code = run.watch()
        pauser.join()
        logs = run.logs(tail=100_000)
    assert code == 0, logs
    assert run.pool_restarts == 1 and f"drained {n // 8} batches" in logs, logs
    assert "lost its stager" in logs  # the first pool's workers, as orphans
