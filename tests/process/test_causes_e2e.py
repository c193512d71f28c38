"""Causes, not items, through real processes (issue 31), on real clips: a wrong-shaped
user field is refused before any grant, by `ringfeed run` and by the producers
themselves, with nothing quarantined; a function that fails on some clips costs those
clips, a restart of the same run skips them without a try while their cause holds,
and once the function is fixed and features.user_version bumped the same run id
delivers them. Every row of every field is checked against the item it claims."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.producer.causes import stage_causes
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.config.environment import child_environment
from ringfeed.shared.corpus.open import open_corpus
from tests.support import user_fields
from tests.support.checks import check_real_rows, same_rows
from tests.support.configs import EIGHT_KHZ_FEATURES, write_config
from tests.support.paths import MINI
from tests.support.polling import wait_for
from tests.support.runs import Run, rid, shm_segments

pytestmark = pytest.mark.slow

N_ITEMS = 16  # every clip of MINI fits max_frames here


def config(tmp_path: Path, function: str, version: str) -> Path:
    """MINI at 8 kHz (every clip fits, cheap mels), one producer, the user's fields."""
    return write_config(
        tmp_path,
        {
            "data": {"path": str(MINI)},
            "audio": {"sample_rate": 8000},
            "features": {
                **EIGHT_KHZ_FEATURES,
                "max_frames": 320,
                "cache_dir": str(tmp_path / "cache"),
                "user_function": f"tests.support.user_fields:{function}",
                "user_version": version,
                "user_fields": user_fields.FIELDS,
            },
            "ring": {"heartbeat_s": 0.1},
            "stager": {"batch_size": 4, "epochs": 1},
            "producers": {"workers": 1},
        },
        name=f"{function}-{version}.yaml",
    )


def test_a_wrong_shaped_field_is_refused_before_any_grant(tmp_path: Path) -> None:
    cfg_path = config(tmp_path, "wrong_shape", "v1")
    cfg, run_id = load_config(cfg_path), rid()
    shape = "field 'emotion' has shape (3,), declared (2,)"
    launch = subprocess.run(
        [
            sys.executable,
            "-m",
            "ringfeed.scripts.cli",
            "run",
            str(cfg_path),
            "--run-id",
            run_id,
            "--consumer",
            "drain",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_environment(),
        cwd=tmp_path,
    )
    errors = [line for line in launch.stderr.splitlines() if line.startswith("config error")]
    assert launch.returncode == 2 and len(errors) == 1, launch.stderr
    assert shape in errors[0] and "on LJ001-0001, the first clip that reads" in errors[0]
    assert not (Path(cfg.run_root) / run_id).exists(), "`run` started something"
    with Run(cfg_path, run_id, tmp_path) as run:  # the processes alone, without `run`'s check
        run.start("stager")
        run.start("producers")
        assert run.wait("producers", 90) == 2, run.logs()  # refused: no worker restarted
        wait_for(lambda: "stager ready" in run.logs(), 60, "the stager running")
        run.signal("stager")
        assert run.wait("stager", 30) == 0, run.logs()
        logs = run.logs(tail=100_000)
        stager = run.json("stager.json")
    function = "features.user_function tests.support.user_fields:wrong_shape"
    assert f"refused to start: {function}: {shape}" in logs
    assert "restart 1/" not in logs and stager["producers"] == [], "a producer joined"
    assert stager["counters"]["grants"] == 0, stager["counters"]
    assert read_quarantine(Path(cfg.run_root) / run_id / "quarantine.jsonl") == []
    assert shm_segments(run_id) == []


def expected_samples(cfg: Config) -> dict[str, object]:
    """Each item's sample as a producer computes it with the fixed function, by item id."""
    index = open_corpus(cfg)
    pipe = SamplePipeline(replace(cfg, features={"cache": False}), index=index)
    return {index.item_id(k): pipe(index.entry(k), k) for k in range(index.n_items)}


def check_user_fields(batch, index, expected: dict, cfg: Config) -> list[str]:
    """Every real row's tokens, mel and user fields against its item's; -> the item ids."""
    rows = check_real_rows(batch, index, {k: (s.tokens, s.mel) for k, s in expected.items()})
    for row in rows:
        want = expected[row["item_id"]].fields
        for d in cfg.schema.extras:
            got, exp = row[d.name], want[d.name]
            n = len(exp) if d.length != "none" else d.shape[0]
            assert same_rows(got[:n], exp), (d.name, row["item_id"])
            assert (got[n:] == d.pad).all(), (d.name, "padding", row["item_id"])
            if d.length == "own":
                assert row[d.lens_name] == n, (d.name, row["item_id"])
    return [row["item_id"] for row in rows]


def deliver(cfg_path: Path, run_id: str, logs: Path, expected: dict) -> list[str]:
    """One start of the run with this config, drained to the plan's end: its item ids."""
    cfg = load_config(cfg_path)
    index = open_corpus(cfg)
    logs.mkdir()
    with Run(cfg_path, run_id, logs) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=120)  # a loaded 2-core host: imports take long
        items: list[str] = []
        while (batch := client.next(timeout_s=90)) is not None:
            items += check_user_fields(batch, index, expected, cfg)
            client.free(batch)
        client.close()
        assert run.wait("stager", 30) == 0, run.logs()
    assert shm_segments(run_id) == []
    assert all(n == 1 for n in collections.Counter(items).values()), "an item twice"
    return items


def test_a_fixed_function_brings_its_items_back(tmp_path: Path) -> None:
    fussy, fixed = config(tmp_path, "fussy", "v1"), config(tmp_path, "fields", "v2")
    expected = expected_samples(load_config(fixed))  # fussy's, where it gives any
    run_id = rid()
    quarantine = Path(load_config(fussy).run_root) / run_id / "quarantine.jsonl"
    first = deliver(fussy, run_id, tmp_path / "logs-1", expected)
    lost = set(user_fields.FUSSY_ITEMS)
    assert sorted(first) == sorted(set(expected) - lost)
    lines = read_quarantine(quarantine)
    cause = stage_causes(load_config(fussy))["user"]
    assert {(r["item_id"], r["stage"], r["cause"]) for r in lines} == {
        (item, "user", cause) for item in lost
    }
    assert cause.endswith("tests.support.user_fields:fussy v1")
    # The same run started again, its cause unchanged: skipped without a try.
    again = deliver(fussy, run_id, tmp_path / "logs-2", expected)
    assert sorted(again) == sorted(first)
    assert read_quarantine(quarantine) == lines, "an item whose cause holds was tried again"
    # Fixed, and its version bumped: the same run id delivers the lost items.
    back = deliver(fixed, run_id, tmp_path / "logs-3", expected)
    assert sorted(back) == sorted(expected) and len(back) == N_ITEMS
    assert read_quarantine(quarantine) == []
    said = "".join(p.read_text() for p in (tmp_path / "logs-3").glob("*stager*.log"))
    assert "2 items quarantined earlier in this run are tried again" in said
