"""Text in any language: each language's own words in its own script, tokens that decode
back to the text, poison texts quarantined before any cleaning, phonemes per language,
and the persistent caches that make a text seen before cost no work."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from ringfeed.producer.prepare.prepare import corpus_vocabulary
from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text.encoder import TextEncoder, clean_text
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.open import read_corpus
from ringfeed.shared.language import detect as language_id
from tests.support.paths import REPO

WAVS = REPO / "data" / "ljspeech-mini" / "wavs"

# Real sentences with dates, numbers, currency, percentages and ordinals.
TEXTS = {
    "en": "On 5 May 1999 the train cost $12.50, 30% more than the 2nd one.",
    "de": "Am 23.11.2026 fährt der Zug um 7 Uhr und kostet 12,50 €, 30 % mehr.",
    "fr": "Le 1er train du 14/07/2025 coûte 12,50 € et 20 % de plus.",
    "es": "El 2º tren del 5/11/2024 cuesta 1.234,5 € y un 30 % más.",
    "ru": "Поезд 23.11.2026 отправляется в 7 часов, стоит 1.234,5 ₽ и 3-й вагон на 15 % дороже.",
    "fa": "قطار ساعت ۷ حرکت می‌کند؛ بلیت ۱۲٫۵ یورو است و ۳۰٪ گران‌تر از ۲ام. كتاب علي",
    "ar": "يغادر القطار الساعة ٧ ويكلف ١٢ دولارا، أي أغلى بنسبة ٣٠٪.",
}
EXPECTED = {
    "en": "on five may nineteen ninety nine the train cost twelve dollars, fifty cents, thirty "
    "percent more than the second one.",
    "de": "am dreiundzwanzigsten november zweitausendsechsundzwanzig fährt der zug um sieben uhr "
    "und kostet zwölf euro fünfzig, dreißig prozent mehr.",
    "fr": "le premier train du quatorze juillet deux mille vingt cinq coûte douze euros "
    "cinquante et vingt pour cent de plus.",
    "es": "el segundo tren del cinco de noviembre de dos mil veinticuatro cuesta mil doscientos "
    "treinta y cuatro euros con cincuenta y un treinta por ciento más.",
    "ru": "поезд двадцать третьего ноября две тысячи двадцать шестого года отправляется в семь "
    "часов, стоит тысяча двести тридцать четыре рубля пятьдесят копеек и третий вагон на "
    "пятнадцать процентов дороже.",
    "fa": "قطار ساعت هفت حرکت می\u200cکند؛ بلیت دوازده و نیم یورو است و سی درصد گران\u200cتر از "
    "دوم. کتاب علی",
    "ar": "يغادر القطار الساعة سبعة ويكلف اثنا عشر دولارا، أي أغلى بنسبة ثلاثون بالمئة.",
}
SCRIPT = {
    "en": "LATIN",
    "de": "LATIN",
    "fr": "LATIN",
    "es": "LATIN",
    "ru": "CYRILLIC",
    "fa": "ARABIC",
    "ar": "ARABIC",
}


@pytest.mark.parametrize("language", list(TEXTS))
def test_normalized_in_the_languages_own_words_and_script(language: str) -> None:
    out = clean_text(TEXTS[language], language)
    assert out == EXPECTED[language]
    letters = [c for c in out if c.isalpha()]
    assert letters and all(unicodedata.name(c).startswith(SCRIPT[language]) for c in letters)
    assert not any(c.isdigit() for c in out)


def test_clock_times_and_phone_numbers_in_other_languages() -> None:
    assert (
        clean_text("Um 10:30 Uhr, 555-0199", "de")
        == "um zehn dreißig uhr, fünf fünf fünf, null eins neun neun"
    )
    assert clean_text("ساعت ۱۰:۳۰", "fa") == "ساعت ده سی"


def test_persian_script_fixes_keep_the_zero_width_non_joiner() -> None:
    out = clean_text("كي مي‌رود؟ ۱۴ و ٤", "fa")  # Arabic kaf and yeh, Arabic-Indic four
    assert out == "کی می\u200cرود؟ چهارده و چهار"
    assert "\u064a" not in out and "\u0643" not in out and "\u200c" in out


def manifest_config(tmp_path: Path, texts: dict[str, str], **text) -> Config:
    lines = [
        {"audio": str(WAVS / "LJ001-0002.wav"), "text": t, "language": lang, "id": f"{lang}-{k}"}
        for k, (lang, t) in enumerate(texts.items())
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n")
    cache = str(tmp_path / "cache")
    return replace(
        Config(),
        data={"path": str(path), "format": "jsonl"},
        features={"cache_dir": cache},
        text=text,
    )


def test_tokens_decode_to_the_normalized_text_in_every_language(tmp_path: Path) -> None:
    cfg = manifest_config(tmp_path, TEXTS)
    vocab = corpus_vocabulary(cfg)
    assert {"\u200c", "ж", "ß", "ی"} <= set(vocab.alphabet)  # every script's letters
    assert ("j", 1, "fr-2") in vocab.rare  # "juillet": one j in the whole corpus
    cfg = replace(cfg, text={"alphabet": vocab.alphabet})
    encoder = TextEncoder(cfg)
    for language, text in TEXTS.items():
        ids, truncated = encoder.encode(text, "", language)
        assert not truncated and encoder.decode(ids) == EXPECTED[language]


POISON = {
    "ten thousand digits": "7" * 10_000,
    "a megabyte of one letter": "ж" * 2**20,
    "mixed scripts": ("Zug قطار поезд 列車 🚆 " * 200),
}


@pytest.mark.parametrize("language", list(TEXTS))
def test_a_poison_text_is_quarantined_before_any_cleaning(language: str) -> None:
    """Skipped from its length alone (nothing is cleaned), so the cost is bounded; cut to
    MAX_RAW_FACTOR x max_text_len (truncate), cleaning that much stays cheap."""
    alphabet = "".join(sorted(set(EXPECTED[language]) | set("0123456789")))
    cfg = replace(Config(), text={"alphabet": alphabet}, features={"cache": False})
    encoder = TextEncoder(cfg)
    for what, text in POISON.items():
        with pytest.raises(SkipSample, match="before cleaning"):
            encoder.encode(text, what, language)
    cut = TextEncoder(
        replace(
            cfg,
            features={"on_too_long": "truncate", "cache": False},
            text={"max_unknown_frac": 1.0},
        )
    )
    for text in POISON.values():
        ids, truncated = cut.encode(text, "", language)
        assert truncated and len(ids) == cfg.text.max_text_len
    assert encoder.normalized == 0


def test_phonemes_per_language_alternating_in_one_process_and_cached(tmp_path: Path) -> None:
    texts = {
        "en": "The train leaves at seven.",
        "fa": "قطار ساعت ۷ حرکت می‌کند.",
        "de": "Der Zug fährt um 7 Uhr.",
        "ru": "Поезд уходит в 7 часов.",
    }
    cfg = manifest_config(tmp_path, texts, tokens="phonemes")
    vocab = corpus_vocabulary(cfg)
    cfg = replace(cfg, text={"alphabet": vocab.alphabet})
    first = TextEncoder(cfg)
    out = {lang: first.clean(t, lang) for lang, t in texts.items()}  # cached by vocab's pass
    assert first.phonemized == 0
    fresh = TextEncoder(replace(cfg, features={"cache": False}))  # phonemizes every call
    for _ in range(2):  # two languages alternating: each keeps its own voice
        for lang in ("en", "fa", "en", "de", "ru"):
            assert fresh._clean(texts[lang], lang) == out[lang]
    assert fresh.phonemized == 10
    assert out["en"] == "ðə tɹeɪn liːvz æt sɛvən"
    assert out["fa"].startswith("q") and "haft" in out["fa"]  # haft: seven, from ۷
    assert "(" not in "".join(out.values())  # no language-switch flags
    ids, _ = fresh.encode(texts["ru"], "", "ru")
    assert fresh.decode(ids) == out["ru"]


def test_detected_languages_are_cached_by_text(tmp_path: Path, monkeypatch) -> None:
    texts = {"fa": TEXTS["fa"], "de": TEXTS["de"], "ru": TEXTS["ru"], "en": TEXTS["en"]}
    cfg = manifest_config(tmp_path, texts)
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    stripped = [{k: v for k, v in json.loads(x).items() if k != "language"} for x in lines]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(x) for x in stripped) + "\n")
    auto = replace(cfg, data={"language": "auto", "detect_languages": ["de", "en", "fa", "ru"]})
    entries, _ = read_corpus(auto)
    assert [e.language for e in entries] == ["fa", "de", "ru", "en"]

    def no_detection(self, text: str) -> str:
        raise AssertionError("a cached text was detected again")

    monkeypatch.setattr(language_id.LanguageDetector, "detect", no_detection)
    again, _ = read_corpus(auto)
    assert [e.language for e in again] == ["fa", "de", "ru", "en"]


def test_a_broken_text_cache_costs_the_cache_never_the_sample(tmp_path: Path) -> None:
    (tmp_path / "text-cache.sqlite").write_bytes(b"not a database" * 100)
    cfg = replace(Config(), features={"cache_dir": str(tmp_path)})
    encoder = TextEncoder(cfg)
    for k in range(30):
        ids, _ = encoder.encode(f"Sample {k} is fine.", "", "en")
        assert encoder.decode(ids) == clean_text(f"Sample {k} is fine.")
    assert encoder.store is not None and encoder.store.errors == 1  # then off
    assert not encoder.store.enabled
