"""Text normalization for any language: each language's own words, in its own script.

Called in producer processes through producer/text.py (``clean_text(text,
language)``), once per text (then cached). English keeps its Tacotron rule set
(producer/text.py ``english_cleaners``); every other language goes through
:func:`normalize`:

1. Control and format characters dropped (:func:`drop_controls`), then Unicode
   NFKC (presentation forms and fullwidth characters become the letters
   and digits they are; the zero-width non-joiner, which Persian spelling
   needs, is kept: NFKC leaves it alone), then script fixes: for Persian,
   Arabic yeh and kaf become Persian yeh and keheh; Persian and Arabic-Indic
   digits (and Devanagari's) become 0-9 for the number rules.
2. Numbers in the language's words with num2words (LANGUAGES: its code, decimal
   and group separators, currency, percent and ordinal forms): currency,
   percent, ordinals, decimals, integers. A run of more than MAX_NUMBER_DIGITS
   digits is read digit by digit, so the cost is linear in the text whatever
   its numbers. A language off the checked allowlist (NUM2WORDS_CHECKED), or a
   number num2words fails on, keeps its digits (they are then characters of the
   vocabulary, never dropped).
3. Typographic quotes and dashes to plain ones, lower case where the script has
   case, whitespace collapsed. Never transliteration: Persian stays in Persian
   letters, Russian in Cyrillic.

Every regex here is linear (no nested quantifiers; a number starts only where
its digit run starts, so a pattern that fails at the end of a long run is not
retried from each of its digits); the caller bounds the raw length
(producer/text.py MAX_RAW_FACTOR x text.max_text_len, 1,600 characters by
default). Measured here: ~0.1 ms a sentence, at most ~0.06 s for 1,600
characters of nothing but numbers, dates and currency, in any language.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field

from num2words import num2words

from ringfeed.shared.language.codes import language_code

# Longer digit runs are read digit by digit (num2words overflows past ~10**27).
MAX_NUMBER_DIGITS = 15
# Bumped when a rule changes: the persistent caches key on it (and bump the length
# manifest's version in shared/corpus/lengths.py settings_key when token counts change).
NORMALIZER_VERSION = 3

_DIGITS = {}
for _base in (0x0660, 0x06F0, 0x0966):  # Arabic-Indic, Persian, Devanagari
    _DIGITS.update({_base + d: str(d) for d in range(10)})
_COMMON = str.maketrans(
    {
        **_DIGITS,
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
        "\u2013": " - ", "\u2014": " - ", "\u2212": "-", "\u2026": "...",
        "\u00a0": " ", "\u202f": " ", "\u066a": "%", "\u066b": ".", "\u066c": ",",
    }
)  # fmt: skip
# Persian: Arabic yeh, alef maksura and kaf to the Persian letters; tatweel dropped.
_PERSIAN = str.maketrans({"\u064a": "\u06cc", "\u0649": "\u06cc", "\u0643": "\u06a9",
                          "\u0640": None})  # fmt: skip
_CURRENCY_CODES = {"€": "EUR", "$": "USD", "£": "GBP", "₽": "RUB", "﷼": "IRR"}
_WHITESPACE_RE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([.,!?;:\u060c\u061b\u061f])")
# Day.month.year or day/month/year: the day and month as ordinals, the year as a year.
_DATE_RE = re.compile(r"\b(\d{1,2})[./](\d{1,2})[./](\d{4})\b")
# A clock time (10:30, 9:05): the hour and the minutes, not "ten:thirty".
TIME_RE = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])")
# A phone-like number (555-0199, 020-7946-0958): digit by digit, group by group, not
# "five hundred and fifty five-zero one nine nine". A year range (1999-2001) is not one.
PHONE_RE = re.compile(r"(?<![\d-])\d{3}(?:-\d{3,4}){1,2}(?![\d-])")
# º and ª (Spanish, Italian, Portuguese ordinals) become o and a under NFKC: mark them
# first with a private-use character that NFKC keeps.
_ORDINAL_MARK = "\ue000"
_MARK_ORDINALS = str.maketrans({"º": _ORDINAL_MARK, "ª": _ORDINAL_MARK})
# Format characters that spelling needs: the zero-width non-joiner and joiner.
_KEPT_FORMAT = frozenset("\u200c\u200d")


def drop_controls(text: str) -> str:
    """text without control (Cc) and format (Cf) characters, the zero-width non-joiner
    and joiner kept; a control that is whitespace (tab, newline) becomes a space. First
    step of both cleaners: espeak-ng stops at a NUL (the rest of the text lost its
    phonemes), and bidi marks and other invisible characters would become tokens."""
    if text.isprintable():  # no Cc, Cf (nor any other non-printable): most texts
        return text
    return "".join(
        " " if c.isspace() else c
        for c in text
        if c in _KEPT_FORMAT or c.isspace() or unicodedata.category(c) not in ("Cc", "Cf")
    )


@dataclass(frozen=True)
class Rules:
    """One language's number rules: num2words code ("" = keep digits), decimal and group
    separators, the word after a percentage, currency words when num2words has none
    (symbol -> word), and the ordinal suffix pattern after the digits."""

    code: str
    decimal: str = "."
    group: str = ","
    percent: str = "percent"
    currency_words: dict[str, str] = field(default_factory=dict)
    ordinal: str = ""
    fixes: dict[int, str | None] | None = None
    # Dates: the month names, how the day is read, and the order of the words.
    months: tuple[str, ...] = ()
    day: str = "cardinal"
    date: str = "{d} {m} {y}"


_MONTHS = {
    "de": "januar februar märz april mai juni juli august september oktober november dezember",
    "fr": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre",
    "es": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre "
    "diciembre",
    "it": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre "
    "dicembre",
    "pt": "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro "
    "dezembro",
    "ru": "января февраля марта апреля мая июня июля августа сентября октября ноября декабря",
}
_M = {code: tuple(names.split()) for code, names in _MONTHS.items()}

LANGUAGES: dict[str, Rules] = {
    "de": Rules("de", ",", ".", "prozent", months=_M["de"], day="ordinal"),
    "fr": Rules("fr", ",", ".", "pour cent", ordinal=r"(?:er|re|e|ème)\b", months=_M["fr"]),
    "es": Rules("es", ",", ".", "por ciento", ordinal=_ORDINAL_MARK, months=_M["es"],
                date="{d} de {m} de {y}"),
    "it": Rules("it", ",", ".", "percento", ordinal=_ORDINAL_MARK, months=_M["it"]),
    "pt": Rules("pt", ",", ".", "por cento", ordinal=_ORDINAL_MARK, months=_M["pt"],
                date="{d} de {m} de {y}"),
    "ru": Rules("ru", ",", ".", "процентов", ordinal=r"-(?:й|я|е|го|му|м)\b", months=_M["ru"],
                day="ordinal"),
    "fa": Rules("fa", ".", ",", "درصد", {"€": "یورو", "$": "دلار", "£": "پوند", "﷼": "ریال"},
                ordinal=r"\u200c?(?:ام|م)(?!\w)", fixes=_PERSIAN),
    "ar": Rules("ar", ".", ",", "بالمئة", {"€": "يورو", "$": "دولار", "£": "جنيه"}),
}  # fmt: skip


# Languages whose num2words converter was checked here beyond LANGUAGES: 217 integers
# up to 10**15 as cardinal, ordinal and year, five decimals and EUR currency: every
# cardinal read in words, no call past 50 ms. Any other language keeps its digits:
# num2words 0.5.14 never returns for am (8164232) and overflows for te and kn; its
# errors elsewhere are of any type (AttributeError for a vi year, IndexError for a ro
# currency, RecursionError for es ordinals), so every call is guarded too.
NUM2WORDS_CHECKED = frozenset(
    "az be bn ca ce cs cy da eo fi he hu id is ja ko kz lt lv nl no pl ro sk sl sr sv tet "
    "tg th tr uk vi".split()
)


def rules_for(language: str) -> Rules:
    """The rules of a language code ("pt-br" -> pt's, "por" -> pt's); a language off the
    allowlist (LANGUAGES and NUM2WORDS_CHECKED) gets its digits kept."""
    base = language_code(language).split("-")[0]
    if base in LANGUAGES:
        return LANGUAGES[base]
    return Rules(base) if base in NUM2WORDS_CHECKED else Rules("")


def has_number_rules(language: str) -> bool:
    """Are numbers read out in this language (English by its cleaners, the others by
    rules_for), or kept as digits?"""
    base = language_code(language).split("-")[0]
    return base == "en" or bool(rules_for(language).code)


def _num2words(n: int | float, rules: Rules, **kwargs: str) -> str | None:
    """num2words' words for n, or None when it fails: its converters raise any type
    (NUM2WORDS_CHECKED), and a failed number keeps its digits, never costs the text."""
    try:
        return num2words(n, lang=rules.code, **kwargs)
    except Exception:  # noqa: BLE001 - see above: the digits are kept instead
        return None


def _words(n: int | float, rules: Rules, to: str = "cardinal") -> str:
    """n in words; num2words' hyphens ("trente-quatre") become spaces; n's digits when
    num2words has no words for it."""
    words = _num2words(n, rules, to=to)
    if words is None and to != "cardinal":
        words = _num2words(n, rules)
    return (words if words is not None else str(n)).replace("-", " ")


def _digits(text: str, rules: Rules) -> str:
    return " ".join(_digit_words(rules.code)[int(d)] for d in text)


@functools.cache
def _digit_words(code: str) -> tuple[str, ...]:
    """The words of 0..9 in a language: a long digit run costs lookups, not num2words."""
    return tuple(_words(d, Rules(code)) for d in range(10))


def _number(text: str, rules: Rules, to: str = "cardinal") -> str:
    """A number as written in the language (group and decimal separators) in words."""
    whole, _, frac = text.replace(rules.group, "").partition(rules.decimal)
    if len(whole) > MAX_NUMBER_DIGITS or len(frac) > MAX_NUMBER_DIGITS:
        return _digits(whole + frac, rules)
    if frac:
        return _words(float(f"{whole}.{frac}"), rules)
    return _words(int(whole), rules, to)


def _number_pattern(rules: Rules) -> str:
    """A number with the language's separators. It starts only where a digit run starts
    (the lookbehind): a pattern that must be followed by % or a currency symbol would
    otherwise be tried from every digit of a long run, quadratic in its length."""
    g, d = re.escape(rules.group), re.escape(rules.decimal)
    return rf"(?<!\d)(?:\d{{1,3}}(?:{g}\d{{3}})+(?:{d}\d+)?|\d+(?:{d}\d+)?)"


def _currency(amount: str, symbol: str, rules: Rules) -> str:
    if symbol in rules.currency_words or symbol not in _CURRENCY_CODES:
        return f"{_number(amount, rules)} {rules.currency_words.get(symbol, symbol)}"
    whole, _, frac = amount.replace(rules.group, "").partition(rules.decimal)
    if len(whole) > MAX_NUMBER_DIGITS:
        return f"{_digits(whole, rules)} {_CURRENCY_CODES[symbol]}"
    value = float(f"{whole}.{frac[:2]}") if frac else int(whole)
    words = _num2words(value, rules, to="currency", currency=_CURRENCY_CODES[symbol])
    if words is None:
        return f"{_number(amount, rules)} {symbol}"
    return words.replace("-", " ")


class Normalizer:
    """One language's normalizer, its patterns compiled once (see :func:`normalizer`)."""

    def __init__(self, language: str) -> None:
        self.rules = r = rules_for(language)
        num = _number_pattern(r)
        symbols = re.escape("".join(_CURRENCY_CODES) + "".join(r.currency_words))
        self.currency = re.compile(rf"([{symbols}])\s?({num})|({num})\s?([{symbols}])")
        self.percent = re.compile(rf"({num})\s?%")
        self.ordinal = re.compile(rf"(\d+){r.ordinal}") if r.ordinal else None
        self.number = re.compile(num)

    def numbers(self, text: str) -> str:
        r = self.rules
        if not r.code:
            return text

        def money(m: re.Match[str]) -> str:
            symbol, amount = (m[1], m[2]) if m[1] else (m[4], m[3])
            return f" {_currency(amount, symbol, r)} "

        def date(m: re.Match[str]) -> str:
            d, month = int(m[1]), int(m[2])
            if not (1 <= d <= 31 and 1 <= month <= 12):
                return m[0]  # not a date: the number rules read it
            name = r.months[month - 1] if r.months else _words(month, r, "ordinal")
            words = r.date.format(d=_words(d, r, r.day), m=name, y=_words(int(m[3]), r, "year"))
            return f" {words} "

        def phone(m: re.Match[str]) -> str:
            return " " + ", ".join(_digits(group, r) for group in m[0].split("-")) + " "

        def time(m: re.Match[str]) -> str:
            minutes = int(m[2])
            return f" {_words(int(m[1]), r)} {_words(minutes, r) if minutes else ''} "

        text = PHONE_RE.sub(phone, text)
        text = TIME_RE.sub(time, text)
        text = _DATE_RE.sub(date, text)
        text = self.currency.sub(money, text)
        text = self.percent.sub(lambda m: f" {_number(m[1], r)} {r.percent} ", text)
        if self.ordinal is not None:
            text = self.ordinal.sub(lambda m: f" {_number(m[1], r, 'ordinal')} ", text)
        return self.number.sub(lambda m: f" {_number(m[0], r)} ", text)

    def __call__(self, text: str) -> str:
        text = drop_controls(text).translate(_MARK_ORDINALS)
        text = unicodedata.normalize("NFKC", text).translate(_COMMON)
        if self.rules.fixes:
            text = text.translate(self.rules.fixes)
        text = self.numbers(text).replace(_ORDINAL_MARK, "o").lower()
        text = _SPACE_BEFORE_PUNCT_RE.sub(r"\1", _WHITESPACE_RE.sub(" ", text))
        return text.strip()


@functools.cache
def normalizer(language: str) -> Normalizer:
    """The normalizer of a language code, made once per process."""
    return Normalizer(language)


def normalize(text: str, language: str) -> str:
    """Raw text in `language` -> its normalized form (module docstring)."""
    return normalizer(language)(text)
