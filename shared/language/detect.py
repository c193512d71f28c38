"""The language of a clip whose entry names none (data.language: auto).

Called while reading the dataset index (shared/corpus/dataset.py), so the stager (which
builds the id tables from it) and every producer (which normalizes each text in
its language) get the same language for each item: the detector is
deterministic, and its answers are kept in the persistent text cache
(shared/language/text_cache.py) keyed by the text, so only the first process to read a
corpus pays for detection, and a text seen before costs a lookup.

The detector is py3langid (a fork of langid.py, Lui & Baldwin 2012): its model
ships inside the package (no download at run time), it covers 97 languages
Persian included, answers in well under a millisecond a sentence, and weighs a
few MB per process. data.detect_languages restricts it to the corpus's
languages, which is what makes short texts reliable (a 5-word sentence can look
like several languages among 97, rarely among 3). lingua is more accurate on
short texts but loads ~1 GB with all its models; langdetect is random unless
seeded and ~10x slower.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence

from ringfeed.shared.language.text_cache import TextCache

log = logging.getLogger(__name__)

# Characters of a text the detector reads at most: the start of a text says its
# language, and the cost stays bounded whatever the text's length.
MAX_DETECT_CHARS = 1000


class LanguageDetector:
    """detect(text) -> a language code, restricted to `candidates` when given."""

    def __init__(self, candidates: Sequence[str] = ()) -> None:
        from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

        self._identifier = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE)
        if candidates:
            self._identifier.set_languages([c.split("-")[0] for c in candidates])
        self._full = {c.split("-")[0]: c for c in candidates}

    def detect(self, text: str) -> str:
        code, _ = self._identifier.classify(text[:MAX_DETECT_CHARS])
        return self._full.get(code, code)


@functools.cache
def detector_version() -> str:
    """What the cache keys detections on: bumped when the detector or its settings
    change, with the installed py3langid's version (another version may detect
    otherwise, and the detections are cached per host: the corpus digest carries them).
    Asked when texts are detected, not at import: importlib.metadata costs ~55 ms."""
    import importlib.metadata

    return f"py3langid-1-{importlib.metadata.version('py3langid')}"


@functools.cache
def detector(candidates: tuple[str, ...]) -> LanguageDetector:
    """The process's detector for these candidates: its model is loaded once (~0.3 s)."""
    return LanguageDetector(candidates)


def detect_languages(
    texts: Sequence[str], candidates: Sequence[str], cache_dir: str | None
) -> list[str]:
    """The language of each text, from the cache or detected (and then cached); cache_dir
    None (features.cache: false) detects every text and writes nothing."""
    cache = TextCache(cache_dir)
    out = []
    t0 = time.monotonic()
    kind = f"language:{detector_version()}:{','.join(sorted(candidates))}"
    try:
        for text in texts:
            code = cache.get(kind, "", text)
            if code is None:
                code = detector(tuple(candidates)).detect(text)
                cache.put(kind, "", text, code)
            out.append(code)
    finally:
        cache.close()
    if cache.misses:
        log.info(
            "language detection: %d texts detected, %d from the cache, in %.1f s",
            cache.misses,
            cache.hits,
            time.monotonic() - t0,
        )
    return out
