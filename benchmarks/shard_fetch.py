"""Bytes fetched from object storage per epoch: random order against the shard-aware plan.

    .venv/bin/python benchmarks/shard_fetch.py [--shards 24] [--cache-shards 2] [--window 2]

Packs --shards tar shards of the 16 shipped clips (each clip under a key of its
own in every shard), puts them on moto's S3 server on localhost (the tests'
server, tests/support/s3_server.py), indexes them, and reads one epoch of clips in plan
order through one producer's reader (shared/corpus/members.py MemberReader: the shard
cache of shared/corpus/object_store.py, holding --cache-shards shards): once with the
default plan (a permutation of all items) and once with data.shard_window. A
real run's producers read the same order, a few grants apart. Prints the bytes
fetched, their ratio to the corpus's bytes, shards fetched and cache hits.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.consumer.stager.plan.plan import Plan  # noqa: E402
from ringfeed.consumer.stager.plan.shard_window import ShardWindows  # noqa: E402
from ringfeed.consumer.stager.plan.shuffle import Shuffle  # noqa: E402
from ringfeed.shared.config import Config, replace  # noqa: E402
from ringfeed.shared.corpus.members import MemberReader  # noqa: E402
from ringfeed.shared.corpus.open import open_corpus  # noqa: E402
from tests.support.s3_server import S3Server  # noqa: E402

WAVS = REPO / "data" / "ljspeech-mini" / "wavs"


def pack(folder: Path, n_shards: int) -> int:
    """n_shards tars of the 16 clips, keys s<shard>-<clip>; returns their total bytes."""
    folder.mkdir(parents=True)
    rows = [line.split("|") for line in (WAVS.parent / "metadata.csv").read_text().splitlines()]
    for s in range(n_shards):
        with tarfile.open(folder / f"part-{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for item_id, _, text in rows:
                for name, data in (
                    (f"s{s}-{item_id}.wav", (WAVS / f"{item_id}.wav").read_bytes()),
                    (f"s{s}-{item_id}.txt", text.encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return sum(p.stat().st_size for p in folder.iterdir())


def epoch_bytes(cfg: Config, plan: Plan, index) -> dict[str, int]:
    """Read every clip of epoch 0 in plan order through a fresh shard cache."""
    reader = MemberReader(cfg)
    for position in range(index.n_items):
        entry = index.entry(plan.item_at(position))
        reader.read(entry.audio_path, *entry.member)
    return reader.counters()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--cache-shards", type=int, default=2)
    parser.add_argument("--window", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shard-fetch-") as name:
        tmp = Path(name)
        total = pack(tmp / "shards", args.shards)
        shard_mb = total / args.shards / 2**20
        with S3Server(tmp) as s3:
            os.environ.update(s3.env())
            fs = s3.client()
            fs.mkdir("bench")
            for shard in sorted((tmp / "shards").iterdir()):
                fs.put_file(str(shard), f"bench/c/{shard.name}")
            cache_mb = max(1, int(args.cache_shards * shard_mb + 1))
            results = {}
            for label, window in (
                ("random order", 0),
                (f"shard window {args.window}", args.window),
            ):
                cfg = replace(
                    Config(),
                    data={"path": "s3://bench/c", "format": "shards", "shard_cache_mb": cache_mb},
                    features={"cache_dir": str(tmp / f"cache-{window}")},
                )
                index = open_corpus(cfg, in_subprocess=False)
                order = (
                    ShardWindows(0, index.shard_starts, window)
                    if window
                    else Shuffle(index.n_items, 0)
                )
                plan = Plan(order, epochs=1)
                t0 = time.perf_counter()
                results[label] = (epoch_bytes(cfg, plan, index), time.perf_counter() - t0)
    cache = f"shard cache {cache_mb} MB ({args.cache_shards} shards)"
    print(
        f"{args.shards} shards of {shard_mb:.1f} MB ({index.n_items} clips, "
        f"{total / 2**20:.0f} MB), {cache}"
    )
    print("| plan | bytes fetched per epoch | x the corpus | shards fetched | cache hits | s |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, (c, seconds) in results.items():
        print(
            f"| {label} | {c['shard_bytes_fetched'] / 2**20:,.0f} MB | "
            f"{c['shard_bytes_fetched'] / total:.2f} | {c['shards_fetched']} | "
            f"{c['shard_hits']} | {seconds:.1f} |"
        )


if __name__ == "__main__":
    main()
