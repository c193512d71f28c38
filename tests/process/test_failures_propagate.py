"""A failure anywhere ends the whole run, says why and leaves nothing behind: a batch
stream whose copy to the device raises, a train step that raises, a launcher killed
with SIGKILL, a stager killed with SIGKILL (its socket files), a worker that exits 0
unexpectedly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from ringfeed.consumer.client.batch_client import StagerGone
from ringfeed.consumer.client.batch_stream import BatchStream
from ringfeed.consumer.client.cursor import Cursor
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.consumer.trainer.tf_batch import TfPlace
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import load_config
from ringfeed.shared.memory.segments import pid_alive, socket_files
from ringfeed.shared.run.run_secret import run_record
from tests.support.configs import SYNTHETIC, small, write_config
from tests.support.fault_sources import inject_faults
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.processes import CLI
from tests.support.runs import Run, rid, shm_segments, started

pytestmark = pytest.mark.slow


class BrokenPlace(TfPlace):
    """The trainer's place, whose copy to the device fails (a driver error, OOM)."""

    def __call__(self, arrays):
        raise MemoryError("copy of batch to the device failed")


def trainer_stream(cfg, run_id: str, place: TfPlace) -> BatchStream:
    """The trainer's batch stream (consumer/trainer/trainer.py setup), joined."""
    stream = BatchStream(cfg, run_id, Cursor.fresh(cfg), place, name="trainer")
    stream.connect()
    stream.start()
    return stream


def test_a_stream_whose_copy_raises_reaches_the_trainer_loop(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=10_000, delay_s=0.002, stager={"epochs": 0})
    cfg, run_id = load_config(cfg_path), rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        stream = trainer_stream(cfg, run_id, BrokenPlace("/CPU:0"))
        t0 = time.monotonic()
        with pytest.raises(MemoryError, match="device failed"):
            stream.get()
        assert time.monotonic() - t0 < 30
        stream.close(False)
        assert not stream.is_alive()


def test_a_trainer_without_batches_ends_in_the_configured_time_saying_why(
    tmp_path: Path,
) -> None:
    """No producer ever joins: the trainer used to wait a fixed 300 s and say
    'stager lost' even when the stager was fine. It waits train.data_timeout_s and
    says the stager is alive and its producers are not delivering; once the stager is
    SIGKILLed, the verdict says it is gone."""
    cfg_path = small(tmp_path, items=100, train={"data_timeout_s": 2.0})
    cfg, run_id = load_config(cfg_path), rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        t0 = time.monotonic()
        stream = trainer_stream(cfg, run_id, TfPlace("/CPU:0"))
        with pytest.raises(TimeoutError, match="stager \\(pid \\d+\\) is alive but sent no batch"):
            stream.get()
        assert time.monotonic() - t0 < 20
        run.signal("stager", signal.SIGKILL)
        run.wait("stager", 10)
        assert "is gone" in stream.client.stager_verdict(2.0)
        stream.close(False)


def ringfeed_run(config: Path, run_id: str, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [*CLI, "run", str(config), "--run-id", run_id],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_a_train_step_that_raises_ends_the_run_with_a_reason(tmp_path: Path) -> None:
    raw = {
        **SYNTHETIC,
        "model": {**SYNTHETIC["model"], "factory": "tests.support.faulty_model:build"},
    }
    config = write_config(tmp_path, {**raw, "stager": {"batch_size": 4, "epochs": 0}})
    run_id, log = f"fail-{uuid.uuid4().hex[:6]}", tmp_path / "run.log"
    proc = ringfeed_run(config, run_id, log)
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 1, text
    assert "trainer failed: " in text and "FloatingPointError: the loss exploded" in text
    assert "launch: trainer exited with code 1" in text
    assert shm_segments(run_id) == [] and socket_files(run_id) == []


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    return state != "Z"


def test_a_launcher_killed_with_sigkill_takes_its_run_down(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=100_000, delay_s=0.002)
    run_id = rid()
    proc = subprocess.Popen(
        ["bash", "scripts/launch.sh", "run", str(cfg_path), "--run-id", run_id]
        + ["--consumer", "drain"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: len(shm_segments(run_id)) == 2 and len(children(proc.pid)) >= 3,
            30,
            "the run to start",
        )
        pool = next(c for c in children(proc.pid) if b"producers" in cmdline(c))
        family = children(proc.pid) + children(pool)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        wait_for(
            lambda: not any(alive(pid) for pid in family) and not shm_segments(run_id),
            15,
            "the run's processes and segments to go",
            context=lambda: f"left alive: {[p for p in family if alive(p)]}",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
    assert socket_files(run_id) == []


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_a_run_started_from_a_thread_outlives_that_thread(tmp_path: Path) -> None:
    """A run's processes die with the process that started them (PR_SET_PDEATHSIG), but
    Linux sends that signal when the *thread* that forked them ends: a loader built in a
    setup thread or an executor's task lost its stager to SIGTERM as soon as that
    thread finished. Started from a thread that then ends, the stager must run on."""
    with Run(small(tmp_path, items=40), rid(), tmp_path) as run:
        starter = threading.Thread(target=run.start, args=("stager",))
        starter.start()
        starter.join()
        stager = run.procs["stager"]
        ready = lambda: len(shm_segments(run.run_id)) == 2 or stager.poll() is not None  # noqa: E731
        run.poll_for(ready, 30, "the stager's rings")
        time.sleep(0.5)  # a signal on its way would have landed
        assert stager.poll() is None, f"the stager exited {stager.poll()}\n{run.logs()}"
        assert len(shm_segments(run.run_id)) == 2


def test_cleanup_removes_what_a_sigkilled_stager_left(tmp_path: Path) -> None:
    cfg_path = small(tmp_path, items=100, delay_s=0.002)
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        # The rings come first, the sockets just after: wait for both.
        ready = lambda: len(shm_segments(run_id)) == len(socket_files(run_id)) == 2  # noqa: E731
        run.poll_for(ready, 30, "the rings and sockets")
        run.poll_for(run_record(run_id).exists, 30, "the stager's run record")
        run.signal("stager", signal.SIGKILL)
        run.wait("stager", 10)
        assert len(socket_files(run_id)) == 2 and len(shm_segments(run_id)) == 2
        assert run_record(run_id).exists()  # a client would find a dead run's pid there
        out = subprocess.run(
            [*CLI, "cleanup", "--run-id", run_id],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert "removed 2 stale segment(s)" in out.stdout
        assert "removed 2 dead socket file(s)" in out.stdout
        assert "removed 1 record(s) of stagers gone" in out.stdout
        assert socket_files(run_id) == [] and shm_segments(run_id) == []
        assert not run_record(run_id).exists()


@pytest.mark.parametrize("start", [0, 13])
def test_an_epoch_that_delivers_nothing_ends_the_run_with_why(tmp_path: Path, start: int) -> None:
    """Every item fails (as a corpus whose clips are all too long does): with epochs: 0
    the stager used to skip through epoch after epoch, forever. The first epoch of
    skips ends it, exit code 3, and the consumer is told why; a consumer that starts
    mid-epoch (position 13) is judged on what remains of that epoch."""
    n = 20
    cfg_path = small(tmp_path, items=n, stager={"epochs": 0})
    inject_faults(cfg_path, raise_items=range(n))
    with started(cfg_path, tmp_path, position=start) as (run, client):
        with pytest.raises(StagerGone, match="every item was skipped") as caught:
            client.next(timeout_s=60)
        client.close()
        code = run.wait("stager", 20)
        quarantined = read_quarantine(run.dir / "quarantine.jsonl")
    assert code == 3
    assert f"epoch {start // n}: every item was skipped ({n - start} at " in str(caught.value)
    assert len(quarantined) == n - start and "ZeroDivisionError" in str(caught.value)


def test_a_second_stop_signal_a_second_later_exits_at_once() -> None:
    """The trainer's stop saves a checkpoint first; a user who signals again (Ctrl-C
    twice) gets out at once. A second signal right after the first is the same stop
    (Ctrl-C reaches the whole process group, the launcher's SIGTERM follows)."""
    probe = (
        "import os, signal, sys, time\n"
        "from ringfeed.shared.run.process import StopFlag\n"
        "stop = StopFlag().install(second_exits=True)\n"
        "os.kill(os.getpid(), signal.SIGINT); os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert stop.is_set(); print('one stop', flush=True)\n"
        "time.sleep(float(sys.argv[1])); os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.2); print('still here', flush=True)\n"
    )
    late = subprocess.run(
        [sys.executable, "-c", probe, "1.1"], capture_output=True, text=True, timeout=30
    )
    assert late.returncode == 128 + signal.SIGTERM and late.stdout == "one stop\n"
    assert "second signal: exiting at once" in late.stderr
    soon = subprocess.run(
        [sys.executable, "-c", probe, "0"], capture_output=True, text=True, timeout=30
    )
    assert soon.returncode == 0 and soon.stdout == "one stop\nstill here\n", soon.stderr


def test_a_stager_restarted_after_the_end_of_the_data_still_hears_the_consumers_bye(
    tmp_path: Path,
) -> None:
    """The stager sends END_OF_DATA with the last batch; killed then and restarted, it
    never welcomed the consumer that reads that end and says BYE. It dropped that BYE
    as from an unknown peer and asked for a hello; the consumer rejoined while waiting
    for BYE_ACK, and the new stager waited stager.consumer_wait_s for a consumer that
    had gone (test_speakers_e2e timed out so, when its kill came after the last batch).
    The consumer says BYE again once welcomed: the stager ends at once, exit 0."""
    n = 16
    cfg_path = small(tmp_path, items=n, delay_s=0.0)
    with started(cfg_path, tmp_path) as (run, client):
        items: list[int] = []
        while len(items) < n:  # every batch, not the end that follows the last
            batch = client.next(timeout_s=60)
            assert batch is not None
            items += check_synthetic_rows(batch.arrays, batch.meta.n_valid, client.cfg)
            client.free(batch)
        time.sleep(0.5)  # its END_OF_DATA, sent with the last batch, waits here
        run.signal("stager", signal.SIGKILL)
        run.wait("stager", 10)
        run.start("stager")
        wait_for(lambda: run.logs().count("stager ready") == 2, 60, "the new stager")
        assert client.next(timeout_s=10) is None  # the first stager's end of the data
        client.close()
        assert run.wait("stager", 20) == 0, run.logs()
    assert sorted(items) == list(range(n))


def test_a_worker_stopped_when_its_pool_is_killed_does_not_stay_behind(tmp_path: Path) -> None:
    """A worker stopped (a debugger, SIGSTOP) when its pool is SIGKILLed kept the
    pool-death SIGTERM pending for ever, and the run's ring memory with it, after the
    launcher had removed the files. It must die with its pool, stopped or not."""
    with Run(small(tmp_path, items=4000, delay_s=0.01), rid(), tmp_path) as run:
        run.start("stager")
        pool = run.start("producers")
        workers = run.poll_for(lambda: children_of(pool.pid), 30, "the pool's workers")
        try:
            os.kill(workers[0], signal.SIGSTOP)
            pool.kill()
            pool.wait(10)
            gone = lambda: not any(pid_alive(w) for w in workers)  # noqa: E731
            wait_for(gone, 10, "the end of the workers, the stopped one too")
        finally:
            for w in workers:  # on failure: none may outlive the test
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w, signal.SIGKILL)


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is pid (a pool's workers, its resource tracker
    aside)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"resource_tracker" not in cmdline:
            out.append(int(entry.name))
    return out


STOPPED_CONSUMER = """
import sys
from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import load_config
cfg = load_config(sys.argv[1])
client = BatchClient(cfg, sys.argv[2], name="stopped")
client.connect(30)
print("connected", flush=True)
while True:
    try:
        batch = client.next(timeout_s=0.5)
    except TimeoutError as exc:
        print("TIMEOUT", exc, flush=True)
        continue
    if batch is None:
        break
    items = check_synthetic_rows(batch.arrays, batch.meta.n_valid, cfg)  # each row its item
    print("ROWS", len(items), flush=True)
    client.free(batch)
"""


def test_a_consumer_stopped_while_it_waits_reads_what_came_meanwhile(tmp_path: Path) -> None:
    """A consumer stopped (SIGSTOP, a breakpoint, a suspended VM) inside next() for longer
    than its timeout raised TimeoutError as soon as it was continued, before its socket
    handed over the batches sent meanwhile, and a loader's run ended blaming the
    producers. Only time the process ran counts against a wait."""
    cfg_path = small(tmp_path, items=100_000, delay_s=0.02, stager={"consumer_wait_s": 60.0})
    with Run(cfg_path, rid(), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        consumer = subprocess.Popen(
            [sys.executable, "-c", STOPPED_CONSUMER, str(cfg_path), run.run_id],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert consumer.stdout is not None
            assert consumer.stdout.readline().strip() == "connected"
            for _ in range(4):
                time.sleep(0.5)
                consumer.send_signal(signal.SIGSTOP)
                time.sleep(1.5)  # three timeouts' worth, batches arriving meanwhile
                consumer.send_signal(signal.SIGCONT)
            time.sleep(1.0)
            alive = consumer.poll() is None  # a row that is not its item ends it
        finally:
            consumer.kill()
            out, err = consumer.communicate()
    assert alive and "Traceback" not in err, err
    assert "TIMEOUT" not in out and "ROWS" in out, out


SLOW_TURNS = """
import sys, threading, time
from ringfeed.consumer.client.batch_client import PAUSED_S, BatchClient, BatchWait
from ringfeed.shared.config import load_config
client = BatchClient(load_config(sys.argv[1]), sys.argv[2], name="slow")
client.connect(30)
n = 10**7
t0 = time.perf_counter()
sum(range(n))  # one C call: the GIL is not given up meanwhile
n = int(n * 1.5 * PAUSED_S / (time.perf_counter() - t0))
def hog():
    while True:
        sum(range(n))
        time.sleep(0.001)
threading.Thread(target=hog, daemon=True).start()
wait = BatchWait(client, limit_s=1.0)
try:
    while True:
        wait.next()
except TimeoutError as exc:
    print("TIMEOUT", exc, flush=True)
"""


def test_the_data_timeout_comes_even_when_every_turn_of_the_wait_is_slow(tmp_path: Path) -> None:
    """Pauses are left out of a consumer's wait, but not for ever: a feeding thread whose
    every turn takes longer than PAUSED_S (another thread holding the GIL in one long C
    call, a swapping process) still ends its wait with the stager's verdict, after
    PAUSED_LIMIT_FACTOR data timeouts on the plain clock. It had waited for ever. No
    producer runs, so no batch comes."""
    with Run(small(tmp_path, items=40), rid(), tmp_path) as run:
        run.start("stager")
        out = subprocess.run(
            [sys.executable, "-c", SLOW_TURNS, str(run.config), run.run_id],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert "TIMEOUT" in out.stdout and "is alive but sent no batch" in out.stdout, out
