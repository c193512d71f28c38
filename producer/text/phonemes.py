"""Phonemes (text.tokens: phonemes): normalized text -> IPA with espeak-ng.

Called in producer processes by producer/text/encoder.py, once per text on a cache miss
(the persistent text cache keeps the result, so a text phonemized once costs a
lookup afterwards, in every process and run on the host).

Through the ``phonemizer`` package's espeak backend, one backend per language
per process, made on first use (~80-190 ms each, phonemizer#212) and reused (a
call then costs ~0.1 ms a sentence here). espeak-ng keeps global state and is
not thread-safe (espeak-ng#68): a producer phonemizes from one thread only, and
phonemizer gives each backend its own copy of the library, so backends of two
languages alternate safely in one process (tests/unit/test_languages.py checks it,
as phonemizer#116 reports the opposite for some set-ups). Language switch flags
such as "(en)" that espeak inserts when a word looks foreign are removed
(coqui#1802). Punctuation is not preserved: it made phonemizer 17x slower
(phonemizer#59).

espeak-ng is a Debian package: scripts/setup.sh installs it where it can, and
:func:`espeak_problem` says what to run where it is missing (`ringfeed validate`
refuses text.tokens: phonemes then).
"""

from __future__ import annotations

import shutil

INSTALL_LINE = "sudo apt-get install -y espeak-ng"
# espeak voices for codes espeak names otherwise.
VOICES = {"en": "en-us", "fr": "fr-fr", "pt": "pt-br", "fa": "fa", "zh": "cmn"}


def espeak_problem() -> str:
    """'' when espeak-ng and phonemizer can be used, else what to install."""
    try:
        from phonemizer.backend import EspeakBackend
    except ImportError:
        return "the phonemizer package is missing: pip install phonemizer"
    if shutil.which("espeak-ng") is None and not EspeakBackend.is_available():
        return f"espeak-ng is not installed: run `{INSTALL_LINE}` (Debian, Ubuntu)"
    return ""


def voice_for(language: str, supported: set[str]) -> str:
    """The espeak voice of a language code; ValueError names the code if it has none."""
    for voice in (
        language,
        VOICES.get(language, ""),
        VOICES.get(language.split("-")[0], ""),
        language.split("-")[0],
    ):
        if voice in supported:
            return voice
    raise ValueError(f"espeak-ng has no voice for language {language!r}")


class Phonemizer:
    """phonemize(text, language) -> IPA string; one espeak backend per language."""

    def __init__(self) -> None:
        from phonemizer.backend import EspeakBackend

        self._backend_class = EspeakBackend
        self._supported = set(EspeakBackend.supported_languages())
        self._backends: dict[str, object] = {}

    def __call__(self, text: str, language: str) -> str:
        backend = self._backends.get(language)
        if backend is None:
            voice = voice_for(language, self._supported)
            backend = self._backend_class(voice, language_switch="remove-flags")
            self._backends[language] = backend
        return backend.phonemize([text], strip=True, njobs=1)[0]
