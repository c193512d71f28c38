"""Tar shards on a real S3-compatible server (moto, on localhost) with everything on: shard
windows of two shards, length buckets, balance by language and two training workers
(each its own stager, producers and shard cache of two shards, as on two hosts). Each
worker's batches are its rows of the plan's global batches, every row the item it
claims; one worker SIGKILLed mid-epoch and resumed at its cursor continues them; the
store sends each worker's cache about the corpus once an epoch
(docs/plans.md#shard-windows)."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.prepare.lengths import measure_lengths
from ringfeed.shared.config import load_config, replace
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.share import Share
from tests.support.checks import same_rows
from tests.support.configs import write_config
from tests.support.paths import WAVS
from tests.support.runs import Run, rid, shm_segments
from tests.support.s3_server import S3Server

N_SHARDS, PER_SHARD = 12, 4
# Per shard: 2 English clips, 1 German, 1 Persian (each window holds every language).
LANGUAGES = ("en", "en", "de", "fa")
WORKERS = 2
KILLED_AFTER = 2  # batches worker 1 takes before its stager and producers are SIGKILLed
# Bytes the store sends a worker's cache an epoch, at most, over the corpus's: the
# resumed worker fetches again what its killed producers had evicted (a shard or two).
FETCH_BOUND = 1.1


def make_language_shards(dst: Path) -> int:
    """N_SHARDS tars of PER_SHARD clips (the 16 shipped recordings, each under three ids,
    dealt so the shards weigh about the same); per clip <id>.wav and <id>.json with its
    text, speaker and language. Returns the bytes of all the shards."""
    rows = [line.split("|") for line in (WAVS.parent / "metadata.csv").read_text().splitlines()]
    audio = {item_id: (WAVS / f"{item_id}.wav").read_bytes() for item_id, _, _ in rows}
    clips = sorted(
        ((item_id, text) for item_id, _, text in rows for _ in range(3)),
        key=lambda clip: -len(audio[clip[0]]),
    )
    shards: list[list[tuple[str, str]]] = [[] for _ in range(N_SHARDS)]
    for clip in clips:  # the largest first, to the lightest shard with room
        open_ = [s for s in shards if len(s) < PER_SHARD]
        min(open_, key=lambda s: sum(len(audio[c[0]]) for c in s)).append(clip)
    dst.mkdir(parents=True)
    for s, shard in enumerate(shards):
        with tarfile.open(dst / f"part-{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for k, ((recording, text), language) in enumerate(zip(shard, LANGUAGES, strict=True)):
                key = f"{language}-{s}{k}-{recording}"
                side = {"text": text, "speaker": f"{language}-speaker", "language": language}
                for name, data in (
                    (f"{key}.wav", audio[recording]),
                    (f"{key}.json", json.dumps(side).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return sum(p.stat().st_size for p in dst.iterdir())


def config_of(tmp_path: Path, path: str, cache_mb: int, name: str = "config.yaml") -> Path:
    """The run's config; each worker's names its own shard cache (name: its file)."""
    tmp_path.mkdir(exist_ok=True)
    cache = str(tmp_path / f"shard-cache-{name}")
    return write_config(
        tmp_path,
        {
            "data": {
                "path": path,
                "format": "shards",
                "shard_window": 2,
                "shard_cache_mb": cache_mb,
                "shard_cache_dir": cache,
            },
            "features": {
                "cache": False,
                "on_too_long": "truncate",
                "cache_dir": str(tmp_path / "cache"),
            },
            # Few samples and batches ahead of the consumer (4 slots, 2 batches of 2-3 rows), and
            # the producer is the slower side: a killed worker had fetched little past its
            # cursor (no shard fetched again in 5 runs here; the bound leaves room for 2).
            "ring": {"heartbeat_s": 0.1},
            "stager": {
                "batch_size": 4,
                "epochs": 1,
                "auto_buckets": 2,
                "batch_slots": 2,
                "balance": {"by": "language", "temperature": 0.3},
            },
            "producers": {"workers": 1},
        },
        name,
    )


def worker(tmp_path: Path, base: str, k: int) -> Run:
    config = tmp_path / f"worker-{k}.yaml"
    run = Run(config, Share(k, WORKERS).run_id(base), tmp_path)
    run.verb_args = {"stager": ["--worker", f"{k}/{WORKERS}"]}
    return run


@pytest.mark.slow
def test_s3_shards_bucketed_balanced_on_two_workers_killed_and_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus_bytes = make_language_shards(tmp_path / "shards")
    shard_bytes = corpus_bytes / N_SHARDS
    cache_mb = int(2 * shard_bytes / 2**20) + 1  # two shards fit, three do not
    smallest = min(p.stat().st_size for p in (tmp_path / "shards").iterdir())
    assert 2 * shard_bytes < cache_mb * 2**20 < 3 * smallest
    local = load_config(config_of(tmp_path / "local", str(tmp_path / "shards"), cache_mb))
    pipe = SamplePipeline(replace(local, features={"cache": False}))
    expected = {e.item_id: pipe(e) for e in open_corpus(local, in_subprocess=False).entries}
    with S3Server(tmp_path) as s3:
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)  # the run's processes inherit them
        fs = s3.client()
        fs.mkdir("corpus")
        for shard in sorted((tmp_path / "shards").iterdir()):
            fs.put_file(str(shard), f"corpus/train/{shard.name}")
        config = config_of(tmp_path, "s3://corpus/train", cache_mb)
        for k in range(WORKERS):
            config_of(tmp_path, "s3://corpus/train", cache_mb, f"worker-{k}.yaml")
        cfg = load_config(config)
        index = open_corpus(cfg, in_subprocess=False)
        measure_lengths(cfg, index)  # here: the stagers find the length table current
        plan = make_plan(cfg, index)
        fetched_before, fetches_before = s3.tar_bytes, len(s3.tar_fetches)
        got = two_workers_killed_and_resumed(tmp_path, rid("s3w"), index, expected)
        fetched, fetches = s3.tar_bytes - fetched_before, s3.tar_fetches[fetches_before:]
    for k in range(WORKERS):  # each worker's batches: its rows of every global batch
        mine, want, position = plan.with_share(Share(k, WORKERS)), [], 0
        while position < plan.n_items:  # one batch per global batch, empty or not
            _, first, position = plan.batch_at(position)
            want.append([plan.item_at(p) for p in range(first, position) if mine.owns(p)])
        assert got[k] == want, k
    delivered = sorted(item for batches in got for batch in batches for item in batch)
    assert len(delivered) == plan.n_items - plan.remainder(0), "each position once"
    ratio = fetched / (WORKERS * corpus_bytes)
    print(f"the store sent {ratio:.3f}x the corpus a worker ({len(fetches)} shards)")
    assert ratio <= FETCH_BOUND, f"{ratio:.2f}x the corpus a worker: {fetches}"


def two_workers_killed_and_resumed(
    tmp_path: Path, base: str, index, expected: dict
) -> list[list[list[int]]]:
    """Each worker's batches of epoch 0 (the items of its rows), taken in lockstep as
    trainers take them, every row checked against its item; worker 1 SIGKILLed after
    KILLED_AFTER batches and started again at its client's cursor."""
    got: list[list[list[int]]] = [[] for _ in range(WORKERS)]
    with contextlib.ExitStack() as stack:
        runs = [stack.enter_context(worker(tmp_path, base, k)) for k in range(WORKERS)]
        for run in runs:
            run.start("stager")
            run.start("producers")
        clients = [run.client(timeout_s=60) for run in runs]
        while batches := [client.next(60) for client in clients]:
            if all(b is None for b in batches):
                break
            for k, batch in enumerate(batches):
                assert batch is not None, f"worker {k} ended early\n{runs[k].logs()}"
                got[k].append(checked_rows(batch, index, expected))
                clients[k].free(batch)
            if len(got[1]) == KILLED_AFTER:
                clients[1] = killed_and_resumed(runs[1], clients[1])
        for run, client in zip(runs, clients, strict=True):
            client.close(finished=True)
            assert run.wait("stager", 30) == 0, run.logs()
    assert all(shm_segments(run.run_id) == [] for run in runs)
    return got


def killed_and_resumed(run: Run, client):
    """The worker's stager and producers SIGKILLed, started again, and a client at the
    killed one's cursor (what its trainer's checkpoint would hold)."""
    for verb in ("stager", "producers"):
        run.signal(verb, signal.SIGKILL)
        run.wait(verb, 20)
    cursor = {"position": client.position, "batch_index": client.batch_index}
    client.close(finished=False)
    run.start("stager")
    run.start("producers")
    return run.client(timeout_s=60, **cursor)


def checked_rows(batch, index, expected: dict) -> list[int]:
    """The items of a batch's rows, each row checked against the item it claims."""
    a, items = batch.arrays, []
    for row in range(batch.meta.n_valid):
        item = int(a["items"][row])
        want = expected[index.item_id(item)]
        t, f = int(a["text_lens"][row]), int(a["mel_lens"][row])
        assert np.array_equal(a["tokens"][row, :t], want.tokens), index.item_id(item)
        assert f == len(want.mel) and same_rows(a["mel"][row, :f], want.mel), index.item_id(item)
        items.append(item)
    return items
