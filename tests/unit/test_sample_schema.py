"""The declared sample schema: what derives from it, and fields of the user's own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.features.extra_fields import ExtraFields
from ringfeed.producer.features.mel import log_mel, log_mel_energy
from ringfeed.producer.features.prosody import pitch
from ringfeed.producer.features.references import SpeakerClips, choose_reference, cut_reference
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.sample import SkipSample, StageFailed, stage_of
from ringfeed.shared.config import Config, ConfigError, replace
from ringfeed.shared.corpus.open import open_corpus, read_corpus
from ringfeed.shared.memory.batch_ring import batch_views
from tests.support import user_fields
from tests.support.broken_dataset import GOOD_SOURCES
from tests.support.paths import MINI

USER = {
    "user_function": "tests.support.user_fields:fields",
    "user_version": "t1",
    "user_fields": user_fields.FIELDS,
}


def test_default_schema_is_tokens_and_mel() -> None:
    """The default sample is what the hard-coded fields were (byte-identical rings); a
    batch also says which rows are real and where each sits in the plan."""
    cfg = Config()
    assert cfg.sample_fields() == {
        "tokens": ((200,), np.dtype(np.int32)),
        "mel": ((800, 80), np.dtype(np.float32)),
    }
    assert list(cfg.batch_ring_fields()) == [
        "tokens",
        "text_lens",
        "mel",
        "mel_lens",
        "items",
        "position",
        "valid",
        "speaker",
        "language",
    ]
    assert cfg.batch_ring_fields()["mel"][0] == (32 * 800, 80)
    assert cfg.batch_fields()["tokens"][0] == (32, 200)


def test_every_field_derives_from_the_declaration() -> None:
    cfg = replace(
        Config(), features={"pitch": True, "energy": True, **USER}, stager={"buckets": [400, 800]}
    )
    slot = cfg.sample_fields()
    assert list(slot) == [
        "tokens",
        "mel",
        "pitch",
        "voiced",
        "energy",
        "loudness",
        "emotion",
        "style",
    ]
    assert slot["voiced"] == ((800,), np.dtype(np.uint8)) and slot["style"][0] == (4, 3)
    ring = cfg.batch_ring_fields()
    rows = cfg.max_batch_rows
    assert ring["pitch"][0] == (max(cfg.batch_frames, 800),)
    assert ring["style"][0] == (rows * 4, 3) and ring["style_lens"][0] == (rows,)
    assert ring["emotion"][0] == (rows, 2)
    specs = cfg.schema.batch_specs(cfg.stager.batch_size, bucketed=True)
    assert specs["pitch"][0] == (None, None) and specs["emotion"][0] == (None, 2)
    assert specs["style"][0] == (None, 4, 3)
    # One bucket's batch inside the flat slot: every field cut consistently.
    flat = {k: np.zeros(s, d) for k, (s, d) in ring.items()}
    views = batch_views(flat, 5, 400, 64, cfg.schema)
    assert views["mel"].shape == (5, 400, 80) and views["pitch"].shape == (5, 400)
    assert views["loudness"].shape == (5, 400) and views["tokens"].shape == (5, 64)
    assert views["style"].shape == (5, 4, 3) and views["emotion"].shape == (5, 2)
    assert np.shares_memory(views["energy"], flat["energy"])
    # A READY's lengths must agree: frames fields as the mel, none fields whole.
    assert cfg.schema.lengths_error([10, 50, 50, 50, 50, 50, 2, 3]) == ""
    assert "pitch has 49 rows, need 50" in cfg.schema.lengths_error([10, 50, 49, 50, 50, 50, 2, 3])
    assert "emotion" in cfg.schema.lengths_error([10, 50, 50, 50, 50, 50, 1, 3])


@pytest.mark.parametrize(
    ("features", "key", "says"),
    [
        (
            {
                "user_fields": [{"name": "mel", "shape": [1]}],
                "user_function": "a:b",
                "user_version": "1",
            },
            "user_fields[0].name",
            "built-in",
        ),
        (
            {"user_fields": [{"name": "x", "shape": [1]}], "user_function": "a:b"},
            "user_version",
            "cache",
        ),
        (
            {
                "user_fields": [{"name": "x", "shape": [1]}],
                "user_function": "ab",
                "user_version": "1",
            },
            "user_function",
            "package.module:function",
        ),
        (
            {
                "user_fields": [{"name": "x", "length": "own"}],
                "user_function": "a:b",
                "user_version": "1",
            },
            "user_fields[0].shape",
            "at least one dimension",
        ),
        ({"pitch": True, "device": "stager"}, "features.pitch", "device: producer"),
    ],
)
def test_bad_declarations_say_what_to_change(features: dict, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        replace(Config(), features=features)
    assert key in str(err.value) and says in str(err.value)


def _mini(tmp_path: Path, **features: object) -> tuple[Config, list]:
    cfg = replace(
        Config(),
        data={"path": str(MINI)},
        features={"cache_dir": str(tmp_path / "cache"), **features},
    )
    entries, _ = read_corpus(cfg)
    return cfg, [e for e in entries if e.item_id in GOOD_SOURCES]  # 1.8-2.6 s each


def test_user_fields_pitch_energy_computed_then_cached(tmp_path: Path) -> None:
    cfg, entries = _mini(tmp_path, pitch=True, energy=True, **USER)
    first = SamplePipeline(cfg)
    samples = [first(e) for e in entries]
    assert first.counters.extras == 3 and first.counters.decoded == 3
    for e, s in zip(entries, samples, strict=True):
        n = s.mel.shape[0]
        assert {k: v.shape[0] for k, v in s.fields.items()} == {
            "pitch": n,
            "voiced": n,
            "energy": n,
            "loudness": n,
            "emotion": 2,
            "style": 1 + len(e.text) % 4,
        }
        assert s.fields["voiced"].dtype == np.uint8 and s.fields["voiced"].any()
        assert (s.fields["pitch"][s.fields["voiced"] == 1] >= 65).all()
        np.testing.assert_array_equal(s.fields["loudness"], s.mel.mean(axis=1))
        assert s.fields["emotion"].tolist() == [len(e.text), ord(e.text[0])]
    again = SamplePipeline(cfg)  # a new process: every field from the cache, bit for bit
    for s, e in zip(samples, entries, strict=True):
        hit = again(e)
        for name, x in s.fields.items():
            np.testing.assert_array_equal(hit.fields[name], x, err_msg=name)
            assert hit.fields[name].dtype == x.dtype
    assert again.counters.decoded == 0 and again.counters.cache_hits == 3
    # A new user_version recomputes the user's fields, and keeps the mels and prosody.
    cfg2 = replace(cfg, features={"user_version": "t2"})
    third = SamplePipeline(cfg2)
    third(entries[0])
    assert third.counters.decoded == 1


def test_energy_and_pitch_follow_the_mel(tmp_path: Path) -> None:
    cfg, entries = _mini(tmp_path)
    import soundfile as sf

    wave, _ = sf.read(entries[0].audio_path, dtype="float32")
    mel, energy = log_mel_energy(wave, cfg)
    np.testing.assert_array_equal(mel, log_mel(wave, cfg))  # the same STFT, the same mel
    assert energy.shape == (mel.shape[0],) and energy.dtype == np.float32
    f0, voiced = pitch(wave, mel.shape[0], cfg)
    assert f0.shape == voiced.shape == (mel.shape[0],)
    assert 80 < np.median(f0[voiced == 1]) < 400  # a speaking voice


def test_user_function_that_raises_costs_that_item(tmp_path: Path) -> None:
    cfg, entries = _mini(
        tmp_path, cache=False, **{**USER, "user_function": "tests.support.user_fields:raising"}
    )
    pipe = SamplePipeline(cfg)
    ok = []
    for e in entries:
        try:
            pipe(e)
            ok.append(e.item_id)
        except StageFailed as failed:
            assert isinstance(failed.error, KeyError)
            assert failed.stage == "user" and e.item_id == "LJ001-0008"
    assert ok == [e.item_id for e in entries if e.item_id != "LJ001-0008"]


def test_wrong_shape_is_refused_naming_field_and_shapes(tmp_path: Path) -> None:
    cfg, entries = _mini(
        tmp_path, cache=False, **{**USER, "user_function": "tests.support.user_fields:wrong_shape"}
    )
    with pytest.raises(SkipSample) as skip:
        SamplePipeline(cfg)(entries[0])
    assert skip.value.stage == "user"
    assert "'emotion' has shape (3,), declared (2,)" in skip.value.reason


@pytest.mark.parametrize("function", ["in_place", "too_wide"])
def test_a_function_that_edits_its_input_or_overflows_costs_its_clip(
    tmp_path: Path, function: str
) -> None:
    """mel and wave are read-only to the user's function (an edit in place raises, and the
    delivered mel and its cache entry stay the clip's log-mel); an int64 value beyond
    int32 is refused, never wrapped."""
    cfg, entries = _mini(
        tmp_path, **{**USER, "user_function": f"tests.support.user_fields:{function}"}
    )
    pipe = SamplePipeline(cfg)
    with pytest.raises(SkipSample if function == "too_wide" else StageFailed) as caught:
        pipe(entries[0])
    assert stage_of(caught.value) == "user"
    assert ("beyond int32" if function == "too_wide" else "read-only") in str(caught.value)
    good = replace(cfg, features={"user_function": "tests.support.user_fields:fields"})
    fresh = replace(good, features={"cache_dir": str(tmp_path / "fresh")})
    # What the failed call may have cached is the clip's own mel, bit for bit.
    np.testing.assert_array_equal(
        SamplePipeline(good)(entries[0]).mel, SamplePipeline(fresh)(entries[0]).mel
    )


def test_unknown_user_function_is_a_config_error() -> None:
    cfg = replace(Config(), features={**USER, "user_function": "tests.support.user_fields:nope"})
    with pytest.raises(ConfigError, match="has no function nope"):
        ExtraFields(cfg)


def _speakers(tmp_path: Path, speakers: list[str], **features: object) -> tuple[Config, list]:
    """One clip per speaker name given (short LJSpeech clips, in turn)."""
    lines = [
        json.dumps(
            {
                "audio": str(MINI / "wavs" / f"{GOOD_SOURCES[k % 3]}.wav"),
                "text": f"Clip {k}.",
                "speaker": s,
                "id": f"c{k}",
            }
        )
        for k, s in enumerate(speakers)
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    cfg = replace(
        Config(),
        data={"path": str(tmp_path / "train.jsonl"), "format": "jsonl"},
        features={
            "cache_dir": str(tmp_path / "cache"),
            "reference": True,
            "reference_frames": 64,
            **features,
        },
    )
    return cfg, list(open_corpus(cfg).entries)


def test_reference_is_another_clip_of_the_speaker_fixed_by_seed_epoch_item(
    tmp_path: Path,
) -> None:
    cfg, entries = _speakers(tmp_path, ["a", "b", "a", "a", "c"])
    clips = SpeakerClips(open_corpus(cfg))
    for item, entry in enumerate(entries):
        refs = {choose_reference(clips, item, epoch, cfg)[0] for epoch in range(8)}
        if entry.speaker == "a":
            assert refs <= {0, 2, 3} - {item} and len(refs) == 2  # both others, in turn
        else:
            assert refs == {item}  # a speaker's only clip
        assert choose_reference(clips, item, 5, cfg)[0] == choose_reference(clips, item, 5, cfg)[0]
    pipe = SamplePipeline(cfg, index=open_corpus(cfg))
    sample = pipe(entries[0], 0, epoch=1)
    ref, rng = choose_reference(clips, 0, 1, cfg)
    full = SamplePipeline(cfg, index=open_corpus(cfg))(entries[ref], ref).mel
    want = cut_reference(full, 64, rng)
    assert sample.fields["ref_mel"].shape == (64, cfg.features.n_mels)
    np.testing.assert_array_equal(sample.fields["ref_mel"], want)
    pipe(entries[1], 1)
    assert pipe.counters.reference_own == 1


def test_single_clip_speaker_skipped_when_asked(tmp_path: Path) -> None:
    cfg, entries = _speakers(tmp_path, ["a", "b", "a"], single_clip="skip")
    pipe = SamplePipeline(cfg, index=open_corpus(cfg))
    assert pipe(entries[0], 0).fields["ref_mel"].shape[1] == cfg.features.n_mels
    with pytest.raises(SkipSample) as skip:
        pipe(entries[1], 1)
    assert skip.value.stage == "reference" and "no other clip" in skip.value.reason


def test_durations_from_files_checked_against_tokens_and_frames(tmp_path: Path) -> None:
    plain, entries = _mini(tmp_path, cache=False)
    cfg = replace(plain, features={"durations_dir": str(tmp_path / "dur")})
    assert cfg.sample_fields()["durations"] == ((200,), np.dtype(np.int32))
    first = SamplePipeline(plain)
    for e in entries:
        s = first(e)
        user_fields.write_durations(tmp_path / "dur", e.item_id, len(s.tokens), len(s.mel))
    pipe = SamplePipeline(cfg)
    for e in entries:
        s = pipe(e)
        d = s.fields["durations"]
        assert d.dtype == np.int32 and len(d) == len(s.tokens) and d.sum() == len(s.mel)
    (tmp_path / "dur" / f"{entries[0].item_id}.durations").write_text("3 4 5\n")
    with pytest.raises(SkipSample) as skip:
        pipe(entries[0])
    assert skip.value.stage == "durations" and "3 durations for" in skip.value.reason
    (tmp_path / "dur" / f"{entries[1].item_id}.durations").unlink()
    with pytest.raises(SkipSample, match="no such file in features.durations_dir"):
        pipe(entries[1])


def test_stager_mels_come_with_the_producers_reference_and_user_fields(tmp_path: Path) -> None:
    """features.device: stager: producers write the wave, a reference mel and fields of
    no frame axis; the stager's batch holds them beside the mels it computes."""
    pytest.importorskip("tensorflow")
    from tests.support.assembled import first_batch

    user = {
        "user_function": "tests.support.user_fields:wave_only",
        "user_version": "t1",
        "user_fields": user_fields.FIELDS[1:],
        "device": "stager",
    }
    cfg, entries = _speakers(tmp_path, ["a", "a"], **user)
    cfg = replace(cfg, stager={"batch_size": 3, "epochs": 1})
    pipe = SamplePipeline(cfg, index=open_corpus(cfg))
    samples = {k: pipe(e, k) for k, e in enumerate(entries)}
    with first_batch(cfg, samples.__getitem__, tmp_path) as first:
        view, n_valid, items = first.views, first.n_valid, first.items
        assert n_valid == 2 and view["mel"].shape == (3, cfg.features.max_frames, 80)
        assert sorted(items) == [0, 1]
        for row, item in enumerate(items):
            s = samples[item]
            ref, m = s.fields["ref_mel"], int(view["ref_mel_lens"][row])
            assert m == len(ref) and np.array_equal(view["ref_mel"][row, :m], ref)
            assert np.array_equal(view["emotion"][row], s.fields["emotion"])
            n = len(s.fields["style"])
            assert view["style_lens"][row] == n and (view["style"][row, n:] == -1).all()
            assert abs(int(view["mel_lens"][row]) - (1 + len(s.wave) // 256)) <= 1
        assert (view["style"][2] == -1).all() and view["ref_mel_lens"][2] == 0


def test_synthetic_items_carry_every_declared_field_and_the_row_check_covers_them(
    tmp_path: Path,
) -> None:
    """Synthetic data (transport tests, the soak, the ring benchmark) synthesizes every
    optional field from the item; check_synthetic_rows checks each row of each."""
    from ringfeed.producer.sources import RowMismatch, SyntheticSource, check_synthetic_rows
    from tests.support.assembled import first_batch

    features = {
        "max_frames": 32,
        "pitch": True,
        "energy": True,
        "reference": True,
        "reference_frames": 8,
        **USER,
    }
    cfg = replace(
        Config(),
        data={"format": "synthetic", "synthetic_items": 40},
        features=features,
        text={"max_text_len": 32},
        stager={"batch_size": 4, "buckets": [16, 32]},
    )
    source = SyntheticSource(cfg)
    with first_batch(cfg, source.prepare, tmp_path) as first:
        view, n_valid, items = first.views, first.n_valid, first.items
        assert n_valid >= 2 and check_synthetic_rows(view, n_valid, cfg) == items[:n_valid]
        view["style"][1, 0, 0] += 1  # one value of one row of one field
        with pytest.raises(RowMismatch, match="row 1: style"):
            check_synthetic_rows(view, n_valid, cfg)
