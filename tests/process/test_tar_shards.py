"""WebDataset-style tar shards (shared/corpus/formats/shards.py), local and on a real S3-compatible
server (moto, on localhost; shared/corpus/object_store.py): member indexes built once, a
corrupt member or tar header costs itself, a bounded shard cache, one clear error
for a store that cannot be reached, and real runs that deliver the same rows from
loose files, local shards and S3 shards."""

from __future__ import annotations

import collections
import hashlib
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringfeed.consumer.stager.plan.buckets import Bucket
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shard_window import WindowedBatches, shard_windows
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.object_store import ShardCache
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.stats_record import SHARD_COUNTERS
from tests.support.board import read_scalars
from tests.support.checks import same_rows
from tests.support.configs import shards_cfg, write_config
from tests.support.corpora import make_shards
from tests.support.paths import MINI
from tests.support.polling import wait_for
from tests.support.runs import Run, rid, shm_segments, started
from tests.support.s3_server import S3Server

CORRUPT = "LJ001-0006"


def test_shard_cache_is_bounded_fetches_once_a_host_and_an_unreachable_store_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with S3Server(tmp_path) as s3:
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        fs = s3.client()
        fs.mkdir("cache-test")
        for k in range(3):
            fs.pipe(f"cache-test/s/{k}.tar", bytes([k]) * 400_000)
        cache = ShardCache(shards_cfg("s3://cache-test/s", tmp_path, shard_cache_mb=1))
        for k in (0, 1, 0, 2):  # 0 is used again after 1: 1 is the least recent
            with open(cache.local(f"s3://cache-test/s/{k}.tar"), "rb") as f:
                assert f.read() == bytes([k]) * 400_000
        held = sorted(p.stat().st_size for p in cache.folder.glob("*.tar"))
        assert sum(held) <= 2**20 and len(held) == 2
        assert cache.counters() == {
            "shard_hits": 1,
            "shards_fetched": 3,
            "shard_bytes_fetched": 1_200_000,
            "store_retries": 0,
        }
        assert os.path.exists(cache.local("s3://cache-test/s/0.tar"))  # kept: used recently
        fs.pipe("cache-test/big/0.tar", bytes(range(256)) * 40_000)  # 10 MB
        before = len(s3.tar_fetches)
        spawn = mp.get_context("spawn")
        with spawn.Manager() as manager, ProcessPoolExecutor(2, mp_context=spawn) as pool:
            got = list(pool.map(fetched_together, [tmp_path] * 2, [manager.Barrier(2)] * 2))
        assert got[0] == got[1] == hashlib.sha256(bytes(range(256)) * 40_000).hexdigest()
        assert s3.tar_fetches[before:] == ["/cache-test/big/0.tar"], "one fetch for the host"
    cfg = shards_cfg("s3://cache-test/s", tmp_path / "gone", store_retries=2)
    with pytest.raises(CorpusError, match=r"data.path: listing .* failed after 2 tries.*AWS_"):
        open_corpus(cfg)


def fetched_together(tmp_path: Path, barrier) -> str:
    """A producer's shard cache asked for one shard at once with another's (a process of
    its own, the shared cache folder): the sha256 of what it reads."""
    cache = ShardCache(shards_cfg("s3://cache-test/big", tmp_path, shard_cache_mb=64))
    barrier.wait(30)
    with open(cache.local("s3://cache-test/big/0.tar"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_the_shard_window_plan_deals_whole_shards_exactly_once(tmp_path: Path) -> None:
    make_shards(tmp_path / "shards")
    cfg = shards_cfg(str(tmp_path / "shards"), tmp_path, shard_window=2)
    index = open_corpus(cfg, in_subprocess=False)
    assert index.shard_starts.tolist() == [0, 4, 8, 12, 16]
    plan = Plan(shard_windows(cfg, index), cfg.stager.epochs)
    shard_of = np.searchsorted(index.shard_starts, np.arange(16), "right") - 1
    epochs = []
    for epoch in range(3):
        items = [plan.item_at(epoch * 16 + p) for p in range(16)]
        assert sorted(items) == list(range(16)), "each item once an epoch"
        windows = [set(shard_of[items[w : w + 8]]) for w in (0, 8)]
        assert all(len(w) == 2 for w in windows) and not windows[0] & windows[1]
        epochs.append(items)
    assert epochs[0] != epochs[1] != epochs[2]
    again = Plan(shard_windows(cfg, index), cfg.stager.epochs)
    assert [again.item_at(p) for p in range(20, 40)] == [plan.item_at(p) for p in range(20, 40)]
    # with a fixed shape cut per window (several workers): the same positions, in batches
    fixed = [Bucket(cfg.features.max_frames, cfg.text.max_text_len, 3)]
    cut = WindowedBatches(shard_windows(cfg, index), fixed, np.zeros(16, np.int32), None, None)
    assert [Plan(cut).item_at(p) for p in range(40)] == [plan.item_at(p) for p in range(40)]


# ------------------------------------------------------------------ real runs

RAW = {
    "features": {"cache": False, "on_too_long": "truncate"},
    "ring": {"heartbeat_s": 0.1},
    "stager": {"batch_size": 4, "epochs": 1},
    "producers": {"workers": 2},
}


def epoch(
    tmp_path: Path, data: dict, expected: dict, resume_after: int = 0, board: bool = False
) -> dict[str, Any]:
    """One epoch of a real run on `data`; with resume_after, stopped after that many
    batches and resumed at the consumer's plan position by a fresh stager and producers.
    Every row is checked against the item it claims (expected: item id -> Sample from
    loose files). board: the trainer's TensorBoard numbers of the shard cache at the
    stop, written by a RunBoard on the run's stats and read back (shard_cache_board)."""
    raw = {
        **RAW,
        "data": data,
        "features": {**RAW["features"], "cache_dir": str(tmp_path / "cache")},
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg_path = write_config(tmp_path, raw)
    cfg = load_config(cfg_path)
    index = open_corpus(cfg)
    run_id, ids, start, first = rid(), [], {}, {}
    for part in range(2 if resume_after else 1):
        with started(cfg_path, tmp_path, run_id=run_id, timeout_s=60, **start) as (run, client):
            while (part or not resume_after or len(ids) < 4 * resume_after) and (
                batch := client.next(60)
            ):
                a, n = batch.arrays, batch.meta.n_valid
                for row in range(n):
                    # a shard's item id is <shard>/<key> (docs/corpora.md#item-ids); the
                    # keys are the loose files' LJSpeech ids
                    item_id = clip_of(index.item_id(int(a["items"][row])))
                    want, t, f = (
                        expected[item_id],
                        int(a["text_lens"][row]),
                        int(a["mel_lens"][row]),
                    )
                    assert np.array_equal(a["tokens"][row, :t], want.tokens), item_id
                    assert f == len(want.mel) and same_rows(a["mel"][row, :f], want.mel)
                    ids.append(item_id)
                client.free(batch)
            start = {"position": client.position, "batch_index": client.batch_index}
            if board and not part:
                written = shard_cache_board(run, tmp_path / "tensorboard")
            client.close()
            if resume_after and not part:
                run.stop()
            assert run.wait("stager", 30) in (0, -15), run.logs()
            first = first or run.json("stager.json")
        assert shm_segments(run_id) == []
    quarantine = read_quarantine(run.dir / "quarantine.jsonl")
    return {"ids": ids, "quarantine": quarantine, "first": first} | (
        {"board": written} if board else {}
    )


def clip_of(item_id: str) -> str:
    """The clip (LJSpeech id) an item id names, whether loose (itself) or in a shard."""
    return item_id.rsplit("/", 1)[-1]


def shard_cache_board(run: Run, log_dir: Path) -> dict[str, float]:
    """The stager/shard_cache/* scalars the trainer's board (consumer/trainer/board.py)
    writes, read back from its event file: written once the stats stream shows the
    store's retried read (producers report their counters in heartbeats)."""
    from ringfeed.consumer.trainer.board import RunBoard

    board = RunBoard(log_dir, run.dir, run.stats)
    try:
        wait_for(
            lambda: board.stager_scalars().get("stager/shard_cache/retries", 0) >= 1,
            30,
            "the retried read in the stager's stats",
        )
        board.report(1, None)
    finally:
        board.close()
    return {
        tag.split("/")[-1]: at[1]
        for tag, at in read_scalars(log_dir).items()
        if tag.startswith("stager/shard_cache/")
    }


@pytest.mark.slow
def test_loose_files_local_shards_and_s3_shards_deliver_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = replace(Config(), data={"path": str(MINI)}, features=RAW["features"])
    pipe = SamplePipeline(cfg)
    expected = {
        e.item_id: pipe(e)
        for e in open_corpus(
            replace(cfg, features={"cache_dir": str(tmp_path / "expected")})
        ).entries
    }
    loose = epoch(tmp_path / "loose", {"path": str(MINI)}, expected)
    assert collections.Counter(loose["ids"]) == collections.Counter(list(expected))

    make_shards(tmp_path / "shards", corrupt=CORRUPT)
    local = epoch(
        tmp_path / "local",
        {"path": str(tmp_path / "shards"), "format": "shards"},
        expected,
        resume_after=2,
    )
    good = collections.Counter(i for i in expected if i != CORRUPT)
    assert collections.Counter(local["ids"]) == good, "each good clip exactly once"
    bad = [r for r in local["quarantine"] if clip_of(r["item_id"]) == CORRUPT]
    assert len(bad) == 1 and "unreadable audio file" in bad[0]["reason"], local["quarantine"]

    with S3Server(tmp_path) as s3:
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)  # the run's processes inherit them
        fs = s3.client()
        fs.mkdir("corpus")
        for shard in sorted((tmp_path / "shards").iterdir()):
            fs.put_file(str(shard), f"corpus/train/{shard.name}")
        s3.break_next_gets = 1  # a producer's first shard fetch breaks mid-body
        remote = epoch(
            tmp_path / "s3",
            {"path": "s3://corpus/train", "format": "shards", "shard_window": 2},
            expected,
            resume_after=2,
            board=True,
        )
        assert s3.broken == 1
    assert collections.Counter(remote["ids"]) == good
    assert [r["item_id"] for r in remote["quarantine"]] == [f"part-00001/{CORRUPT}"]
    work = [p["work"] for p in remote["first"]["producers"]]
    assert sum(w.get("store_retries", 0) for w in work) >= 1, work
    assert sum(w.get("shards_fetched", 0) for w in work) >= 1, work
    # TensorBoard's numbers of the shard cache, read back: what the producers had counted by
    # then (the stager's final counts, in stager.json, can only be larger).
    final = {tag: sum(w.get(key, 0) for w in work) for key, tag in SHARD_COUNTERS.items()}
    smallest = min(shard.stat().st_size for shard in (tmp_path / "shards").iterdir())
    board = remote["board"]
    assert set(board) == set(final), board
    assert 1 <= board["retries"] <= final["retries"], (board, final)
    assert 1 <= board["fetched"] <= final["fetched"], (board, final)
    assert smallest <= board["bytes_fetched"] <= final["bytes_fetched"], (board, final)
    assert board["hits"] <= final["hits"], (board, final)
