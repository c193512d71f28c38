"""Text normalization for any language: each language's own words, in its own script.

Called in producer processes through producer/text/encoder.py (``clean_text(text,
language)``), once per text (then cached). English keeps its Tacotron rule set
(producer/text/encoder.py ``english_cleaners``); every other language goes through
:func:`normalize`:

1. Control and format characters dropped (:func:`drop_controls`), then Unicode
   NFKC (presentation forms and fullwidth characters become the letters
   and digits they are; the zero-width non-joiner, which Persian spelling
   needs, is kept: NFKC leaves it alone), then script fixes: for Persian,
   Arabic yeh and kaf become Persian yeh and keheh; Persian and Arabic-Indic
   digits (and Devanagari's) become 0-9 for the number rules.
2. Numbers in the language's words, as its speakers say them
   (producer/text/numbers.py): phone numbers, clock times, dates, money, percentages,
   years, ordinals, decimals and counts, by the language's rules
   (producer/text/number_rules.py LANGUAGES, and grammar in producer/text/numbers.py) with
   num2words. A run of more than MAX_NUMBER_DIGITS digits (number_words.py) is
   read digit by digit, so the cost is linear in the text whatever its numbers. A
   language off the checked allowlist (LANGUAGES, NUM2WORDS_CHECKED), or a number
   num2words fails on, keeps its digits (they are then characters of the
   vocabulary, never dropped).
3. Typographic quotes and dashes to plain ones, lower case where the script has
   case, whitespace collapsed. Never transliteration: Persian stays in Persian
   letters, Russian in Cyrillic.

Every regex here and in the number modules is linear (no nested quantifiers; a
number starts only where its digit run starts, so a pattern that fails at the end
of a long run is not retried from each of its digits); the caller bounds the raw length
(producer/text/encoder.py MAX_RAW_FACTOR x text.max_text_len, 1,600 characters by
default). Measured here: 0.2-0.4 ms a sentence with a date, a price and a
percentage, at most ~0.05 s for 1,600 characters of nothing but numbers, dates,
currency and their context words, in any language.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from ringfeed.producer.text.number_rules import (
    FEMININE_MARK,
    LANGUAGES,
    MASCULINE_MARK,
    NUM2WORDS_CHECKED,
    has_number_rules,
    rules_for,
)
from ringfeed.producer.text.numbers import PHONE_RE, TIME_RE, NumberReader

# Bumped when a rule changes: the persistent caches key on it (and bump the length
# table's version in shared/corpus/lengths.py settings_key when token counts change).
# 4: years, ordinals, decimals and money as speakers say them (producer/text/numbers.py).
NORMALIZER_VERSION = 4

_DIGITS = {}
for _base in (0x0660, 0x06F0, 0x0966):  # Arabic-Indic, Persian, Devanagari
    _DIGITS.update({_base + d: str(d) for d in range(10)})
_COMMON = str.maketrans(
    {
        **_DIGITS,
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u00ab": '"',
        "\u00bb": '"',
        "\u2013": " - ",
        "\u2014": " - ",
        "\u2212": "-",
        "\u2026": "...",
        "\u00a0": " ",
        "\u202f": " ",
        "\u066a": "%",
        "\u066b": ".",
        "\u066c": ",",
    }
)
_WHITESPACE_RE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([.,!?;:\u060c\u061b\u061f])")
# º and ª (Spanish, Italian, Portuguese ordinals) become o and a under NFKC: marked
# first with private-use characters that NFKC keeps; a mark no ordinal took is a letter.
_MARK_ORDINALS = str.maketrans({"º": MASCULINE_MARK, "ª": FEMININE_MARK})
_UNMARK = str.maketrans({MASCULINE_MARK: "o", FEMININE_MARK: "a"})
# Format characters that spelling needs: the zero-width non-joiner and joiner.
_KEPT_FORMAT = frozenset("\u200c\u200d")

__all__ = [
    "LANGUAGES",
    "NUM2WORDS_CHECKED",
    "PHONE_RE",
    "TIME_RE",
    "has_number_rules",
    "rules_for",
    "normalize",
    "drop_controls",
    "Normalizer",
]


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


class Normalizer:
    """One language's normalizer, its patterns compiled once (see :func:`normalizer`)."""

    def __init__(self, language: str) -> None:
        self.rules = rules_for(language)
        self.numbers = NumberReader(self.rules)

    def __call__(self, text: str) -> str:
        text = drop_controls(text).translate(_MARK_ORDINALS)
        text = unicodedata.normalize("NFKC", text).translate(_COMMON)
        if self.rules.fixes:
            text = text.translate(self.rules.fixes)
        text = self.numbers(text).translate(_UNMARK).lower()
        text = _SPACE_BEFORE_PUNCT_RE.sub(r"\1", _WHITESPACE_RE.sub(" ", text))
        return text.strip()


@functools.cache
def normalizer(language: str) -> Normalizer:
    """The normalizer of a language code, made once per process."""
    return Normalizer(language)


def normalize(text: str, language: str) -> str:
    """Raw text in `language` -> its normalized form (module docstring)."""
    return normalizer(language)(text)
