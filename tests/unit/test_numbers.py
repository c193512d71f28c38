"""Numbers read as speakers say them, in every language with rules (years, ordinals,
decimals, money), and texts with nothing to speak skipped with their reason
(issue 31, item 7; docs/languages.md has the table per language)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.producer.prepare.lengths import text_tokens
from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text.encoder import TextEncoder, clean_text
from ringfeed.producer.text.number_rules import LANGUAGES
from ringfeed.shared.config import Config, replace

# The issue's examples: what the producers made of them, and what speakers say.
ISSUE = [
    ("Im Jahr 1998", "im jahr neunzehnhundertachtundneunzig"),  # was eintausendneunhundert...
    ("Am 3. Oktober", "am dritten oktober"),  # was "am drei. oktober"
    ("12,50 Euro", "zwölf euro fünfzig"),  # was "zwölf komma fünf euro"
]


@pytest.mark.parametrize(("raw", "expected"), ISSUE)
def test_the_issues_german_examples(raw: str, expected: str) -> None:
    assert clean_text(raw, "de") == expected


# (language, kind, raw, expected): a year, an ordinal, a decimal and an amount of money
# in every language of LANGUAGES, as its speakers say them.
CASES = [
    ("de", "year", "Seit 1998 gilt es.", "seit neunzehnhundertachtundneunzig gilt es."),
    ("de", "year", "1998 gewann er.", "neunzehnhundertachtundneunzig gewann er."),
    ("de", "year", "Am 3. Oktober 1990", "am dritten oktober neunzehnhundertneunzig"),
    ("de", "ordinal", "Der 1. Platz in der 2. Runde", "der erste platz in der zweiten runde"),
    ("de", "ordinal", "vom 3. bis 5. Mai", "vom dritten bis fünften mai"),
    ("de", "date", "am 23.11.2026", "am dreiundzwanzigsten november zweitausendsechsundzwanzig"),
    ("de", "decimal", "Der Wert ist 12,50.", "der wert ist zwölf komma fünf null."),
    ("de", "money", "Es kostet 12,50 €.", "es kostet zwölf euro fünfzig."),
    ("de", "money", "1 Euro und 0,99 €", "ein euro und neunundneunzig cent"),
    ("de", "percent", "1 % und 1,5 %", "ein prozent und eins komma fünf prozent"),
    ("fr", "year", "En 1998", "en mille neuf cent quatre vingt dix huit"),
    ("fr", "ordinal", "le 1er et la 1re, le 2e", "le premier et la première, le deuxième"),
    ("fr", "ordinal", "le 2nd et la 2nde", "le second et la seconde"),
    ("fr", "date", "Le 1 mai 2025", "le premier mai deux mille vingt cinq"),
    (
        "fr",
        "decimal",
        "pi vaut 3,14 ou 3,05",
        "pi vaut trois virgule quatorze ou trois virgule zéro cinq",
    ),
    ("fr", "money", "12,50 € ou 0,5 €", "douze euros cinquante ou cinquante centimes"),
    ("es", "year", "En 1998", "en mil novecientos noventa y ocho"),
    (
        "es",
        "ordinal",
        "el 1.º y la 1.ª, el 1.er piso, el 3er día",
        "el primero y la primera, el primer piso, el tercer día",
    ),
    ("es", "decimal", "pi es 3,14", "pi es tres coma catorce"),
    ("es", "money", "12,50 €, 21 € o 1 €", "doce euros con cincuenta, veintiún euros o un euro"),
    ("it", "year", "Nel 1998", "nel millenovecentonovantotto"),
    (
        "it",
        "ordinal",
        "il 1° maggio, la 1ª volta, il 2º giorno",
        "il primo maggio, la prima volta, il secondo giorno",
    ),
    ("it", "decimal", "pi è 3,14", "pi è tre virgola quattordici"),
    ("it", "money", "12,50 € o 1 €", "dodici euro e cinquanta o un euro"),
    ("pt", "year", "Em 1998", "em mil novecentos e noventa e oito"),
    (
        "pt",
        "ordinal",
        "o 1.º e a 2.ª vez, 1º de maio",
        "o primeiro e a segunda vez, primeiro de maio",
    ),
    ("pt", "decimal", "pi é 3,14", "pi é três vírgula catorze"),
    ("pt", "money", "12,50 € ou 1 €", "doze euros e cinquenta ou um euro"),
    (
        "ru",
        "year",
        "в 1998 году, в 1998 г., 1998 год",
        "в тысяча девятьсот девяносто восьмом году, в тысяча девятьсот девяносто восьмом году, "
        "тысяча девятьсот девяносто восьмой год",
    ),
    ("ru", "year", "5 мая 1998 г.", "пятого мая тысяча девятьсот девяносто восьмого года"),
    ("ru", "date", "23.11.2026", "двадцать третьего ноября две тысячи двадцать шестого года"),
    (
        "ru",
        "ordinal",
        "3-й, 3-я, 3-го, в 90-х, у 3-х",
        "третий, третья, третьего, в девяностых, у трёх",
    ),
    ("ru", "decimal", "12,50 и 1,5", "двенадцать целых пятьдесят сотых и одна целая пять десятых"),
    (
        "ru",
        "money",
        "500 ₽, 12,50 руб., 21 ₽, 0,01 ₽",
        "пятьсот рублей, двенадцать рублей пятьдесят копеек, двадцать один рубль, одна копейка",
    ),
    (
        "ru",
        "percent",
        "1 %, 2 %, 1,5 %",
        "один процент, два процента, одна целая пять десятых процента",
    ),
    ("fa", "year", "سال ۱۳۹۸", "سال هزار و سیصد و نود و هشت"),
    (
        "fa",
        "date",
        "۱۴۰۲/۰۵/۱۲ و ۱۲/۰۵/۲۰۲۳",
        "دوازدهم مرداد هزار و چهارصد و دو و دوازدهم مه دو هزار و بیست و سه",
    ),
    ("fa", "ordinal", "۲ام و ۳۰ام", "دوم و سی\u200cام"),
    ("fa", "decimal", "۱۲٫۵ و ۳٫۱۴ و ۰٫۰۵", "دوازده و نیم و سه و چهارده صدم و پنج صدم"),
    ("fa", "decimal", "١٢٫٥", "دوازده و نیم"),  # Arabic-Indic digits and separator
    ("fa", "money", "€۱۲٫۵۰ و ۵ $", "دوازده یورو و پنجاه سنت و پنج دلار"),
    ("ar", "year", "عام ١٩٩٨", "عام ألف و تسعمائة و ثمانية و تسعون"),
    ("ar", "decimal", "١٢٫٥ و ٠٫٠٥", "اثنا عشر فاصلة خمسة و صفر فاصلة صفر خمسة"),
    ("ar", "money", "١٢ $ و 5 €", "اثنا عشر دولار و خمسة يورو"),
    # Checked languages without rules of their own: their decimal comma.
    ("nl", "decimal", "3,5 en 1.500", "drie komma vijf en duizendvijfhonderd"),
    ("pl", "decimal", "3,5", "trzy przecinek pięć"),
]


@pytest.mark.parametrize(("language", "kind", "raw", "expected"), CASES)
def test_numbers_as_speakers_say_them(language: str, kind: str, raw: str, expected: str) -> None:
    assert clean_text(raw, language) == expected, kind


def test_every_language_with_rules_has_its_cases() -> None:
    kinds = {(language, kind) for language, kind, _, _ in CASES}
    for language in LANGUAGES:
        wanted = {"year", "decimal", "money"} | ({"ordinal"} if language != "ar" else set())
        assert {(language, k) for k in wanted} <= kinds, language


@pytest.mark.parametrize(
    ("language", "raw", "expected"),
    [
        ("de", "Es kostet 5 €.", "es kostet fünf euro."),  # was "null euro und fünf cent"
        ("de", "1.000.000 €", "eine million euro"),  # was "zehntausend euro und null cent"
        ("ru", "Билет стоит 500 ₽.", "билет стоит пятьсот рублей."),  # was "пять рублей, ..."
        ("fr", "5 €", "cinq euros"),
        ("nl", "5 €", "vijf euro, nul cent"),  # num2words' formal reading, never 0.05
    ],
)
def test_a_whole_amount_is_never_read_as_cents(language: str, raw: str, expected: str) -> None:
    """num2words reads an int as cents (to_currency(5) is 0.05): amounts go as Decimals."""
    assert clean_text(raw, language) == expected


@pytest.mark.parametrize(
    ("language", "raw", "expected"),
    [
        ("de", "seit 1500 Jahren", "seit eintausendfünfhundert jahren"),  # a noun follows
        ("de", "1998 Menschen kamen.", "eintausendneunhundertachtundneunzig menschen kamen."),
        ("de", "Kapitel 3. Dann", "kapitel drei. dann"),  # no article: not an ordinal
        ("de", "Abschnitt 2.3.", "abschnitt zwei. drei."),  # no article: not a date
        ("ru", "в 1998", "в тысяча девятьсот девяносто восемь"),  # no "году": a count
        ("ru", "12345 году", "двенадцать тысяч триста сорок пять году"),  # not a year
    ],
)
def test_counts_stay_counts(language: str, raw: str, expected: str) -> None:
    """The year and ordinal rules are conservative: without the context that makes a
    number a year or an ordinal, it is read as a cardinal."""
    assert clean_text(raw, language) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            "In 1998 we paid $1.5 million.",
            "in nineteen ninety eight we paid one point five million dollars.",
        ),
        ("the 1990s and the '90s", "the nineteen nineties and the nineties"),
        ("5 € or 20 $", "five euros or twenty dollars"),
        ("3.5% and the 21st", "three point five percent and the twenty first"),
    ],
)
def test_english_decades_scaled_amounts_and_symbols_after(raw: str, expected: str) -> None:
    assert clean_text(raw, "en") == expected


# Punctuation, spaces, zero-width joiners, symbols, format characters (dropped), a
# currency sign or a percent sign without an amount.
NOTHING_TO_SPEAK = [
    "...",
    "!?",
    "   ",
    "\u200c",
    "\u200c\u200d \u200c",
    "♪ ♪",
    "%",
    "🚆",
    "\u200f\u00ad",
]
CASES_TO_SKIP = [
    (language, raw) for language in ("en", "de", "ru", "fa") for raw in NOTHING_TO_SPEAK
] + [("de", "€"), ("ru", "₽ %"), ("fa", "€ ٪")]


@pytest.mark.parametrize(("language", "raw"), CASES_TO_SKIP)
def test_a_text_with_nothing_to_speak_is_skipped_with_its_reason(language: str, raw: str) -> None:
    encoder = TextEncoder(replace(Config(), features={"cache": False}))
    with pytest.raises(SkipSample, match="nothing to speak") as info:
        encoder.encode(raw, "clip.wav", language)
    assert info.value.stage == "text" and info.value.path == "clip.wav"
    assert text_tokens(encoder, raw, language) == 0  # the length table agrees


def test_nothing_to_speak_is_never_phonemized(tmp_path: Path) -> None:
    cfg = replace(
        Config(), text={"tokens": "phonemes"}, features={"cache": False, "cache_dir": str(tmp_path)}
    )
    encoder = TextEncoder(cfg)
    with pytest.raises(SkipSample, match=r"cleans to '\.\.\.!'"):
        encoder.encode("... !", "", "de")
    assert encoder.phonemized == 0


def test_a_text_with_one_letter_or_digit_is_kept() -> None:
    for raw, language in (("a", "en"), ("... 7 ...", "de"), ("می\u200cخواهم", "fa")):
        alphabet = "".join(sorted(set(clean_text(raw, language))))
        encoder = TextEncoder(
            replace(Config(), text={"alphabet": alphabet}, features={"cache": False})
        )
        ids, _ = encoder.encode(raw, "", language)
        assert encoder.decode(ids) == clean_text(raw, language)
