"""Producer cost of each declared sample field, and what each adds to a batch.

    .venv/bin/python benchmarks/sample_fields.py [--rounds 3] [--passes 2]

Data: the 16 clips of data/ljspeech-mini (22050 Hz, ``features.on_too_long:
truncate``; one speaker, so every reference is another of the 16 clips), the
default features otherwise. Math libraries pinned to one thread, as in a
producer. Per round, alternated so machine noise hits them alike:

- cold, per schema: one SamplePipeline per pass on an empty feature cache (a
  first epoch: decode, mel, and the optional fields; a reference clip's mel is
  cached when it is computed, so a later item whose own clip was someone's
  reference hits the cache for its mel, as in a real first epoch);
- cached: every field of the last schema from a filled cache (no decode).

Schemas: mel only (the default), + reference (reference_frames 200; once more
without the feature cache, where each reference costs a second decode and mel),
+ pitch and energy, and all of them. Batch bytes per sample: the fixed batch shape's bytes
(Config.batch_fields, every field and its lengths) over stager.batch_size.
Medians over rounds; the machine is shared, so expect 10-20 % noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.producer.pipeline import SamplePipeline  # noqa: E402
from ringfeed.producer.process.threads import pin_math_threads  # noqa: E402
from ringfeed.shared.config import Config, config_from_dict  # noqa: E402
from ringfeed.shared.corpus.index import CorpusIndex  # noqa: E402
from ringfeed.shared.corpus.open import open_corpus  # noqa: E402

SCHEMAS: dict[str, dict] = {
    "mel only": {},
    "+ reference": {"reference": True},
    "+ reference, no cache": {"reference": True, "cache": False},
    "+ pitch, energy": {"pitch": True, "energy": True},
    "all three": {"reference": True, "pitch": True, "energy": True},
}


def config(cache_dir: Path, features: dict) -> Config:
    return config_from_dict(
        {
            "data": {"path": str(REPO / "data" / "ljspeech-mini")},
            "features": {"cache_dir": str(cache_dir), "on_too_long": "truncate", **features},
        }
    )


def one_pass(pipe: SamplePipeline, index: CorpusIndex) -> float:
    """Seconds for one pass over every item."""
    t0 = time.perf_counter()
    for item, entry in enumerate(index.entries):
        pipe(entry, item)
    return time.perf_counter() - t0


def cold(features: dict, passes: int, tmp: Path) -> float:
    """samples/s with an empty cache per pass."""
    seconds, n = 0.0, 0
    for _ in range(passes):
        cfg = config(tmp / f"cold-{uuid.uuid4().hex[:8]}", features)
        index = open_corpus(cfg)
        pipe = SamplePipeline(cfg, index=index)
        pipe.warm_up()
        seconds += one_pass(pipe, index)
        n += index.n_items
        pipe.close()
    return n / seconds


def cached(features: dict, passes: int, warm_dir: Path) -> float:
    cfg = config(warm_dir, features)
    index = open_corpus(cfg)
    pipe = SamplePipeline(cfg, index=index)
    one_pass(pipe, index)  # fills the cache (the first round) or maps it
    decoded = pipe.counters.decoded
    seconds = sum(one_pass(pipe, index) for _ in range(passes))
    assert pipe.counters.decoded == decoded, "the filled cache missed"
    pipe.close()
    return passes * index.n_items / seconds


def batch_bytes_per_sample(cfg: Config) -> int:
    total = sum(int(np.prod(s)) * d.itemsize for s, d in cfg.batch_fields().values())
    return total // cfg.stager.batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    pin_math_threads(1)
    rates: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for r in range(args.rounds):
            for label, features in SCHEMAS.items():
                rates.setdefault(label, []).append(cold(features, args.passes, tmp))
            all_fields = SCHEMAS["all three"]
            rates.setdefault("all three, cached", []).append(
                cached(all_fields, 10 * args.passes, tmp / "warm")
            )
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.1f}" for k, v in rates.items()),
                flush=True,
            )
    base = statistics.median(rates["mel only"])
    print(f"\nmedian of {args.rounds} rounds, {args.passes} passes x 16 clips, math threads 1")
    print(
        f"{'schema':22s} {'samples/s':>10s} {'ms/sample':>10s} {'vs mel':>7s} "
        f"{'batch B/sample':>15s}"
    )
    for label, values in rates.items():
        med = statistics.median(values)
        features = SCHEMAS.get(label, SCHEMAS["all three"])
        size = batch_bytes_per_sample(config(tmp, features))
        print(f"{label:22s} {med:10,.1f} {1e3 / med:10.2f} {med / base:6.2f}x {size:15,d}")


if __name__ == "__main__":
    main()
