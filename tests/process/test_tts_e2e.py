"""The real TTS path through real processes: bad inputs, and mels made by the stager."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.producer.prepare.prepare import prepare
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import open_corpus
from tests.support.broken_dataset import make_broken_dataset
from tests.support.configs import write_config
from tests.support.paths import REPO
from tests.support.runs import Run, rid, shm_segments, started

pytestmark = pytest.mark.slow


def collect(client: BatchClient) -> dict[str, list]:
    """Every valid row of every batch until the plan ends, by field."""
    rows: dict[str, list] = collections.defaultdict(list)
    while (batch := client.next(timeout_s=90)) is not None:
        for name, arr in batch.arrays.items():
            rows[name].extend(np.array(arr[: batch.meta.n_valid]))
        client.free(batch)
    return rows


def run_epoch(tmp_path: Path, raw: dict) -> tuple[dict[str, list], Run]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg_path = write_config(tmp_path, raw)
    run_id = rid()
    with started(cfg_path, tmp_path, run_id=run_id, timeout_s=60) as (run, client):
        rows = collect(client)
        client.close()
        assert run.wait("stager", 30) == 0, run.logs()
        assert shm_segments(run_id) == []
    return rows, run


def test_broken_inputs_are_quarantined_and_good_ones_delivered_once(tmp_path: Path) -> None:
    ds = make_broken_dataset(tmp_path / "data")
    raw = {
        "data": {"path": str(ds.root)},
        "features": {"cache_dir": str(tmp_path / "cache")},
        "ring": {"heartbeat_s": 0.1},
        "stager": {"batch_size": 4, "epochs": 1},
        "producers": {"workers": 2},
    }
    rows, run = run_epoch(tmp_path, raw)
    index = open_corpus(load_config(run.config))
    delivered = [index.item_id(i) for i in rows["items"]]
    assert sorted(delivered) == sorted(ds.good)  # each good one exactly once
    records = read_quarantine(run.dir / "quarantine.jsonl")
    reasons = {r["item_id"]: r["reason"] for r in records}
    for item_id, needle in {**ds.bad_lines, **ds.bad_samples}.items():
        assert needle in reasons.get(item_id, ""), (item_id, reasons.get(item_id))
    # The corpus index stats no file: a missing one is found when a producer reads it.
    assert {r["stage"] for r in records if r["item_id"] == "missing-file"} == {"audio"}
    stager = run.json("stager.json")
    assert stager["counters"]["skipped"] == len(ds.bad_samples) + 1
    assert stager["bad_metadata_lines"] == len(ds.bad_lines) - 1
    # Producers report their own work in heartbeats: here every clip was decoded.
    assert sum(p["work"].get("decoded", 0) for p in stager["producers"]) > 0


def test_stager_mels_match_producer_mels(tmp_path: Path) -> None:
    from ringfeed.consumer.stager.gpu_mel import MEL_ATOL

    features = {"on_too_long": "truncate", "max_frames": 400, "cache": False}
    raw = {
        "data": {"path": str(REPO / "data" / "ljspeech-mini")},
        "features": features | {"cache_dir": str(tmp_path / "cache")},
        "stager": {"batch_size": 4, "epochs": 1},
        "producers": {"workers": 2},
    }
    # A cache of its own, prepared first as `ringfeed prepare` does. In the shared one,
    # another test's index of this corpus whose length table lacked these settings made
    # the stager refuse it ("the length table ... lacks 16 of 16 items"): the test passed
    # only in the order where a run had prepared them first.
    prepare(load_config(write_config(tmp_path, raw)), workers=1)
    producer_rows, _ = run_epoch(tmp_path / "producer", raw)
    raw["features"]["device"] = "stager"
    stager_rows, run = run_epoch(tmp_path / "stager", raw)
    by_item = {int(i): k for k, i in enumerate(producer_rows["items"])}
    assert sorted(by_item) == sorted(int(i) for i in stager_rows["items"])
    worst = 0.0
    for k, item in enumerate(stager_rows["items"]):
        j = by_item[int(item)]
        n = int(producer_rows["mel_lens"][j])
        assert int(stager_rows["mel_lens"][k]) == n
        diff = np.abs(stager_rows["mel"][k][:n] - producer_rows["mel"][j][:n])
        worst = max(worst, float(diff.max()))
    assert worst <= MEL_ATOL, worst
