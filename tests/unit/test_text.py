"""Text normalization on real-world cases, and the tokenizer's id contract."""

from __future__ import annotations

import numpy as np
import pytest

from ringfeed.producer.sample import SkipSample
from ringfeed.producer.text.encoder import (
    EOS_ID,
    FIRST_CHAR_ID,
    UNKNOWN_ID,
    TextEncoder,
    clean_text,
)
from ringfeed.shared.config import Config, replace


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("It cost $3.50.", "it cost three dollars, fifty cents."),
        ("Only $1 and $0.01", "only one dollar and one cent"),
        ("A fee of £20.", "a fee of twenty pounds."),
        ("In 1999 and 1066.", "in nineteen ninety nine and ten sixty six."),
        ("Pi is 3.14", "pi is three point one four"),
        ("About 1,000 people", "about one thousand people"),
        ("The 1st and 22nd", "the first and twenty second"),
        ("Mr. and Mrs. Smith met Dr. Jones", "mister and misess smith met doctor jones"),
        (
            "St. Paul, Capt. Cook, Lt. Col. Sgt. Maj. Gen. etc.",
            "saint paul, captain cook, lieutenant colonel sergeant major general et cetera",
        ),
        ("\u201cQuoted\u201d and \u2018single\u2019", "\"quoted\" and 'single'"),
        ("wait\u2014what\u2013now", "wait - what - now"),
        ("Caf\u00e9   na\u00efve\tr\u00e9sum\u00e9", "cafe naive resume"),
        ("50% off", "fifty percent off"),
        ("Chapter 7", "chapter seven"),
        ("Call 555-0199 at 10:30.", "call five five five, zero one nine nine at ten thirty."),
        ("At 9:05 pm or 12:00", "at nine oh five pm or twelve o'clock"),
        ("From 1999-2001", "from nineteen ninety nine-two thousand and one"),
    ],
)
def test_clean_text(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected


def test_tokenizer_ids_eos_and_unknown() -> None:
    cfg = Config()
    enc = TextEncoder(cfg)
    ids, truncated = enc.encode("ab")
    a = FIRST_CHAR_ID + cfg.text.alphabet.index("a")
    assert ids.dtype == np.int32 and not truncated
    assert ids.tolist() == [a, a + 1, EOS_ID]
    assert int(ids.max()) < cfg.vocab_size
    # "_" is outside the default alphabet (1 of 20 characters is within max_unknown_frac).
    ids, _ = enc.encode("abcdefghij_abcdefghi")
    assert ids[10] == UNKNOWN_ID
    no_eos = TextEncoder(replace(cfg, text={"add_eos": False}))
    assert no_eos.encode("ab")[0].tolist() == [a, a + 1]


def test_a_text_is_normalized_and_tokenized_once() -> None:
    """A text seen before is one lookup: the same read-only ids, no cleaning, no
    tokenizing; a refused text names the clip it came with each time."""
    enc = TextEncoder(Config())
    ids = [enc.encode("Dr. Who, 1963.")[0] for _ in range(3)]
    assert enc.normalized == 1 and enc.clean.cache_info().misses == 1
    assert ids[1] is ids[0] and ids[2] is ids[0] and not ids[0].flags.writeable
    assert enc.decode(ids[0]) == "doctor who, nineteen sixty three."
    for path in ("a.wav", "b.wav"):
        with pytest.raises(SkipSample) as refused:
            enc.encode(" ... ", path)
        assert refused.value.path == path and refused.value.stage == "text"


def test_rejects_empty_unknown_and_too_long() -> None:
    cfg = replace(Config(), text={"max_text_len": 10})
    enc = TextEncoder(cfg)
    with pytest.raises(SkipSample, match="empty text after cleaning"):
        enc.encode("   \t ")
    with pytest.raises(SkipSample, match=r"unknown-character fraction 0\.\d+ .*'_'"):
        enc.encode("a_b_c_")
    with pytest.raises(SkipSample, match="text.max_text_len=10.*on_too_long: truncate"):
        enc.encode("a rather long sentence")
    cut = TextEncoder(replace(cfg, features={"on_too_long": "truncate"}))
    ids, truncated = cut.encode("a rather long sentence")
    assert truncated and len(ids) == 10 and ids[-1] == EOS_ID
