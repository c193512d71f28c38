"""A client of no live run says where it looked and why nothing answered (issue 34); one
whose folder holds a copy of an earlier run's still finds the live run; one of a run
nobody starts says so within seconds, one beside a stager that is starting waits (a client
started in another folder finding its live run: tests/process/test_client_finds_run.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ringfeed.consumer.client.batch_client import (
    KNOWN_RUN_S,
    NO_BATCH,
    PAUSED_S,
    BatchClient,
    BatchWait,
    StagerGone,
)
from ringfeed.consumer.client.batch_stream import BatchStream
from ringfeed.consumer.client.cursor import Cursor
from ringfeed.shared.config import load_config, replace
from ringfeed.shared.config.environment import child_environment
from ringfeed.shared.run.run_secret import (
    find_run_dir,
    remove_dead_run_records,
    run_record,
    write_consumer_secret,
    write_run_record,
)
from tests.support.configs import SYNTHETIC
from tests.support.runs import rid
from tests.support.stager_thread import remove_files, stager_thread


def test_a_client_of_no_live_run_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg, run_id = load_config(_config(tmp_path)), rid("none")
    client = BatchClient(cfg, run_id)
    with pytest.raises(StagerGone) as gone:
        client.connect(timeout_s=0.5)
    client.close(finished=False)
    why = str(gone.value)
    assert "no stager answered on ipc://" in why and f"{tmp_path}/runs/{run_id}" in why
    assert str(run_record(run_id)) in why and "start it first" in why


def _config(folder: Path) -> Path:
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump(SYNTHETIC | {"run_root": "runs"}))
    return path


def test_a_copy_of_an_earlier_run_folder_does_not_keep_the_client_from_the_live_run(
    tmp_path: Path,
) -> None:
    """The working folder holds runs/<id>/consumer.secret of an earlier run (an
    experiment folder copied); the live stager of that id runs elsewhere. The client
    takes the live stager's record over the stale secret, which it would refuse."""
    cfg = replace(load_config(_config(tmp_path)), run_root=str(tmp_path / "live"))
    with stager_thread(cfg) as stager:
        copied = tmp_path / "copy" / "runs" / stager.run_id
        copied.mkdir(parents=True)
        write_consumer_secret(copied)  # what the earlier run's stager left there
        client = BatchClient(replace(cfg, run_root=str(copied.parent)), stager.run_id)
        client.connect(timeout_s=20)
        assert client.run_dir == stager.dir
        client.close(finished=False)


def test_a_client_of_a_run_nobody_starts_says_so_within_seconds(tmp_path: Path) -> None:
    """A mistyped run id used to wait out the connect timeout (60 s): no live stager
    recorded it and no process is starting one, so the client says so after
    KNOWN_RUN_S, naming the runs there are."""
    cfg = load_config(_config(tmp_path))
    with stager_thread(cfg) as stager:
        client = BatchClient(cfg, f"{stager.run_id}x")
        started = time.monotonic()
        with pytest.raises(StagerGone) as gone:
            client.connect(timeout_s=60)
        waited = time.monotonic() - started
        client.close(finished=False)
    assert KNOWN_RUN_S <= waited < KNOWN_RUN_S + 5, waited
    why = str(gone.value)
    assert why.startswith(f"no run '{stager.run_id}x' is known on this host: no live stager")
    assert stager.run_id in why.split("the live runs here: ")[1]


def test_a_client_beside_a_stager_that_is_starting_keeps_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher starts the stager, then its clients (scripts/runner.py): a client
    whose stager process is there but has not recorded the run yet (stopped here before
    it could) waits out its timeout as before."""
    config, run_id = _config(tmp_path), rid("starting")
    monkeypatch.chdir(tmp_path)
    stager = subprocess.Popen(
        [sys.executable, "-m", "ringfeed.scripts.cli", "stager", str(config), "--run-id", run_id],
        env=child_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.kill(stager.pid, signal.SIGSTOP)
    try:
        client = BatchClient(load_config(config), run_id)
        started = time.monotonic()
        with pytest.raises(StagerGone) as gone:
            client.connect(timeout_s=KNOWN_RUN_S + 2)
        client.close(finished=False)
        assert time.monotonic() - started >= KNOWN_RUN_S + 2
        assert str(gone.value).startswith("no stager answered on ipc://")
    finally:
        stager.kill()
        stager.wait()
        run_record(run_id).unlink(missing_ok=True)
        remove_files(run_id)


def test_a_loaders_stream_that_gets_no_batch_ends_with_why_after_data_timeout(
    tmp_path: Path,
) -> None:
    """The stream under the PyTorch and JAX loaders (consumer/client/batch_stream.py)
    waits train.data_timeout_s for a batch, then its get() raises the stager's verdict:
    alive, and its producers are not delivering (none started here)."""
    cfg = replace(
        load_config(_config(tmp_path)),
        run_root=str(tmp_path / "runs"),
        train={"data_timeout_s": 1.0},
    )
    with stager_thread(cfg) as stager:
        stream = BatchStream(cfg, stager.run_id, Cursor.fresh(cfg), lambda arrays: None)
        stream.connect()
        stream.start()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as timed_out:
            stream.get()
        stream.close(finished=False)
    assert 1.0 <= time.monotonic() - t0 < 20
    assert "is alive but sent no batch" in str(timed_out.value)
    assert "train.data_timeout_s" in str(timed_out.value)


def test_only_time_spent_waiting_counts_against_the_data_timeout(tmp_path: Path) -> None:
    """A loader's feeding thread waits for a batch between other work (its queue full
    behind a slow step) and may be paused (SIGSTOP, a breakpoint): neither is waiting for
    the stager, and must not count against train.data_timeout_s, or a pause of a few
    minutes ended the run with a verdict blaming the producers. Time spent waiting still
    does (no producer here)."""
    cfg = replace(load_config(_config(tmp_path)), run_root=str(tmp_path / "runs"))
    with stager_thread(cfg) as stager:
        client = stager.client()
        wait = BatchWait(client, limit_s=1.0)
        assert wait.next() is NO_BATCH
        time.sleep(1.0 + PAUSED_S)  # busy elsewhere, or paused, past the limit
        assert wait.next() is NO_BATCH  # a wait starts again: no timeout
        with pytest.raises(TimeoutError, match="is alive but sent no batch for"):
            for _ in range(1000):
                wait.next()
        client.close(finished=False)


def test_a_record_whose_pid_now_names_a_later_process_is_no_live_run(tmp_path: Path) -> None:
    """A stager killed with SIGKILL leaves its run record; the pid in it may name
    another process later (a restarted container numbers its pids from 1 again). Such a
    record is no live run, and `ringfeed cleanup` (remove_dead_run_records) removes it
    and a writer's temporary file left by a dead pid; a live stager's record stays."""
    live, stale = rid("live"), rid("stale")
    try:
        write_run_record(live, tmp_path)
        assert find_run_dir(live) == tmp_path.absolute()
        path = write_run_record(stale, tmp_path)
        record = yaml.safe_load(path.read_text())  # JSON is YAML
        path.write_text(json.dumps(record | {"created_s": time.time() - 86400}))
        assert find_run_dir(stale) is None  # this process started after that record
        left = path.with_name(f".{path.name}.{dead_pid()}")
        left.write_text("{}")
        assert sorted(remove_dead_run_records(stale)) == sorted([path.name, left.name])
        assert not path.exists() and not left.exists()
        assert remove_dead_run_records(live) == [] and run_record(live).exists()
    finally:
        for run_id in (live, stale):
            run_record(run_id).unlink(missing_ok=True)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
