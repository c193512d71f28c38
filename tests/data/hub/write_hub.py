"""Writes the dataset beside this file as Hugging Face datasets' push_to_hub writes one
(datasets 5.2.0, pyarrow as it installs), without the Hub: the same steps
(Dataset._push_parquet_shards_to_hub_single: contiguous shards, the audio files' bytes
embedded by embed_table_storage, to_parquet at push_to_hub's writer batch size) and the
same names (data/<split>-00000-of-00002.parquet). The project's `fixtures` extra
(pyproject.toml) declares it; to regenerate, from the repository root, in a throwaway
venv (neither the run time nor the tests need it, so keep it out of .venv):

    python3.11 -m venv /tmp/venv-fixtures
    /tmp/venv-fixtures/bin/pip install -e '.[fixtures]'
    /tmp/venv-fixtures/bin/python tests/data/hub/write_hub.py

The dataset is made from per-speaker folders, spk_a/0001.flac ... spk_a/0005.flac and
spk_b/0001.flac ... spk_b/0005.flac (clips of data/multilingual-demo: spk_a's the first
five English ones, spk_b's the first five German ones, with their texts), and
datasets embeds only each file's base name: every name but one repeats, across the two
train shards (spk_a's rows in the first, spk_b's in the second) and within the test
split (the two 0005s). Columns: audio, text, speaker_id (the folder), language.
"""

import json
import shutil
import tempfile
from pathlib import Path

import datasets
from datasets.arrow_writer import (
    get_writer_batch_size_from_data_size,
    get_writer_batch_size_from_features,
)
from datasets.table import embed_table_storage

HERE = Path(__file__).resolve().parent
DEMO = HERE.parents[2] / "data" / "multilingual-demo"
SPEAKERS = {"spk_a": "en", "spk_b": "de"}
CLIPS = 5  # per speaker: 0001-0004 train, 0005 test


def folders(top: Path) -> dict[str, list[dict]]:
    """The per-speaker folders under top, as rows of each split (audio: the file path)."""
    lines = [json.loads(line) for line in (DEMO / "train.jsonl").read_text().splitlines()]
    splits: dict[str, list[dict]] = {"train": [], "test": []}
    for speaker, language in SPEAKERS.items():
        (top / speaker).mkdir(parents=True)
        mine = [r for r in lines if Path(r["audio"]).name.startswith(f"{language}-")][:CLIPS]
        for n, row in enumerate(mine, 1):
            clip = top / speaker / f"{n:04d}.flac"
            shutil.copy(DEMO / row["audio"], clip)
            split = "train" if n < CLIPS else "test"
            splits[split].append(
                {
                    "audio": str(clip),
                    "text": row["text"],
                    "speaker_id": speaker,
                    "language": language,
                }
            )
    return splits


def push(ds: datasets.Dataset, split: str, num_shards: int) -> None:
    """push_to_hub's shards of ds, into data/ here."""
    writer_batch_size = get_writer_batch_size_from_features(
        ds.features
    ) or get_writer_batch_size_from_data_size(len(ds), ds._estimate_nbytes())
    for index in range(num_shards):
        shard = ds.shard(num_shards=num_shards, index=index, contiguous=True)
        shard = shard.with_format("arrow")
        shard = shard.map(
            embed_table_storage, batched=True, batch_size=writer_batch_size, keep_in_memory=True
        )
        path = HERE / "data" / f"{split}-{index:05d}-of-{num_shards:05d}.parquet"
        shard.to_parquet(path, batch_size=writer_batch_size)


def main() -> None:
    (HERE / "data").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as top:
        for split, rows in folders(Path(top)).items():
            # As datasets' docs make an audio dataset of local files: paths, then the
            # Audio feature (its cast keeps the paths; push_to_hub embeds the bytes).
            ds = datasets.Dataset.from_list(rows).cast_column("audio", datasets.Audio())
            push(ds, split, 2 if split == "train" else 1)


if __name__ == "__main__":
    main()
