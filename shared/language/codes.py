"""Language codes as corpora write them, and the one form the run keeps.

Called wherever a code enters: the config checks (data.language,
data.detect_languages), the corpus readers (a manifest line's language), the
cleaners (which rule set) and the id tables (which keep the normalized code).
Corpora write "en-US", "pt_BR", "eng" or "EN" for the same languages; without
one form, "en-US" lines were refused and "eng" skipped the English cleaner.

The normalized form: lower case, "_" as "-", and a primary subtag of ISO 639-3
that has an ISO 639-1 equivalent replaced by it ("eng-gb" -> "en-gb"). The
rule set of a code is chosen by its primary subtag (:func:`primary`): en-gb
gets the English rules, pt-br the Portuguese ones.
"""

from __future__ import annotations

import re

# A normalized code: ISO 639-1 or -3, optionally a region or variant (en, fa, pt-br, cmn).
LANGUAGE_RE = re.compile(r"[a-z]{2,3}(-[a-z0-9]{1,8})*")

# ISO 639-3 (and 639-2/B) codes of common languages -> ISO 639-1.
ISO_639_3 = {
    "eng": "en",
    "deu": "de",
    "ger": "de",
    "fra": "fr",
    "fre": "fr",
    "spa": "es",
    "ita": "it",
    "por": "pt",
    "rus": "ru",
    "fas": "fa",
    "per": "fa",
    "pes": "fa",
    "ara": "ar",
    "zho": "zh",
    "chi": "zh",
    "nld": "nl",
    "dut": "nl",
    "pol": "pl",
    "tur": "tr",
    "ukr": "uk",
    "jpn": "ja",
    "kor": "ko",
    "hin": "hi",
    "ben": "bn",
    "vie": "vi",
    "swe": "sv",
    "dan": "da",
    "nor": "no",
    "nob": "nb",
    "fin": "fi",
    "ces": "cs",
    "cze": "cs",
    "ell": "el",
    "gre": "el",
    "heb": "he",
    "hun": "hu",
    "ron": "ro",
    "rum": "ro",
    "ind": "id",
    "tha": "th",
    "urd": "ur",
    "tam": "ta",
    "tel": "te",
    "cat": "ca",
    "msa": "ms",
    "may": "ms",
    "slk": "sk",
    "slo": "sk",
    "slv": "sl",
    "srp": "sr",
    "hrv": "hr",
    "bul": "bg",
    "cym": "cy",
    "wel": "cy",
}


def language_code(raw: str) -> str:
    """A code as written ("en-US", "pt_BR", "eng") -> its normalized form ("en-us",
    "pt-br", "en"); the result may still fail LANGUAGE_RE ("Deutsch" -> "deutsch")."""
    code = raw.strip().lower().replace("_", "-")
    first, sep, rest = code.partition("-")
    return ISO_639_3.get(first, first) + sep + rest


def primary(code: str) -> str:
    """The primary subtag of a code, normalized: the language whose rules apply."""
    return language_code(code).partition("-")[0]


def valid_code(raw: str) -> bool:
    """Whether raw is a language code once normalized."""
    return bool(LANGUAGE_RE.fullmatch(language_code(raw)))


# Languages by their English names, as some corpus tools write them (lhotse's LibriTTS,
# LJSpeech and MLS recipes write "English", "German" ...): the common ones above.
LANGUAGE_NAMES = {
    "english": "en",
    "german": "de",
    "french": "fr",
    "spanish": "es",
    "italian": "it",
    "portuguese": "pt",
    "russian": "ru",
    "persian": "fa",
    "farsi": "fa",
    "arabic": "ar",
    "chinese": "zh",
    "mandarin": "zh",
    "dutch": "nl",
    "polish": "pl",
    "turkish": "tr",
    "ukrainian": "uk",
    "japanese": "ja",
    "korean": "ko",
    "hindi": "hi",
    "bengali": "bn",
    "vietnamese": "vi",
    "swedish": "sv",
    "danish": "da",
    "norwegian": "no",
    "finnish": "fi",
    "czech": "cs",
    "greek": "el",
    "hebrew": "he",
    "hungarian": "hu",
    "romanian": "ro",
    "indonesian": "id",
    "thai": "th",
    "urdu": "ur",
    "tamil": "ta",
    "telugu": "te",
    "catalan": "ca",
    "malay": "ms",
    "slovak": "sk",
    "slovenian": "sl",
    "serbian": "sr",
    "croatian": "hr",
    "bulgarian": "bg",
    "welsh": "cy",
}


def code_or_name(raw: str) -> str:
    """A code (normalized) or a language's English name ("German" -> "de"); "" when raw
    is neither."""
    if valid_code(raw):
        return language_code(raw)
    return LANGUAGE_NAMES.get(raw.strip().lower(), "")
