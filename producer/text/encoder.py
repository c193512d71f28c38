"""Text to token ids: normalization per language, phonemes, the character tokenizer.

Called in producer processes, once per sample (:class:`TextEncoder`). English
(language en, en-*) keeps the rule set below; every other language goes through
producer/text/normalize.py (its own words and script, never transliterated). With
text.tokens: phonemes the normalized text is phonemized (producer/text/phonemes.py).
The result (normalized or phonemized text) is kept in an LRU per process and in
the persistent text cache (shared/language/text_cache.py), so a text seen before costs
neither normalization nor phonemization.

The English cleaner follows Tacotron's ``english_cleaners`` (keithito/tacotron
text/cleaners.py): unicode to ASCII, lowercase, numbers and currency spelled
out, abbreviations expanded, whitespace collapsed. Number words come from
``num2words`` with hyphens and commas removed ("1,234" -> "one thousand two
hundred and thirty four"), because the alphabet's "-" and "," are prosody
marks for the model, not parts of words.

Token ids: 0 = pad, 1 = unknown, 2 = end of text, then ``text.alphabet`` from
3 on; this is what ``Config.vocab_size`` counts. For other scripts or phonemes,
`ringfeed vocab CONFIG` builds text.alphabet from the corpus (scripts/vocab.py):
the alphabet lives in the config, so it is the same in every producer (the
config fingerprint), in the run directory and in every checkpoint.
"""

from __future__ import annotations

import functools
import re
import unicodedata

import numpy as np
from unidecode import unidecode

from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text.normalize import (
    NORMALIZER_VERSION,
    PHONE_RE,
    TIME_RE,
    drop_controls,
    normalize,
)
from ringfeed.shared.config import Config
from ringfeed.shared.language.codes import primary
from ringfeed.shared.language.text_cache import TextCache

PAD_ID, UNKNOWN_ID, EOS_ID = 0, 1, 2
FIRST_CHAR_ID = 3
# Cleaned texts, and their tokens, one producer keeps (LRU each): more than LJSpeech's
# 13,100 lines, so from the second epoch on encoding is a dict lookup; a few tens of MB
# per producer when full.
TEXT_CACHE_SIZE = 100_000

# Typographic characters unidecode would map to something the alphabet lacks
# (unidecode turns "£" into "PS", an em dash into "--").
_UNICODE_PUNCT = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u2032": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u00ab": '"',
        "\u00bb": '"',
        "\u2013": " - ",
        "\u2014": " - ",
        "\u2015": " - ",
        "\u2212": "-",
        "\u2026": "...",
        "\u00a0": " ",
    }
)

_ABBREVIATIONS = [
    (re.compile(rf"\b{abbr}\.", re.IGNORECASE), word)
    for abbr, word in [
        ("mrs", "misess"),
        ("mr", "mister"),
        ("dr", "doctor"),
        ("st", "saint"),
        ("co", "company"),
        ("jr", "junior"),
        ("maj", "major"),
        ("gen", "general"),
        ("drs", "doctors"),
        ("rev", "reverend"),
        ("lt", "lieutenant"),
        ("hon", "honorable"),
        ("sgt", "sergeant"),
        ("capt", "captain"),
        ("esq", "esquire"),
        ("ltd", "limited"),
        ("col", "colonel"),
        ("ft", "fort"),
        ("etc", "et cetera"),
        ("vs", "versus"),
    ]
]

# An amount after its symbol ("$3.50", "$1.5 million": one point five million dollars)
# or before it ("5 €").
_CURRENCY_RE = re.compile(
    r"([$£€])\s?(\d[\d,]*(?:\.\d+)?)(?:\s(thousand|million|billion|trillion)\b)?"
    r"|(?<![\d.,])(\d[\d,]*(?:\.\d+)?)\s?([$£€])"
)
_CURRENCY_WORDS = {"$": ("dollar", "cent"), "£": ("pound", "penny"), "€": ("euro", "cent")}
_COMMA_NUMBER_RE = re.compile(r"\b\d{1,3}(?:,\d{3})+\b")
_DECIMAL_RE = re.compile(r"\b\d+\.\d+\b")
_PERCENT_RE = re.compile(r"(\d)\s?%")
_ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
# A decade ("the 1990s", "the '90s"): nineteen nineties, nineties.
_DECADE_RE = re.compile(r"(?<![\d.,])'?(\d+0)s\b")
_NUMBER_RE = re.compile(r"\d+")
_WHITESPACE_RE = re.compile(r"\s+")


# Longer digit runs are read digit by digit: num2words overflows past ~10**27 and
# int() refuses over 4300 digits, and nobody reads a 16-digit number as one anyway.
MAX_NUMBER_DIGITS = 15
# Raw text longer than this many times text.max_text_len is not cleaned whole: cleaning
# cost grows with the text, and no clean text of that length fits a slot.
MAX_RAW_FACTOR = 8


def _words(n: int, to: str = "cardinal") -> str:
    from num2words import num2words  # here: ~35 ms, and a warm start's texts are cached

    try:
        words = num2words(n, to=to)
    except Exception:  # noqa: BLE001 - a number num2words fails on keeps its digits
        words = str(n)
    return words.replace("-", " ").replace(",", "")


def _number_words(digits: str, to: str = "cardinal") -> str:
    """A run of digits in words, in bounded time whatever its length."""
    if len(digits) > MAX_NUMBER_DIGITS:
        return " ".join(_words(int(d)) for d in digits)
    return _words(int(digits), to)


def _plural(n: int, unit: str) -> str:
    if n == 1:
        return unit
    return "pence" if unit == "penny" else unit + "s"


def _expand_currency(m: re.Match[str]) -> str:
    symbol, amount, scale = (m[1], m[2], m[3]) if m[1] else (m[5], m[4], None)
    unit, sub_unit = _CURRENCY_WORDS[symbol]
    whole, _, frac = amount.replace(",", "").partition(".")
    if scale:  # "$1.5 million": the amount is a number of millions, said before the unit
        point = f" point {' '.join(_words(int(d)) for d in frac)}" if frac else ""
        return f"{_number_words(whole)}{point} {scale} {_plural(2, unit)}"
    if len(whole) > MAX_NUMBER_DIGITS:
        return f"{_number_words(whole)} {_plural(2, unit)}"
    major = int(whole)
    # "$3.5" is three dollars fifty cents: pad the fraction to two digits.
    minor = int(frac[:2].ljust(2, "0")) if frac else 0
    parts = []
    if major or not minor:
        parts.append(f"{_words(major)} {_plural(major, unit)}")
    if minor:
        parts.append(f"{_words(minor)} {_plural(minor, sub_unit)}")
    return ", ".join(parts)


def _expand_decimal(m: re.Match[str]) -> str:
    whole, frac = m.group(0).split(".")
    digits = " ".join(_words(int(d)) for d in frac)
    return f"{_number_words(whole)} point {digits}"


def _expand_number(m: re.Match[str]) -> str:
    return _integer_words(m.group(0))


def _expand_decade(m: re.Match[str]) -> str:
    """A decade (1990s: "nineteen nineties", 90s: "nineties"), its last word plural."""
    *first, last = _integer_words(m[1]).split()
    return " ".join([*first, last[:-1] + "ies" if last.endswith("y") else last + "s"])


def _integer_words(text: str) -> str:
    """A run of digits in words, 1010-2999 in a year's form (not 2000-2009: "two
    thousand five")."""
    if len(text) > MAX_NUMBER_DIGITS or (len(text) > 1 and text.startswith("0")):
        return " ".join(_words(int(d)) for d in text)  # "007": read digit by digit
    n = int(text)
    if 1000 < n < 3000 and n % 1000 >= 10:
        # A four-digit number in this range is most likely a year (Tacotron does the same).
        return _words(n, "year").replace(" and ", " ")
    return _words(n)


def _expand_phone(m: re.Match[str]) -> str:
    return ", ".join(" ".join(_words(int(d)) for d in group) for group in m[0].split("-"))


def _expand_time(m: re.Match[str]) -> str:
    hour, minutes = _words(int(m[1])), int(m[2])
    if not minutes:
        return f"{hour} o'clock"
    return f"{hour} {'oh ' if minutes < 10 else ''}{_words(minutes)}"


def expand_numbers(text: str) -> str:
    """Spell out phone-like numbers (digit by digit), clock times, currency, comma
    numbers, decimals, percentages, ordinals and integers."""
    text = PHONE_RE.sub(_expand_phone, text)
    text = TIME_RE.sub(_expand_time, text)
    text = _CURRENCY_RE.sub(_expand_currency, text)
    text = _PERCENT_RE.sub(r"\1 percent", text)  # before decimals: "3.5%" is 3.5 percent
    text = _COMMA_NUMBER_RE.sub(lambda m: _number_words(m.group(0).replace(",", "")), text)
    text = _DECIMAL_RE.sub(_expand_decimal, text)
    text = _ORDINAL_RE.sub(lambda m: _number_words(m.group(1), "ordinal"), text)
    text = _DECADE_RE.sub(_expand_decade, text)
    return _NUMBER_RE.sub(_expand_number, text)


def clean_text(text: str, language: str = "en") -> str:
    """Raw transcription in `language` -> normalized text (English, by the code's primary
    subtag: en, en-gb, eng: english_cleaners)."""
    if primary(language) == "en":
        return english_cleaners(text)
    return normalize(text, language)


def english_cleaners(text: str) -> str:
    """English cleaners: raw transcription -> lowercase ASCII with words spelled out."""
    # NFKC first so fullwidth digits and superscripts become the digits the regexes see.
    text = unicodedata.normalize("NFKC", drop_controls(text)).translate(_UNICODE_PUNCT)
    text = expand_numbers(text.replace("&", " and "))
    text = unidecode(text).lower()
    for pattern, word in _ABBREVIATIONS:
        text = pattern.sub(word, text)
    return _WHITESPACE_RE.sub(" ", text).strip()


def has_speech(cleaned: str) -> bool:
    """Has a cleaned text anything to speak: a letter or a digit (Unicode L* or N*)? A
    text of punctuation, spaces, symbols (♪, an emoji, a currency sign without an
    amount) or zero-width joiners alone has none: no clip says it, and its tokens would
    teach the model to read silence or noise into marks."""
    return any(c.isalnum() for c in cleaned)


def _nothing_to_speak(cleaned: str) -> str:
    """The skip reason for a cleaned text without speech."""
    if not cleaned:
        return "empty text after cleaning: nothing to speak"
    shown = cleaned if len(cleaned) <= 40 else cleaned[:40] + "..."
    return (
        f"nothing to speak: the text cleans to {shown!r}, without a letter or digit "
        "(only punctuation, spaces, symbols or zero-width joiners)"
    )


class TextEncoder:
    """Text -> int32 token ids, with an LRU cache of cleaned texts.

    One per producer process (inside SamplePipeline). The cache (size
    TEXT_CACHE_SIZE) makes a text seen in an earlier epoch cost a dict
    lookup instead of the regex passes and num2words calls.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        alphabet = cfg.text.alphabet
        # Lookup table indexed by code point; codes beyond it are unknown.
        self._lut = np.full(max(map(ord, alphabet)) + 1, UNKNOWN_ID, dtype=np.int32)
        self._lut[[ord(c) for c in alphabet]] = np.arange(
            FIRST_CHAR_ID, FIRST_CHAR_ID + len(alphabet), dtype=np.int32
        )
        self._alphabet = alphabet
        self._phonemizer = None
        self.kind = f"{cfg.text.tokens}:{NORMALIZER_VERSION}"
        self.store = TextCache(cfg.features.cache_dir) if cfg.features.cache else None
        # Texts really normalized and phonemized in this process (cache misses).
        self.normalized = self.phonemized = 0
        self.clean = functools.lru_cache(maxsize=TEXT_CACHE_SIZE)(self._clean)
        self._encoded = functools.lru_cache(maxsize=TEXT_CACHE_SIZE)(self._encode)

    def _clean(self, text: str, language: str = "en") -> str:
        """Raw text -> what is tokenized: the normalized text, or its phonemes."""
        if self.store is not None:
            hit = self.store.get(self.kind, language, text)
            if hit is not None:
                return hit
        out = clean_text(text, language)
        self.normalized += 1
        if self.cfg.text.tokens == "phonemes" and has_speech(out):
            if self._phonemizer is None:
                from ringfeed.producer.text.phonemes import Phonemizer

                self._phonemizer = Phonemizer()
            out = self._phonemizer(out, language)
            self.phonemized += 1
        if self.store is not None:
            self.store.put(self.kind, language, text, out)
        return out

    def decode(self, ids: np.ndarray) -> str:
        """Token ids -> the text they stand for (pad, unknown and end of text dropped)."""
        return "".join(self._alphabet[i - FIRST_CHAR_ID] for i in ids if i >= FIRST_CHAR_ID)

    def flush(self) -> None:
        """The texts this process cleaned, written to the persistent text cache now (a
        pass of preparation, whose processes end without closing)."""
        if self.store is not None:
            self.store.flush()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def tokenize(self, cleaned: str) -> np.ndarray:
        """Cleaned text -> int32 [len(cleaned) (+1 with text.add_eos)], no padding."""
        codes = np.frombuffer(cleaned.encode("utf-32-le"), dtype=np.uint32)
        known = codes < len(self._lut)
        ids = np.where(known, self._lut[np.where(known, codes, 0)], UNKNOWN_ID).astype(np.int32)
        if self.cfg.text.add_eos:
            ids = np.append(ids, np.int32(EOS_ID))
        return ids

    def encode(self, text: str, path: str = "", language: str = "en") -> tuple[np.ndarray, bool]:
        """Raw text -> (int32 [n_tokens] with n_tokens <= text.max_text_len, read-only,
        truncated).

        Raises SkipSample for a text with nothing to speak (:func:`has_speech`), too
        many unknown characters, or (with features.on_too_long: skip) text longer than
        text.max_text_len. A text encoded before is one lookup: tokenizing and checking
        a cleaned text cost 0.07 ms a sample, a quarter of a cached sample's work in
        its producer (benchmarks/peers.py); a refused text is judged again each time.
        """
        try:
            return self._encoded(text, language)
        except SkipSample as skip:
            skip.path = skip.path or path
            raise

    def _encode(self, text: str, language: str) -> tuple[np.ndarray, bool]:
        """encode() of a text, whatever clip it comes with (encode names the clip)."""
        limit = MAX_RAW_FACTOR * self.cfg.text.max_text_len
        if len(text) > limit:
            if self.cfg.features.on_too_long == "skip":
                raise SkipSample(
                    f"text has {len(text)} characters before cleaning > {MAX_RAW_FACTOR} x "
                    f"text.max_text_len={self.cfg.text.max_text_len}: far too long to fit"
                )
            text = text[:limit]  # truncate mode cuts it after cleaning anyway
        try:
            cleaned = self.clean(text, language)
        except Exception as exc:  # noqa: BLE001 - costs this text only (docs/design.md#contract-9)
            raise SkipSample(
                f"text in {language!r} cannot be cleaned ({type(exc).__name__}: {exc})",
                stage="text",
            ) from None
        if not has_speech(cleaned):
            raise SkipSample(_nothing_to_speak(cleaned), stage="text")
        ids = self.tokenize(cleaned)
        n_chars = len(cleaned)
        unknown = ids[:n_chars] == UNKNOWN_ID
        frac = float(unknown.mean())
        if frac > self.cfg.text.max_unknown_frac:
            chars = "".join(sorted({c for c, u in zip(cleaned, unknown, strict=True) if u}))
            raise SkipSample(
                f"unknown-character fraction {frac:.2f} > text.max_unknown_frac="
                f"{self.cfg.text.max_unknown_frac} (characters {chars!r} are not in "
                "text.alphabet: `ringfeed vocab CONFIG` builds it from the corpus)"
            )
        ids, truncated = self._fit(ids)
        ids.setflags(write=False)  # shared by every sample of this text
        return ids, truncated

    def _fit(self, ids: np.ndarray) -> tuple[np.ndarray, bool]:
        limit = self.cfg.text.max_text_len
        if len(ids) <= limit:
            return ids, False
        if self.cfg.features.on_too_long == "skip":
            raise SkipSample(
                f"text has {len(ids)} tokens > text.max_text_len={limit}: raise "
                "max_text_len or set features.on_too_long: truncate"
            )
        if self.cfg.text.add_eos:
            # Keep the end-of-text token so the model still sees where the text stops.
            return np.append(ids[: limit - 1], np.int32(EOS_ID)), True
        return ids[:limit], True
