"""Small corpora on disk made of the shipped LJSpeech clips: some of their metadata lines,
manifests, a LibriTTS tree, WebDataset-style tar shards."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.audio import copy_clip
from tests.support.paths import MINI, WAVS


def shipped_lines() -> list[str]:
    """The shipped metadata.csv's lines (id|text|normalized text), in its order."""
    return (MINI / "metadata.csv").read_text().splitlines()


def shipped_corpus(folder: Path, lines: list[str]) -> Path:
    """An LJSpeech-layout corpus in folder: these metadata lines (shipped_lines(), or
    some of them in any order), each clip they name linked into wavs/; returns folder."""
    (folder / "wavs").mkdir(parents=True)
    for line in lines:
        wav = line.split("|")[0] + ".wav"
        (folder / "wavs" / wav).symlink_to(WAVS / wav)
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    return folder


def write_manifest(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = [
        line if isinstance(line, str) else json.dumps(line, ensure_ascii=False) for line in lines
    ]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def make_libritts(root: Path) -> None:
    for k, (speaker, chapter) in enumerate([("19", "198"), ("19", "227"), ("84", "121")]):
        folder = root / speaker / chapter
        folder.mkdir(parents=True)
        stem = f"{speaker}_{chapter}_000{k}_000000"
        copy_clip(folder / f"{stem}.wav", f"LJ001-000{k + 1}")
        (folder / f"{stem}.normalized.txt").write_text(f"Normalized {k}.")
        (folder / f"{stem}.original.txt").write_text(f"Original {k}!")
    (root / "84" / "121" / "84_121_0009_000000.normalized.txt").write_text("No audio.")


def make_shards(dst: Path, n_shards: int = 4, corrupt: str = "") -> list[str]:
    """The 16 shipped clips packed into n_shards WebDataset-style tars in dst: per clip
    <id>.wav and <id>.txt (odd shards: <id>.json with the text and a speaker). corrupt:
    the clip name (LJSpeech id) of a clip whose audio bytes are garbage. Returns the item
    ids in shard order: part-0000s/<clip> (docs/corpora.md#item-ids)."""
    import io
    import tarfile

    dst.mkdir(parents=True, exist_ok=True)
    rows = [line.split("|") for line in (WAVS.parent / "metadata.csv").read_text().splitlines()]
    ids = []
    per = -(-len(rows) // n_shards)
    for s in range(n_shards):
        with tarfile.open(dst / f"part-{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for item_id, _, text in rows[s * per : (s + 1) * per]:
                audio = (WAVS / f"{item_id}.wav").read_bytes()
                if item_id == corrupt:
                    audio = b"RIFF" + bytes(range(256)) * 8
                if s % 2:
                    side = json.dumps({"text": text, "speaker": f"spk{s}"}).encode()
                    members = [(f"{item_id}.wav", audio), (f"{item_id}.json", side)]
                else:
                    members = [(f"{item_id}.wav", audio), (f"{item_id}.txt", text.encode())]
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                ids.append(f"part-{s:05d}/{item_id}")
    return ids
