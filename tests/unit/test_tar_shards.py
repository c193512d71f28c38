"""Tar shards without a server (shared/corpus/formats/shards.py): member indexes are built once, a
corrupt member or tar header costs itself."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from ringfeed.shared.corpus.open import open_corpus
from tests.support.configs import shards_cfg
from tests.support.corpora import make_shards
from tests.support.paths import MINI


def test_member_indexes_are_built_once_and_a_broken_tar_costs_its_rest(tmp_path: Path) -> None:
    ids = make_shards(tmp_path / "shards")
    cfg = shards_cfg(str(tmp_path / "shards"), tmp_path)
    index = open_corpus(cfg, in_subprocess=False)
    assert [e.item_id for e in index.entries] == ids and not index.bad_lines
    first = index.entry(5)
    with open(first.audio_path, "rb") as f:  # the member is the clip's own bytes
        f.seek(first.member[0])
        clip = first.item_id.removeprefix("part-00001/")  # shard 1's clips
        assert f.read(first.member[1]) == (MINI / f"wavs/{clip}.wav").read_bytes()
    assert index.entry(5).speaker == "spk1" and index.entry(0).speaker == ""
    cached = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache/shards").iterdir()}
    assert len(cached) == 4
    # A fifth shard whose second header is garbage: its first clip is kept, the rest lost.
    with tarfile.open(tmp_path / "shards/part-00004.tar", "w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in (
            ("new.wav", (MINI / "wavs/LJ001-0001.wav").read_bytes()),
            ("new.txt", b"A new clip."),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    raw = bytearray((tmp_path / "shards/part-00004.tar").read_bytes())
    second = 512 + -(-len((MINI / "wavs/LJ001-0001.wav").read_bytes()) // 512) * 512
    raw[second : second + 512] = b"\x07" * 512
    (tmp_path / "shards/part-00004.tar").write_bytes(bytes(raw))
    again = open_corpus(cfg, in_subprocess=False)
    reasons = [b.reason for b in again.bad_lines]
    assert any("unreadable tar header" in r for r in reasons), reasons
    assert any("no text member" in r for r in reasons) and again.n_items == 16
    kept = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache/shards").iterdir() if p in cached}
    assert kept == cached, "the four unchanged shards were scanned again"
