"""A producer's text cost per language path, cold and cached, side by side.

    .venv/bin/python benchmarks/text_cost.py [--rounds 5] [--texts 400]

Texts: --texts distinct sentences per path, made from the shipped corpora's
sentences with a number appended (so each is new to every cache and each has a
number to spell out): data/ljspeech-mini's 16 for English, the 40 of
data/multilingual-demo (en, de, ru, fa) for the others. Per path, texts/s of
what a producer does to a text before tokenizing (``TextEncoder.encode``):

- en chars: today's path, the English cleaners;
- multilingual chars + detection: the language detected (data.language: auto,
  shared/language/detect.py) and the language's normalizer (producer/text/normalize.py);
- phonemes: the same, then espeak-ng per language (producer/text/phonemes.py);

each cold (a fresh cache directory: detection, normalization, phonemization, cache
writes; the detector's model and the espeak voices loaded once before, as a producer
does once in its life, and reported apart) and cached (a new encoder, so its in-
process LRU is empty, on the persistent text cache the cold pass filled: lookups
only; the test suite checks that a hit costs no detection and no phonemization). The
audio and mel work of a sample is the same for every path
(benchmarks/producer_cache.py measures it).
Rounds alternate the paths so the shared machine's noise hits them alike; the
table gives medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ringfeed.producer.text.encoder import TextEncoder  # noqa: E402
from ringfeed.shared.config import load_config, replace  # noqa: E402
from ringfeed.shared.language.detect import detect_languages  # noqa: E402

DEMO = REPO / "configs" / "multilingual.yaml"


def sentences(n: int) -> tuple[list[str], list[str]]:
    """(n English texts, n multilingual texts), each distinct."""
    lj = [
        line.split("|")[2]
        for line in (REPO / "data/ljspeech-mini/metadata.csv").read_text().splitlines()
        if line.strip()
    ]
    demo = [
        json.loads(x)["text"]
        for x in (REPO / "data/multilingual-demo/train.jsonl").read_text().splitlines()
    ]
    return (
        [f"{lj[k % len(lj)]} {k + 1}" for k in range(n)],
        [f"{demo[k % len(demo)]} {k + 1}" for k in range(n)],
    )


def timed(path: str, texts: list[str], cache_dir: str) -> float:
    """texts/s of one pass of `path` over `texts` with the text cache in cache_dir."""
    cfg = load_config(DEMO)
    tokens = "phonemes" if path == "phonemes" else "chars"
    text = {"tokens": tokens, "max_unknown_frac": 1.0, "max_text_len": 1000}
    cfg = replace(cfg, features={"cache_dir": cache_dir, "cache": True}, text=text)
    t0 = time.perf_counter()
    if path == "en":
        languages = ["en"] * len(texts)
    else:
        languages = detect_languages(texts, cfg.data.detect_languages, cache_dir)
    encoder = TextEncoder(cfg)
    for text, language in zip(texts, languages, strict=True):
        encoder.encode(text, "", language)
    encoder.close()
    return len(texts) / (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--texts", type=int, default=400)
    args = parser.parse_args()
    english, multilingual = sentences(args.texts)
    paths = {"en": english, "multilingual": multilingual, "phonemes": multilingual}
    rates: dict[str, list[float]] = {f"{p} {m}": [] for p in paths for m in ("cold", "cached")}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as warmup:  # load the detector and espeak once
        timed("phonemes", multilingual[:8], warmup)
    print(f"once per process: detector model and espeak voices {time.perf_counter() - t0:.2f} s")
    for _ in range(args.rounds):
        for path, texts in paths.items():
            with tempfile.TemporaryDirectory() as cache_dir:
                rates[f"{path} cold"].append(timed(path, texts, cache_dir))
                rates[f"{path} cached"].append(timed(path, texts, cache_dir))
    print(f"{args.texts} texts per pass, {args.rounds} rounds, medians:")
    print("| path | cold texts/s | cached texts/s | cached/cold | cold vs en chars |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(rates["en cold"])
    for path in paths:
        cold = statistics.median(rates[f"{path} cold"])
        cached = statistics.median(rates[f"{path} cached"])
        print(
            f"| {path} | {cold:,.0f} | {cached:,.0f} | {cached / cold:.1f}x | {cold / base:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
