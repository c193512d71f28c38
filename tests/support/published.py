"""Corpora in the shapes the field publishes them, made from the multilingual demo
(data/multilingual-demo: 40 clips, 3 speakers, 4 languages): a Common Voice release.
Each writer returns the reference of what it wrote: by item id, the Entry a reader
must give (absolute audio path, text, speaker, language, segment), made here from
the demo's manifest and never through the format under test."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import soundfile as sf

from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.language.codes import language_code
from tests.support.paths import REPO

DEMO = REPO / "data" / "multilingual-demo"
# The columns of a Common Voice 17 tsv, and of a release before locale was one (5.1).
CV17_COLUMNS = (
    "client_id",
    "path",
    "sentence_id",
    "sentence",
    "sentence_domain",
    "up_votes",
    "down_votes",
    "age",
    "gender",
    "accents",
    "variant",
    "locale",
    "segment",
)
CV5_COLUMNS = ("client_id", "path", "sentence", "up_votes", "down_votes", "age", "gender", "accent")


def demo_rows(language: str = "") -> list[dict]:
    """The demo's manifest lines (of one language), each with its language (the file
    name's prefix where the line names none) and its audio as an absolute path."""
    rows = []
    for line in (DEMO / "train.jsonl").read_text("utf-8").splitlines():
        row = json.loads(line)
        row["language"] = row.get("language") or Path(row["audio"]).name.split("-")[0]
        row["audio"] = str(DEMO / row["audio"])
        if not language or row["language"] == language:
            rows.append(row)
    return rows


def client_id(speaker: str) -> str:
    """A speaker as Common Voice names one: a 128-digit hex hash."""
    return hashlib.sha512(speaker.encode()).hexdigest()


def write_commonvoice(
    release: Path,
    locale: str,
    columns: tuple[str, ...] = CV17_COLUMNS,
    file_name: str = "validated.tsv",
    language: str = "",
) -> dict[str, Entry]:
    """A Common Voice locale folder release/<locale>: file_name beside clips/*.mp3 (the
    demo's clips of `language`, default the locale's, mp3 through libsndfile); -> the
    reference entries (their language: the locale's code)."""
    folder = release / locale
    code = language_code(locale)
    (folder / "clips").mkdir(parents=True, exist_ok=True)
    lines, reference = ["\t".join(columns)], {}
    for k, row in enumerate(demo_rows(language or locale)):
        item_id = f"common_voice_{locale}_{1000 + k}"
        mp3 = folder / "clips" / f"{item_id}.mp3"
        wave, sr = sf.read(row["audio"], dtype="float32")
        sf.write(mp3, wave, sr, format="MP3")
        values = {
            "client_id": client_id(row["speaker"]),
            "path": mp3.name,
            "sentence": row["text"],
            "locale": locale,
            "up_votes": "2",
            "down_votes": "0",
            "sentence_id": f"{k:064x}",
        }
        lines.append("\t".join(values.get(c, "") for c in columns))
        reference[item_id] = Entry(item_id, str(mp3), row["text"], client_id(row["speaker"]), code)
    (folder / file_name).write_text("\n".join(lines) + "\n", "utf-8")
    return reference


LHOTSE = REPO / "tests" / "data" / "lhotse"  # written by lhotse itself: write_manifests.py there


def lhotse_reference() -> dict[str, Entry]:
    """What the Lhotse manifests in LHOTSE say (their script's rule, made here from the
    demo's manifest): the first three clips of each language whole, and the first one's
    0.5 s to 1.5 s with its first three words."""
    reference = {}
    for language in ("de", "en", "fa", "ru"):
        for k, row in enumerate(demo_rows(language)[:3]):
            clip = Path(row["audio"])
            info = sf.info(clip)
            said = (row["text"], row["speaker"], language)
            reference[clip.stem] = Entry(
                clip.stem, str(clip), *said, 0.0, info.frames / info.samplerate
            )
            if k == 0:
                part = " ".join(row["text"].split()[:3])
                reference[f"{clip.stem}-part"] = Entry(
                    f"{clip.stem}-part", str(clip), part, *said[1:], 0.5, 1.0
                )
    return reference


PARQUET = REPO / "tests" / "data" / "parquet"  # written by datasets itself: write_parquet.py there


def parquet_reference() -> dict[str, Entry]:
    """What the Parquet files in PARQUET hold (their script's rule): the first three clips
    of each language, whole, each with its demo manifest line's text, speaker and
    language, every other one in the second file; their row without audio is no clip.
    Item ids: the file's path and the clip's name (docs/corpora.md#item-ids)."""
    clips = [e for k, e in lhotse_reference().items() if not k.endswith("-part")]
    out = {}
    for k, e in enumerate(clips):
        item_id = f"data/train-{k % 2:05d}-of-00002/{e.item_id}"
        out[item_id] = e._replace(item_id=item_id, offset_s=0.0, duration_s=0.0)
    return out


HUB = REPO / "tests" / "data" / "hub"  # written as push_to_hub writes: write_hub.py there


def hub_reference(split: str = "train") -> dict[str, Entry]:
    """What the dataset in HUB holds of a split (its script's rule): per-speaker folders
    spk_a (the first five English clips of the demo) and spk_b (the first five German),
    files 0001-0004 in train (spk_a's in its first shard, spk_b's in its second), 0005 in
    test (one file: their names repeat there, so its ids are its rows)."""
    out = {}
    for shard, (speaker, language) in enumerate((("spk_a", "en"), ("spk_b", "de"))):
        for n, row in enumerate(demo_rows(language)[:5], 1):
            if split == "train" and n < 5:
                item_id = f"data/train-{shard:05d}-of-00002/{n:04d}"
            elif split == "test" and n == 5:
                item_id = f"data/test-00000-of-00001/{shard:06d}"
            else:
                continue
            out[item_id] = Entry(item_id, row["audio"], row["text"], speaker, language)
    return out
