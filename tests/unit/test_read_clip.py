"""read_clip (shared/corpus/clips.py), the one way every reader reads a clip: a file, a tar
shard member, a byte range of a Parquet page (the files `datasets` wrote), an object of a
store (fsspec's in-memory store: the same client path as s3://, no server) and an offset
segment each give the very samples of the clip they claim to be; what cannot be read
says why, as the quarantine will."""

from __future__ import annotations

from pathlib import Path

import fsspec
import numpy as np
import pytest
import soundfile as sf

from ringfeed.producer.audio.decode import decode, read_header
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.clips import ClipError, ClipMissing, ClipReader
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.open import read_corpus
from tests.support.corpora import make_shards
from tests.support.paths import WAVS
from tests.support.published import PARQUET, parquet_reference

CLIP = WAVS / "LJ001-0002.wav"


def samples(path: Path | str) -> np.ndarray:
    return sf.read(path, dtype="float32", always_2d=True)[0]


def reader(tmp_path: Path, **data: object) -> tuple[Config, ClipReader]:
    cfg = replace(Config(), data=data, features={"cache_dir": str(tmp_path / "cache")})
    return cfg, ClipReader(cfg)


def decoded(clips: ClipReader, entry: Entry) -> np.ndarray:
    with clips.read_clip(entry) as clip:
        return decode(clip)[0]


def test_a_file_and_a_segment_of_it(tmp_path: Path) -> None:
    """0.25 s at 22,050 Hz is 5,512 samples (round half to even), from 0.5 s on."""
    _, clips = reader(tmp_path)
    whole = samples(CLIP)
    with clips.read_clip(Entry("a", str(CLIP), "")) as clip:
        assert clip.is_file and clip.size == CLIP.stat().st_size
        assert read_header(clip).frames == len(whole)
        np.testing.assert_array_equal(decode(clip)[0], whole)
    assert clip.fd is None  # closed with the block
    segment = Entry("a", str(CLIP), "", offset_s=0.5, duration_s=0.25)
    np.testing.assert_array_equal(decoded(clips, segment), whole[11025 : 11025 + 5512])


def test_tar_shard_members_are_their_own_files(tmp_path: Path) -> None:
    make_shards(tmp_path / "shards", n_shards=2)
    cfg, clips = reader(tmp_path, path=str(tmp_path / "shards"), format="shards")
    entries, _ = read_corpus(cfg)
    assert len(entries) == 16 and all(e.member for e in entries)
    key = lambda e: e.item_id.rsplit("/", 1)[-1]  # noqa: E731  ids are <shard>/<key>
    for e in entries:
        np.testing.assert_array_equal(decoded(clips, e), samples(WAVS / f"{key(e)}.wav"))
    first = entries[0]
    with clips.read_clip(first, head=64) as clip:  # a header read: the head, then on demand
        assert len(clip.data) == 64 and clip.size == first.member[1]
        assert clip.read_at(40, 100) == (WAVS / f"{key(first)}.wav").read_bytes()[40:140]


def test_parquet_byte_ranges_are_the_files_datasets_embedded(tmp_path: Path) -> None:
    cfg, clips = reader(tmp_path, path=str(PARQUET), format="parquet")
    cfg = replace(cfg, audio={"sample_rate": 16000})
    entries, _ = read_corpus(cfg)
    reference = parquet_reference()
    assert entries
    for e in entries:
        np.testing.assert_array_equal(decoded(clips, e), samples(reference[e.item_id].audio_path))


def test_an_object_of_a_store_is_read_whole_through_the_stores_client(tmp_path: Path) -> None:
    store = fsspec.filesystem("memory")
    store.pipe("/clips/LJ001-0002.wav", CLIP.read_bytes())
    _, clips = reader(tmp_path)
    url = "memory://clips/LJ001-0002.wav"
    np.testing.assert_array_equal(decoded(clips, Entry("a", url, "")), samples(CLIP))
    segment = Entry("a", url, "", offset_s=0.5, duration_s=0.25)
    np.testing.assert_array_equal(decoded(clips, segment), samples(CLIP)[11025 : 11025 + 5512])
    with pytest.raises(ClipMissing) as gone:
        clips.read_clip(Entry("b", "memory://clips/nothing.wav", ""))
    assert gone.value.reason == "audio file not found"


def test_what_cannot_be_read_says_why(tmp_path: Path) -> None:
    make_shards(tmp_path / "shards", n_shards=1)
    cfg, clips = reader(tmp_path, path=str(tmp_path / "shards"), format="shards")
    member = read_corpus(cfg)[0][0]
    with pytest.raises(ClipMissing) as gone:
        clips.read_clip(Entry("a", str(tmp_path / "missing.wav"), ""))
    assert gone.value.reason == "audio file not found"
    shard = Path(member.audio_path)
    shard.rename(shard.with_suffix(".gone"))
    with pytest.raises(ClipMissing) as gone:
        clips.read_clip(member)
    assert gone.value.reason == "audio file not found (its tar shard)"
    shard.with_suffix(".gone").write_bytes(b"")
    shard.with_suffix(".gone").rename(shard)  # cut short: the member lies past its end
    with pytest.raises(ClipError) as cut:
        ClipReader(cfg).read_clip(member)
    assert cut.value.reason.startswith("unreadable tar shard member (")
