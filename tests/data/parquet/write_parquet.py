"""Writes the Parquet files beside this file with Hugging Face datasets itself (datasets
5.2.0, pyarrow as it installs), so the tests read files datasets really wrote without
datasets installed. The project's `fixtures` extra (pyproject.toml) declares it; to
regenerate, from the repository root, in a throwaway venv (neither the run time nor the
tests need it, so keep it out of .venv):

    python3.11 -m venv /tmp/venv-fixtures
    /tmp/venv-fixtures/bin/pip install -e '.[fixtures]'
    /tmp/venv-fixtures/bin/python tests/data/parquet/write_parquet.py

The rows are the clips of tests/support/published.py lhotse_reference's rule: the first
three clips of each language of data/multilingual-demo, their bytes embedded in the
Audio feature (as push_to_hub embeds them: bytes and the file's name), with text,
speaker_id and language columns, split in two files as the Hub names them. Row groups
are made small (MAX_ROW_GROUP_SIZE 100 KB, about two clips) so that the tests cross
row groups and pages; the second file ends with a row whose audio is None.
"""

import json
from pathlib import Path

import datasets
import pyarrow as pa

HERE = Path(__file__).resolve().parent
DEMO = HERE.parents[2] / "data" / "multilingual-demo"
FEATURES = datasets.Features(
    {
        "audio": datasets.Audio(),
        "text": datasets.Value("string"),
        "speaker_id": datasets.Value("string"),
        "language": datasets.Value("string"),
    }
)


def rows() -> list[dict]:
    lines = [json.loads(line) for line in (DEMO / "train.jsonl").read_text().splitlines()]
    out = []
    for language in ("de", "en", "fa", "ru"):
        for row in [r for r in lines if Path(r["audio"]).name.startswith(f"{language}-")][:3]:
            clip = DEMO / row["audio"]
            out.append(
                {
                    "audio": {"bytes": clip.read_bytes(), "path": clip.name},
                    "text": row["text"],
                    "speaker_id": row["speaker"],
                    "language": language,
                }
            )
    return out


def main() -> None:
    datasets.config.MAX_ROW_GROUP_SIZE = "100KB"
    everything = rows()
    halves = [everything[0::2], everything[1::2]]
    halves[1].append(
        {"audio": None, "text": "No audio here.", "speaker_id": "ava", "language": "en"}
    )
    (HERE / "data").mkdir(exist_ok=True)
    for k, half in enumerate(halves):
        table = pa.Table.from_pylist(half, schema=FEATURES.arrow_schema)
        datasets.Dataset(table).to_parquet(HERE / "data" / f"train-{k:05d}-of-00002.parquet")


if __name__ == "__main__":
    main()
