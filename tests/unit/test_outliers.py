"""Audio that is not its text (data.outliers): the speaking-rate band learnt from a
corpus with known rates; near-silent and clipped clips judged on the decoded audio,
every shipped clip passing; what each policy makes of a marked clip in the producers'
pipeline, from a decode and from the feature cache (validate's band lines and --deep:
tests/process/test_outliers.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus import speaking_rate
from ringfeed.shared.corpus.lengths import UNKNOWN, Lengths
from ringfeed.shared.corpus.open import build_in_memory
from ringfeed.shared.corpus.speaking_rate import (
    BAND_K,
    MIN_CLIPS,
    MIN_SPREAD,
    out_of_band,
    rate_bands,
)
from ringfeed.shared.sample import marks as m
from tests.support.audio import judge_file, write_audio
from tests.support.outlier_corpus import SMALL, make_outlier_corpus
from tests.support.paths import REPO

CFG = Config()
SECONDS_PER_FRAME = CFG.features.hop_length / CFG.audio.sample_rate


def corpus_of(rates: dict[str, np.ndarray], seconds: np.ndarray) -> tuple[object, Lengths]:
    """An index face (languages, language_ids) and a length table whose clips speak at
    `rates` (tokens per second, per language) for `seconds` each."""
    languages = sorted(rates)
    ids = np.concatenate([np.full(len(rates[lang]), k) for k, lang in enumerate(languages)])
    rate = np.concatenate([rates[lang] for lang in languages])
    frames = np.round(seconds[: len(rate)] / SECONDS_PER_FRAME).astype(np.int32)
    tokens = np.round(rate * frames * SECONDS_PER_FRAME).astype(np.int32)
    index = SimpleNamespace(languages=tuple(languages), language_ids=ids.astype(np.int32))
    return index, Lengths(frames, tokens)


def test_the_band_is_learnt_per_language_and_finds_what_is_planted() -> None:
    rng = np.random.default_rng(0)
    en = 15.0 * np.exp(rng.normal(0, 0.12, 400))  # LJSpeech-like spread
    de = 11.0 * np.exp(rng.normal(0, 0.15, 300))
    planted = {3: 4.0, 10: 4.0, 50: 0.25, 420: 0.5}  # text x4, a clip cut to a quarter, ...
    for item, factor in planted.items():
        (en if item < 400 else de)[item % 400] *= factor
    few = np.full(MIN_CLIPS - 1, 14.0)  # a language with too few clips has no band
    seconds = rng.uniform(2, 10, 800)
    index, lengths = corpus_of({"en": en, "de": de, "ru": few}, seconds)
    lengths.frames[-1] = UNKNOWN  # no duration: no rate, never judged
    bands = rate_bands(CFG, index, lengths)
    assert set(bands) == {"de", "en"}
    for language, median, spread in (("en", 15.0, 0.12), ("de", 11.0, 0.15)):
        band = bands[language]
        assert band.median == pytest.approx(median, rel=0.03)
        assert band.spread == pytest.approx(spread, rel=0.15)  # the outliers do not widen it
        assert band.high / band.median == pytest.approx(math.exp(BAND_K * band.spread))
    # items in corpus order: de first (sorted languages), then en
    found = {o.item for o in out_of_band(CFG, index, lengths, bands)}
    want = {300 + i for i in planted if i < 400} | {i - 400 for i in planted if i >= 400}
    assert want <= found, (found, want)
    assert len(found - want) <= 3  # a normal sample has 0.27 % past 3 sigma by chance


def test_the_plausibility_bound_holds_from_the_first_clip_whatever_the_band() -> None:
    """A language of 8 clips has no band; a 1 s clip with a 400-character text in it is
    found all the same, by the bound; a clip a band learnt from fast clips would let
    through, but no one speaks, is told by the bound too; one outside both, by its band."""
    en = np.array([14.0, 15.0, 16.0, 13.0, 17.0, 15.5, 14.5, 400.0])
    de = np.array([12.0] * 11 + [0.25])
    fast = np.array([45.0] * 20 + [60.5])  # its band reaches 60.7 (median 45 x e^0.3)
    seconds = np.array([3.0] * 7 + [1.0] + [4.0] * 12 + [3.0] * 21)
    index, lengths = corpus_of({"de": de, "en": en, "xx": fast}, seconds)
    bands = rate_bands(CFG, index, lengths)
    assert "en" not in bands and bands["xx"].high > 60.0
    found = out_of_band(CFG, index, lengths, bands)
    assert [(o.item, o.band.language, o.band.fixed) for o in found] == [
        (11, "de", False),
        (19, "en", True),
        (40, "xx", True),
    ]
    assert found[1].rate == pytest.approx(400.0, rel=0.02)
    why = found[1].reason()
    assert "outside the plausibility bound 0.5..60.0 tokens/s" in why and "(fast:" in why
    assert "(slow:" in found[0].reason() and "its language's band" in found[0].reason()


def test_a_corpus_of_one_rate_gets_the_minimum_spread_not_a_band_of_zero_width() -> None:
    index, lengths = corpus_of({"ru": np.full(40, 14.9)}, np.linspace(2, 8, 40))
    band = rate_bands(CFG, index, lengths)["ru"]
    assert band.spread == MIN_SPREAD
    assert band.low < 14.9 * 0.8 and band.high > 14.9 * 1.3  # a clip 20 % slower is in


def test_every_shipped_clip_passes_and_near_silent_and_clipped_ones_are_marked(tmp_path) -> None:
    shipped = sorted((REPO / "data").rglob("*.wav")) + sorted((REPO / "data").rglob("*.flac"))
    assert len(shipped) == 56
    whole = replace(CFG, features={"on_too_long": "truncate"})  # judged whatever their length
    for path in shipped:
        assert judge_file(str(path), whole)[1] == 0, path
    speech, sr = sf.read(shipped[1], dtype="float32")
    t = np.arange(sr) / sr
    cases = {
        "quiet": (speech * 10 ** (-40 / 20), m.NEAR_SILENT),  # RMS about -61 dBFS
        "room-tone": (1e-4 * np.random.default_rng(1).standard_normal(sr), m.NEAR_SILENT),
        "clipped": (np.clip(speech * 4, -1, 1), m.CLIPPED),
        "soft-clip": (np.clip(speech * 3, -1, 1), m.CLIPPED),  # 0.31 % of samples flattened
        "barely": (np.clip(speech * 2.5, -1, 1), 0),  # 0.09 %: under CLIPPED_SHARE
        "sine": (0.99 * np.sin(2 * np.pi * 220 * t), 0),  # loud, not at full scale
    }
    for name, (wave, want) in cases.items():
        clip = write_audio(tmp_path / f"{name}.wav", wave, sample_rate=sr, subtype="PCM_16")
        marks = judge_file(str(clip), CFG)[1]
        assert marks == want, name


@pytest.mark.parametrize("policy", ["keep", "flag", "skip"])
def test_each_policy_takes_a_marked_clip_from_a_decode_and_from_the_cache(tmp_path, policy) -> None:
    manifest = make_outlier_corpus(tmp_path / "c")
    cfg = replace(
        Config(),
        data={"path": str(manifest), "format": "jsonl", "outliers": policy},
        audio=SMALL["audio"],
        features={**SMALL["features"], "cache_dir": str(tmp_path / "cache")},
        text=SMALL["text"],
    )
    index = build_in_memory(cfg)
    for run in ("decoded", "cached"):
        pipe = SamplePipeline(cfg)
        for item_id, want in (("quiet", m.NEAR_SILENT), ("clipped", m.CLIPPED), ("LJ001-0002", 0)):
            entry = index.entry(index.find(item_id))
            if policy == "skip" and want:
                with pytest.raises(SkipSample) as skip:
                    pipe(entry)
                assert skip.value.stage == "outlier" and m.audio_kinds(want)[0] in skip.value.reason
                continue
            sample = pipe(entry)
            assert sample.marks == (want if policy == "flag" else 0), (run, item_id)
        assert pipe.counters.decoded == (3 if run == "decoded" else 0), run
        pipe.close()


def test_the_report_lists_a_clip_once_per_run_and_a_resume_with_flag_delivers_skips(
    tmp_path,
) -> None:
    from ringfeed.consumer.stager.outliers import OutlierReport, _read, earlier_skips

    index = SimpleNamespace(item_id=lambda k: f"c{k}", path=lambda k: f"/c/{k}.wav")
    flag = replace(Config(), data={"outliers": "flag"})
    for _ in range(2):  # a stager restarted into the same run directory
        report = OutlierReport(flag, tmp_path, index)
        report.delivered(3, m.NEAR_SILENT | m.CLIPPED | m.TRUNCATED)
        report.delivered(4, m.TRUNCATED)  # no audio marks: nothing to list
        report.close()
    assert [(r["item_id"], r["kind"]) for r in _read(tmp_path / "outliers.jsonl")] == [
        ("c3", "near-silent+clipped")
    ]
    skips = {1: ("speaking rate ...", "outlier"), 2: ("unreadable", "audio")}
    assert earlier_skips(flag, skips) == {2: ("unreadable", "audio")}
    assert earlier_skips(replace(Config(), data={"outliers": "skip"}), skips) == skips


def test_a_corpus_on_object_storage_gets_no_band_until_its_lengths_are_measured() -> None:
    from ringfeed.consumer.stager.outliers import out_of_band_clips

    cfg = replace(Config(), data={"path": "s3://bucket/shards", "format": "shards"})
    index = SimpleNamespace(has_audio=True, n_items=3, stored_lengths=lambda key: None)
    assert out_of_band_clips(cfg, index) == []  # nothing fetched


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(1, 64), elements=st.floats(-1e6, 1e6)))
def test_the_bands_median_is_numpys_to_the_bit(x: np.ndarray) -> None:
    """speaking_rate.median stands in for np.median (whose first call imports numpy.ma,
    ~14 ms of a stager's start): the same float, odd and even lengths, ties, extremes."""
    assert speaking_rate.median(x) == float(np.median(x))
