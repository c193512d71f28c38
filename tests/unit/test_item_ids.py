"""Item ids that never collide silently (docs/corpora.md#item-ids): in every format an
item's id is unique by construction, so a name that repeats across files or folders is
another clip, delivered; the same row twice is used once and reported with both places.
(Ids that stay when the corpus moves: tests/unit/test_identity.py; real runs over the
Hub dataset: tests/process/test_published_e2e.py.)"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.members import MemberReader
from ringfeed.shared.corpus.open import open_corpus, read_corpus
from ringfeed.shared.run.fingerprint import plan_changes, plan_fingerprint
from tests.support.paths import MINI
from tests.support.published import HUB, PARQUET, demo_rows, hub_reference


def cfg_of(path: Path, fmt: str, cache: Path, **data: object) -> Config:
    return replace(
        Config(),
        data={"path": str(path), "format": fmt, **data},
        audio={"sample_rate": 16000},
        features={"cache_dir": str(cache)},
    )


def test_a_hub_dataset_of_per_speaker_folders_keeps_every_row(tmp_path: Path) -> None:
    """push_to_hub's shards of spk_a/0001.flac ... spk_b/0004.flac: datasets kept only the
    base names, which repeat across the two shards. Every row is an item of its own, its
    bytes its source file's; the test split beside them is not read."""
    cfg = cfg_of(HUB, "parquet", tmp_path / "cache")
    entries, bad = read_corpus(cfg)
    reference = hub_reference()
    assert bad == [] and [e.item_id for e in entries] == list(reference)
    reader = MemberReader(cfg)
    for e in entries:
        want = reference[e.item_id]
        assert (e.text, e.speaker, e.language) == (want.text, want.speaker, want.language)
        assert reader.read(e.audio_path, *e.member) == Path(want.audio_path).read_bytes()
    index = open_corpus(cfg, in_subprocess=False)
    assert index.speakers == ("spk_a", "spk_b")
    assert index.shard_starts.tolist() == [0, 4, 8]


def test_the_same_row_twice_is_used_once_and_reported_with_both_places(tmp_path: Path) -> None:
    """A shard copied beside itself, and a row repeated within a file: each repeat is one
    unusable line naming its own place and the first's; a row alike in all but its audio
    is another clip."""
    folder = tmp_path / "hf" / "data"
    shutil.copytree(HUB / "data", folder)
    first = folder / "train-00000-of-00002.parquet"
    shutil.copy(first, folder / "train-00002-of-00002.parquet")
    table = pq.read_table(HUB / "data" / "train-00001-of-00002.parquet")
    other = dict(table.slice(1, 1).to_pylist()[0])
    other["audio"] = {"bytes": other["audio"]["bytes"][:-1] + b"\0", "path": "0002.flac"}
    twice = pa.concat_tables(
        [table, table.slice(0, 1), pa.Table.from_pylist([other], table.schema)]
    )
    pq.write_table(
        twice,
        folder / "train-00001-of-00002.parquet",
        use_dictionary=False,
        compression={"audio.bytes": "none"},
    )
    cfg = cfg_of(tmp_path / "hf", "parquet", tmp_path / "cache")
    entries, bad = read_corpus(cfg)
    ids = [e.item_id for e in entries]
    assert len(ids) == len(set(ids)) == 9  # 8 rows, and the one alike in all but its audio
    assert ids[4:] == [f"data/train-00001-of-00002/{k:06d}" for k in (0, 1, 2, 3, 5)]
    where = {(Path(b.file).name, b.line): b.reason for b in bad}
    assert len(bad) == 5
    assert all(r.startswith("duplicate row: the same as ") for r in where.values())
    for row in range(1, 5):
        assert where[("train-00002-of-00002.parquet", row)].endswith(
            f"train-00000-of-00002.parquet:{row} (its name, text, speaker, language and audio "
            "bytes): used once"
        )
    assert "train-00001-of-00002.parquet:1 " in where[("train-00001-of-00002.parquet", 5)]
    assert {b.item_id for b in bad} >= {"data/train-00000-of-00002/0001"}


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_line_listed_twice_is_one_item_and_one_duplicate_naming_both_lines(
    tmp_path: Path, fmt: str
) -> None:
    (tmp_path / "wavs").mkdir()
    shutil.copy(MINI / "wavs" / "LJ001-0001.wav", tmp_path / "wavs")
    shutil.copy(MINI / "wavs" / "LJ001-0002.wav", tmp_path / "wavs")
    if fmt == "csv":
        lines = [
            "audio_file|text",
            "wavs/LJ001-0001.wav|One.",
            "wavs/LJ001-0002.wav|Two.",
            "wavs/LJ001-0001.wav|One.",
        ]
        name = "metadata.csv"
    else:
        lines = [
            json.dumps({"audio": f"wavs/LJ001-000{n}.wav", "text": t})
            for n, t in ((1, "One."), (2, "Two."), (1, "One."))
        ]
        name = "manifest.jsonl"
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    entries, bad = read_corpus(cfg_of(tmp_path / name, fmt, tmp_path / "cache"))
    assert [e.item_id for e in entries] == ["wavs/LJ001-0001", "wavs/LJ001-0002"]
    first = 2 if fmt == "csv" else 1
    assert [(b.line, b.reason, b.item_id) for b in bad] == [
        (
            first + 2,
            f"duplicate item id 'wavs/LJ001-0001' (first on line {first})",
            "wavs/LJ001-0001",
        )
    ]


def test_folder_layouts_whose_names_repeat_across_folders(tmp_path: Path) -> None:
    """LibriTTS- and VCTK-like folders whose file names do not carry their speaker: each
    clip's id is its path, so spk_a's 0001 and spk_b's 0001 are two clips; LibriTTS's own
    names keep their utterance ids."""
    wav = (MINI / "wavs" / "LJ001-0001.wav").read_bytes()
    libritts = tmp_path / "libritts"
    for speaker in ("spk_a", "spk_b"):
        chapter = libritts / speaker / "ch1"
        chapter.mkdir(parents=True)
        (chapter / "0001.wav").write_bytes(wav)
        (chapter / "0001.normalized.txt").write_text(f"Said by {speaker}.")
    proper = libritts / "19" / "198"
    proper.mkdir(parents=True)
    (proper / "19_198_000000_000000.wav").write_bytes(wav)
    (proper / "19_198_000000_000000.normalized.txt").write_text("A LibriTTS name.")
    entries, bad = read_corpus(cfg_of(libritts, "libritts", tmp_path / "c1"))
    assert bad == [] and [(e.item_id, e.speaker) for e in entries] == [
        ("19_198_000000_000000", "19"),
        ("spk_a/ch1/0001", "spk_a"),
        ("spk_b/ch1/0001", "spk_b"),
    ]
    vctk = tmp_path / "vctk"
    for speaker in ("spk_a", "spk_b", "p225"):
        name = "p225_001" if speaker == "p225" else "001"
        (vctk / "txt" / speaker).mkdir(parents=True)
        (vctk / "wav48" / speaker).mkdir(parents=True)
        (vctk / "txt" / speaker / f"{name}.txt").write_text(f"Said by {speaker}.")
        (vctk / "wav48" / speaker / f"{name}.wav").write_bytes(wav)
    entries, bad = read_corpus(cfg_of(vctk, "vctk", tmp_path / "c2"))
    assert bad == [] and [e.item_id for e in entries] == ["p225_001", "spk_a/001", "spk_b/001"]


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_tar_shards_written_a_speaker_each(tmp_path: Path) -> None:
    """Shards of `tar -C spk_a -cf spk_a.tar .`: keys ./0001 in each. Each sample is an
    item (<shard>/<key>); a shard copied beside itself is used once, each repeat named."""
    shards = tmp_path / "shards"
    shards.mkdir()
    for k, speaker in enumerate(("spk_a", "spk_b")):
        clips = {}
        for n in (1, 2):
            clip = f"LJ001-000{2 * k + n}"
            clips[f"./000{n}.wav"] = (MINI / "wavs" / f"{clip}.wav").read_bytes()
            clips[f"./000{n}.json"] = json.dumps({"text": clip, "speaker": speaker}).encode()
        _tar(shards / f"{speaker}.tar", clips)
    cfg = replace(cfg_of(shards, "shards", tmp_path / "cache"), audio={"sample_rate": 22050})
    entries, bad = read_corpus(cfg)
    assert bad == [] and [(e.item_id, e.text) for e in entries] == [
        ("spk_a/0001", "LJ001-0001"),
        ("spk_a/0002", "LJ001-0002"),
        ("spk_b/0001", "LJ001-0003"),
        ("spk_b/0002", "LJ001-0004"),
    ]
    shutil.copy(shards / "spk_b.tar", shards / "spk_c.tar")
    entries, bad = read_corpus(cfg)
    assert len(entries) == 4 and [(Path(b.file).name, b.line, b.item_id) for b in bad] == [
        ("spk_c.tar", 1, "spk_b/0001"),
        ("spk_c.tar", 2, "spk_b/0002"),
    ]
    assert bad[0].reason.startswith(f"duplicate sample './0001': the same as in {shards}/spk_b.tar")


def test_a_lhotse_id_listed_twice_names_both_lines(tmp_path: Path) -> None:
    """A manifest's ids are lhotse's own; a repeat is reported at its line, naming the
    first's (it used to name the item's place in the index)."""
    rows = demo_rows("en")[:2]
    recordings = [
        {
            "id": f"r{k}",
            "sources": [{"type": "file", "channels": [0], "source": r["audio"]}],
            "sampling_rate": 16000,
            "num_samples": 16000,
            "duration": 1.0,
            "channel_ids": [0],
        }
        for k, r in enumerate(rows)
    ]
    sups = [
        {
            "id": "same",
            "recording_id": f"r{k}",
            "start": 0.0,
            "duration": 1.0,
            "channel": 0,
            "text": r["text"],
            "language": "English",
            "speaker": r["speaker"],
        }
        for k, r in enumerate(rows)
    ]
    for name, objs in (("recordings", recordings), ("supervisions", sups)):
        (tmp_path / f"x_{name}_train.jsonl").write_text("".join(json.dumps(o) + "\n" for o in objs))
    manifest = tmp_path / "x_supervisions_train.jsonl"
    entries, bad = read_corpus(cfg_of(manifest, "lhotse", tmp_path / "cache"))
    assert [e.item_id for e in entries] == ["same"]
    assert [(b.file, b.line, b.reason) for b in bad] == [
        (str(manifest), 2, "duplicate item id 'same' (first on line 1)")
    ]


def test_a_checkpoint_taken_under_the_old_ids_resumes_where_the_items_are_the_same(
    tmp_path: Path,
) -> None:
    """The Parquet fixture's ids were its clip names (none repeat): a cursor saved under
    them names the same plan, and resumes. One whose corpus the old rule cut short (the
    Hub dataset, half its rows lost as duplicates) is refused, saying that the ids are
    made anew."""
    cfg = cfg_of(PARQUET, "parquet", tmp_path / "c1")
    index = open_corpus(cfg, in_subprocess=False)
    ours = plan_fingerprint(cfg, index, [], [])
    old = __import__("hashlib").blake2b(digest_size=8)
    for k in range(index.n_items):  # the rule before: the audio's name, unique in its file
        entry = index.entry(k)
        rel = Path(entry.audio_path).relative_to(PARQUET).as_posix()
        old.update(f"{entry.item_id.rsplit('/', 1)[1]}|{rel}\n".encode())
    theirs = {**ours, "index": old.hexdigest()}
    del theirs["index_before"]  # a cursor from before the rule has no such part
    assert ours["index_before"] == old.hexdigest() and plan_changes(ours, theirs) == []
    hub = cfg_of(HUB, "parquet", tmp_path / "c2")
    ours = plan_fingerprint(hub, open_corpus(hub, in_subprocess=False), [], [])
    changed = plan_changes(ours, {**theirs, "index": "0" * 16})
    assert changed == [
        "dataset index: its item ids are made by a new rule since the checkpoint "
        "(docs/corpora.md#item-ids), and the old rule had lost rows as "
        "duplicates, or its files changed"
    ]
    assert plan_changes(ours, {**ours, "index": "0" * 16}) == ["dataset index"]
