"""The configuration's text section: how a clip's text becomes tokens.

Part of the one configuration (shared/config/config.py); validates its own keys.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Literal

from ringfeed.shared.config.loader import at_least_one, check

DEFAULT_ALPHABET = string.ascii_lowercase + " !'(),-.:;?\""


@dataclass(frozen=True)
class TextConfig:
    # chars: the characters of the normalized text (any script); phonemes: its IPA from
    # espeak-ng (producer/text/phonemes.py).
    tokens: Literal["chars", "phonemes"] = "chars"
    # The vocabulary: ids 3.. in this order. `ringfeed vocab CONFIG` builds it from the
    # normalized (or phonemized) corpus and reports rare characters.
    alphabet: str = DEFAULT_ALPHABET
    # Tokens per sample slot (the end-of-text token included); a longer text follows
    # features.on_too_long.
    max_text_len: int = 200
    # Append the end-of-text token (id 2) to every text.
    add_eos: bool = True
    # A text whose share of characters outside the alphabet exceeds this is quarantined.
    max_unknown_frac: float = 0.1

    def __post_init__(self) -> None:
        at_least_one("text", max_text_len=self.max_text_len)
        check(
            len(set(self.alphabet)) == len(self.alphabet) and self.alphabet != "",
            "text.alphabet",
            "must be a non-empty string of distinct characters",
        )
        check(0 <= self.max_unknown_frac <= 1, "text.max_unknown_frac", "must be in [0, 1]")
