"""Texts that broke the cleaners: num2words' hangs and exceptions, control and format
characters, language codes as corpora write them, and the text cache's open race."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ringfeed.producer.prepare.lengths import text_tokens
from ringfeed.producer.prepare.prepare import corpus_vocabulary
from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text import normalize, number_words
from ringfeed.producer.text.encoder import TextEncoder, clean_text
from ringfeed.shared.config import Config, replace
from ringfeed.shared.language import detect as language_id
from ringfeed.shared.language import text_cache
from ringfeed.shared.language.codes import language_code
from tests.support.configs import jsonl_cfg
from tests.support.corpora import write_manifest
from tests.support.paths import WAVS


@pytest.mark.parametrize(
    ("text", "language", "expected"),
    [
        ("8164232", "am", "8164232"),  # num2words never returns
        ("20.0₽", "ro", None),  # IndexError
        ("ngày 31/12/1999", "vi", None),  # AttributeError for the year
        # Found by fuzzing (the review's fuzz3.py alphabet): OverflowError, RecursionError.
        ("£ 2332099900000.09 г8 31/12/1999%4 5", "en_IN", None),
        ("۲53.97 0۱٬1.1.2000۲7427۱2۱0.08₽e40ا0r6₽3479-.0 ,اm9m35º3244", "te", None),
        ("e5$70 / 9000.031/12/19995660.0﷼31/12/19990ª 961  71eا2e", "hu", None),
    ],
)
def test_num2words_failures_keep_digits_never_fail_or_hang(
    text: str, language: str, expected: str | None
) -> None:
    out = clean_text(text, language)
    assert out and (expected is None or out == expected)


def test_a_number_num2words_raises_on_keeps_its_digits(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("num2words.num2words", broken)  # what number_words imports
    number_words._digit_words.cache_clear()
    try:
        assert (
            normalize.Normalizer("de")("Es kostet 42 € und 7 %")
            == "es kostet 42 euro und 7 prozent"
        )
    finally:
        number_words._digit_words.cache_clear()


def test_any_cleaner_error_is_a_skip_and_costs_one_text(tmp_path: Path, monkeypatch) -> None:
    cfg = replace(Config(), features={"cache": False, "cache_dir": str(tmp_path)})
    encoder = TextEncoder(cfg)

    def broken(text: str, language: str) -> str:
        if "bad" in text:
            raise AttributeError("'NoneType' object has no attribute 'x'")
        return text

    monkeypatch.setattr("ringfeed.producer.text.encoder.clean_text", broken)
    with pytest.raises(SkipSample, match="AttributeError") as info:
        encoder.encode("a bad text", "x.wav", "vi")
    assert info.value.stage == "text"
    assert text_tokens(encoder, "a bad text", "vi") == 0
    assert text_tokens(encoder, "good", "vi") == 4 + cfg.text.add_eos


def test_vocabulary_counts_a_text_that_fails_and_goes_on(tmp_path: Path, monkeypatch) -> None:
    lines = [
        {"audio": str(WAVS / f"LJ001-000{k}.wav"), "text": t, "id": f"i{k}"}
        for k, t in ((1, "fine"), (2, "bad one"))
    ]
    cfg = jsonl_cfg(write_manifest(tmp_path / "m.jsonl", lines))
    cfg = replace(cfg, features={"cache": False, "cache_dir": str(tmp_path)})

    def broken(self, text: str, language: str = "en") -> str:
        if "bad" in text:
            raise RecursionError("deep")
        return text

    monkeypatch.setattr(TextEncoder, "_clean", broken)
    vocab = corpus_vocabulary(cfg)
    assert vocab.alphabet == "efin" and vocab.texts == 2
    assert vocab.failed == (("i2", "RecursionError: deep"),)


def test_control_and_format_characters_are_dropped_joiners_kept() -> None:
    assert clean_text("one\x00 two\u200f three\u00ad", "en") == "one two three"
    assert clean_text("a\tb\nc", "de") == "a b c"
    persian = "می\u200cخواهم\u200e\x00 \u200d"
    assert clean_text(persian, "fa") == "می\u200cخواهم \u200d"
    assert "\x00" not in clean_text("hallo\x00welt", "de")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("en-US", "en-us"),
        ("pt_BR", "pt-br"),
        ("EN", "en"),
        ("eng", "en"),
        ("deu-AT", "de-at"),
        ("fa", "fa"),
        ("cmn", "cmn"),
    ],
)
def test_language_codes_take_one_form(raw: str, code: str) -> None:
    assert language_code(raw) == code


def test_the_rule_set_follows_the_primary_subtag() -> None:
    english = clean_text("Dr. Smith paid $3", "en")
    for code in ("en-gb", "eng", "en-US", "en_us"):
        assert clean_text("Dr. Smith paid $3", code) == english
    assert clean_text("12", "deu") == clean_text("12", "de") == "zwölf"


def test_a_locked_cache_file_is_opened_on_a_later_try(tmp_path: Path, monkeypatch) -> None:
    real = sqlite3.connect
    calls = []

    def locked_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(text_cache.sqlite3, "connect", locked_once)
    cache = text_cache.TextCache(tmp_path)
    assert cache.enabled and len(calls) == 2
    cache.close()


def test_detection_writes_no_cache_when_the_cache_is_off(tmp_path: Path, monkeypatch) -> None:
    class Fixed:
        def detect(self, text: str) -> str:
            return "de"

    monkeypatch.setattr(language_id, "detector", lambda candidates: Fixed())
    assert language_id.detect_languages(["hallo"], ["de"], None) == ["de"]
    assert list(tmp_path.iterdir()) == []
    assert language_id.detect_languages(["hallo"], ["de"], str(tmp_path)) == ["de"]
    assert (tmp_path / text_cache.FILE_NAME).exists()
