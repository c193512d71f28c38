"""The token vocabulary of a corpus: every character of its normalized (or phonemized)
texts, for text.alphabet. `ringfeed vocab CONFIG` prints it (scripts/cli.py).

One pass over the corpus with the producers' own encoder, so the vocabulary is
exactly what the producers will tokenize (any script, or IPA with text.tokens:
phonemes); the results land in the persistent text cache, so the producers'
first epoch then costs lookups. Characters are ordered by code point, so the
same corpus always gives the same ids; characters seen fewer than min_count
times are reported with an item that has them (a stray symbol, a typo, another
script), and left out when min_count asks. A text the encoder fails on costs that
text: it is counted and named in ``failed`` (the producers will skip it too).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

from ringfeed.producer.text.encoder import TextEncoder
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.open import open_corpus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Vocabulary:
    """alphabet: the characters kept, by code point; rare: (char, count, an item id) of
    those seen fewer than min_count times; texts: how many texts were read; failed:
    (item id, reason) of the texts that could not be cleaned."""

    alphabet: str
    rare: tuple[tuple[str, int, str], ...]
    texts: int
    failed: tuple[tuple[str, str], ...] = ()


def build_vocabulary(cfg: Config, min_count: int = 1, rare_below: int = 3) -> Vocabulary:
    """The vocabulary of cfg's corpus: characters seen >= min_count times; those seen
    fewer than max(min_count, rare_below) times are reported as rare."""
    index = open_corpus(cfg)
    encoder = TextEncoder(cfg)
    counts: collections.Counter[str] = collections.Counter()
    example: dict[str, str] = {}
    failed = []
    try:
        for entry in index.entries:
            try:
                text = encoder.clean(entry.text, entry.language)
            except Exception as exc:  # noqa: BLE001 - one text's failure costs that text
                failed.append((entry.item_id, f"{type(exc).__name__}: {exc}"))
                continue
            counts.update(text)
            for char in set(text) - example.keys():
                example[char] = entry.item_id
    finally:
        encoder.close()
    threshold = max(min_count, rare_below)
    rare = tuple((c, n, example[c]) for c, n in sorted(counts.items()) if n < threshold)
    alphabet = "".join(sorted(c for c, n in counts.items() if n >= min_count))
    if failed:
        log.warning("vocabulary: %d texts could not be cleaned, first %s: %s",
                    len(failed), *failed[0])  # fmt: skip
    return Vocabulary(alphabet, rare, len(index.entries), tuple(failed))
