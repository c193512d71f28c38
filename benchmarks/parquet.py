"""Parquet corpora: a producer's cold path from Parquet against loose files, and the index
build of a million Parquet rows.

    .venv/bin/python benchmarks/parquet.py [--rounds 5] [--passes 5] [--rows 1000000]

Cold path: the 40 clips of data/multilingual-demo as loose files (a JSON-lines manifest,
data.format: jsonl) and the same clips in one Parquet file as Hugging Face datasets
writes it (the Audio feature's bytes uncompressed and PLAIN, 100 MB row groups: one),
each read by one producer's SamplePipeline with the feature cache off (decode, mel,
tokens), math libraries pinned to one thread as in a producer. The rounds alternate
loose and Parquet; the table gives each round's samples/s, the medians and their ratio
(target: Parquet at least 0.9x loose).

Index build: --rows rows in 10 files of datasets' layout (tiny audio blobs: the build
reads a few bytes a clip, never a clip, so their size does not matter), indexed by
`ringfeed index`'s build (shared/corpus/build.py) twice: with no cached rows (the
first build), and again after one file changed (every other file's rows come from
the cache beside the feature cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from ringfeed.producer.pipeline import SamplePipeline  # noqa: E402
from ringfeed.producer.process.threads import pin_math_threads  # noqa: E402
from ringfeed.shared.config import Config, load_config, replace  # noqa: E402
from ringfeed.shared.corpus.build import build  # noqa: E402
from ringfeed.shared.corpus.open import open_corpus  # noqa: E402

DEMO = REPO / "data" / "multilingual-demo"
AUDIO = pa.struct({"bytes": pa.binary(), "path": pa.string()})
# As datasets writes an Audio column (datasets/arrow_writer.py get_parquet_column_options).
WRITE = {
    "compression": {
        "audio.bytes": "none",
        "audio.path": "snappy",
        "text": "snappy",
        "speaker_id": "snappy",
        "language": "snappy",
    },
    "use_dictionary": ["audio.path", "text", "speaker_id", "language"],
    "column_encoding": {"audio.bytes": "PLAIN"},
}


def demo_rows() -> list[dict]:
    rows = [json.loads(line) for line in (DEMO / "train.jsonl").read_text().splitlines()]
    for row in rows:
        row["language"] = row.get("language") or Path(row["audio"]).name.split("-")[0]
    return rows


def corpora(folder: Path) -> tuple[Config, Config]:
    """(loose files, one Parquet file) of the demo's clips, as Configs of its run."""
    demo = load_config(REPO / "configs" / "multilingual.yaml")
    rows = demo_rows()
    manifest = folder / "loose.jsonl"
    manifest.write_text(
        "\n".join(json.dumps({**r, "audio": str(DEMO / r["audio"])}) for r in rows) + "\n"
    )
    audio = [
        {"bytes": (DEMO / r["audio"]).read_bytes(), "path": Path(r["audio"]).name} for r in rows
    ]
    table = pa.table(
        {
            "audio": pa.array(audio, AUDIO),
            "text": [r["text"] for r in rows],
            "speaker_id": [r["speaker"] for r in rows],
            "language": [r["language"] for r in rows],
        }
    )
    (folder / "hf").mkdir()
    pq.write_table(table, folder / "hf" / "train-00000-of-00001.parquet", **WRITE)
    common = {
        "features": {"cache": False, "cache_dir": str(folder / "cache")},
        "data": {"language": "en", "outliers": "keep"},
    }
    loose = replace(demo, **common)
    loose = replace(loose, data={"path": str(manifest), "format": "jsonl"})
    parquet = replace(demo, **common)
    parquet = replace(parquet, data={"path": str(folder / "hf"), "format": "parquet"})
    return loose, parquet


def cold_rate(cfg: Config, passes: int) -> float:
    """Samples/s of one producer's pipeline over every clip, `passes` times, cache off."""
    index = open_corpus(cfg, in_subprocess=False)
    entries = [index.entry(k) for k in range(index.n_items)]
    pipe = SamplePipeline(cfg, index=index)
    pipe(entries[0], 0)  # warm: librosa's filterbank, the text cleaners
    t0 = time.perf_counter()
    for _ in range(passes):
        for k, entry in enumerate(entries):
            pipe(entry, k)
    return passes * len(entries) / (time.perf_counter() - t0)


def million(folder: Path, rows: int, files: int = 10) -> Path:
    """rows rows of datasets' layout in `files` files (tiny audio blobs)."""
    per = rows // files
    out = folder / "million"
    out.mkdir()
    for f in range(files):
        base = f * per
        numbers = range(base, base + per)
        audio = pa.array(
            [
                {"bytes": b"RIFF" + n.to_bytes(8, "little"), "path": f"c{n:07d}.wav"}
                for n in numbers
            ],
            AUDIO,
        )
        table = pa.table(
            {
                "audio": audio,
                "text": [f"Sentence number {n} of the benchmark." for n in numbers],
                "speaker_id": [f"spk{n % 1000}" for n in numbers],
                "language": ["en"] * per,
            }
        )
        pq.write_table(table, out / f"train-{f:05d}-of-{files:05d}.parquet", **WRITE)
    return out


def index_build(folder: Path, rows: int) -> dict[str, float]:
    data = million(folder, rows)
    cfg = replace(
        Config(),
        data={"path": str(data), "format": "parquet"},
        features={"cache_dir": str(folder / "index-cache")},
    )
    t0 = time.perf_counter()
    header, _ = build(cfg)
    first = time.perf_counter() - t0
    assert header["n_items"] == rows, header["n_items"]
    changed = sorted(data.iterdir())[0]
    changed.write_bytes(changed.read_bytes())  # a new mtime: its rows are read again
    t0 = time.perf_counter()
    build(cfg)
    return {"first_s": first, "one_file_changed_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    pin_math_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-parquet-") as tmp:
        loose, parquet = corpora(Path(tmp))
        rates: dict[str, list[float]] = {"loose": [], "parquet": []}
        for r in range(args.rounds):
            order = [("loose", loose), ("parquet", parquet)]
            for name, cfg in order if r % 2 == 0 else order[::-1]:
                rates[name].append(cold_rate(cfg, args.passes))
            print(
                f"round {r + 1}: loose {rates['loose'][-1]:.1f}, "
                f"parquet {rates['parquet'][-1]:.1f} samples/s"
            )
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(
            f"cold path, median samples/s: loose {med['loose']:.1f}, parquet "
            f"{med['parquet']:.1f} ({med['parquet'] / med['loose']:.2f}x loose)"
        )
        built = index_build(Path(tmp), args.rows)
        print(
            f"index build, {args.rows:,} rows in 10 files: {built['first_s']:.1f} s "
            f"({args.rows / built['first_s']:,.0f} rows/s); again with one file changed: "
            f"{built['one_file_changed_s']:.1f} s"
        )


if __name__ == "__main__":
    main()
