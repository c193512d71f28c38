"""The speaking-rate band: per language, how many tokens a second of a clip may hold.

A clip whose text is not what its audio says (a text four times too long, a file cut
to a quarter with its header made to fit, a header over noise, the line of another
clip) has a speaking rate far from its language's. The band is learnt from the
corpus itself, from the length table (shared/corpus/lengths.py: tokens as the
producers encode the text, mel frames from the audio header, never a decode), once,
by the stager at start (consumer/stager/outliers.py) and by `ringfeed validate`
(scripts/corpus_report.py), which so agree.

Rate: tokens / seconds, seconds = frames x hop_length / sample_rate. Tokens, not the
metadata's characters: they are counted after normalization ("1999" is "nineteen
ninety-nine"), and on the multilingual demo corpus their robust spread per language
is 0.04-0.11 (log units) against 0.09-0.27 for raw characters; on LJSpeech's 16
shipped clips 0.137 against 0.158.

Band: the log rate's median m and spread s = max(1.4826 x MAD, MIN_SPREAD) (the MAD
scaled to a normal's standard deviation), and the band exp(m +- BAND_K x s). Median
and MAD stand while up to half the clips are wrong; a mean and a standard deviation
are dragged by the very outliers they must find.
- BAND_K = 3: "very conservative" in Leys et al. 2013 ("Detecting outliers: do not use
  standard deviation around the mean, use absolute deviation around the median");
  0.27 % of a normal corpus falls outside. The shipped clips lie within 2.6 s of their
  median; a text twice too long (a clip cut to half) is log 2 = 0.69, 5 s at
  LJSpeech's spread, and four times too long is 10 s.
- MIN_SPREAD = 0.10: espeak's metronome-regular Russian clips have s = 0.039, where a
  clip 20 % slower is 5.7 s out; real speech varies more (LJSpeech's one reader:
  0.137), so no band is narrower than +-30 % at k = 3.
- MIN_CLIPS = 10 clips of a language with a rate, or it has no band: the median of
  n clips moves ~1.25 s / sqrt(n) and the MAD ~1.16 s / sqrt(n), so at 10 an edge
  is known to ~1.5 s, still well inside the 5 s of a text twice too long; below it,
  a few wrong clips are a large part of what the band is learnt from.
A clip without a known duration or with no tokens (the producers skip it) has no rate.

Bound: besides its language's band, every clip's rate must lie within a fixed
plausibility bound, MIN_RATE..MAX_RATE tokens per second, which holds from the first
clip on, whatever the corpus's size: a 1 s clip with a 400-character text is no clip
of speech, whether its language has ten clips or one.
- MAX_RATE = 60: the fastest speakers on record talk about 600 words a minute, 10 words
  and some 60 characters a second; read speech runs 12-18 (LJSpeech's shipped clips
  13.2-18.1, the demo's 8.7-16.8 characters a second). Phoneme strings (IPA with stress
  marks) are about as long as the text's characters. A text four times too long for a
  normal clip (~60) is at the edge: the band finds those, the bound what no one says.
- MIN_RATE = 0.5: a character every 2 s of audio, say "yes" in a 6 s clip. The header's
  duration counts silence, so speech itself may be slower than its clip's rate only
  where the clip is mostly silence.
A language with fewer than MIN_CLIPS clips has the bound alone, not a band pooled over
the corpus: languages speak at rates apart by more than a band is wide (the demo's
Persian at 9.9 tokens a second, English at 14.8: log 1.5 = 0.40, 3-4 of English's
spreads), so a pooled band would skip a small language's sound clips, or, widened to
hold them all, find nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.lengths import Lengths

BAND_K = 3.0
MIN_SPREAD = 0.10
MIN_CLIPS = 10
MIN_RATE, MAX_RATE = 0.5, 60.0
# The MAD of a normal distribution is 0.6745 of its standard deviation.
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class RateBand:
    """One language's band, tokens per second: clips with a rate, their median, the
    edges (low, high); `spread` the log rate's robust standard deviation."""

    language: str
    clips: int
    median: float
    low: float
    high: float
    spread: float

    @classmethod
    def bound(cls, language: str) -> RateBand:
        """The plausibility bound (module docstring), as a band of no clips."""
        return cls(language, 0, math.nan, MIN_RATE, MAX_RATE, 0.0)

    @property
    def fixed(self) -> bool:
        """The plausibility bound, not a band learnt from clips."""
        return self.clips == 0

    def describe(self) -> str:
        if self.fixed:
            return f"{self.low:.1f}..{self.high:.1f} tokens/s (the bound of every language)"
        return f"{self.low:.1f}..{self.high:.1f} tokens/s (median {self.median:.1f})"


@dataclass(frozen=True)
class OutOfBand:
    """A clip outside its language's band: item, its rate (tokens per second), the band."""

    item: int
    rate: float
    band: RateBand

    def reason(self) -> str:
        """One line: what is wrong and what to do about it."""
        side = "fast" if self.rate > self.band.high else "slow"
        what = "the plausibility bound" if self.band.fixed else "its language's band"
        return (
            f"speaking rate {self.rate:.1f} tokens/s outside {what} "
            f"{self.band.describe()} ({side}: the text is not what the audio says, or the "
            "audio is cut): fix the text or the clip, or set data.outliers: flag or keep"
        )


def rates(cfg: Config, lengths: Lengths) -> np.ndarray:
    """float64 [n_items] tokens per second by the length table; NaN where unknown, and
    where the clip is shorter than audio.min_duration_s or longer than
    audio.max_duration_s: a producer skips those with that reason, more precise than a
    rate (a 20 ms clip of two words is too short before it is too fast)."""
    seconds = lengths.frames.astype(np.float64) * cfg.features.hop_length / cfg.audio.sample_rate
    a = cfg.audio
    known = (lengths.frames > 0) & (lengths.text > 0)
    known &= (seconds >= a.min_duration_s) & (seconds <= a.max_duration_s)
    out = np.full(len(seconds), np.nan)
    out[known] = lengths.text[known] / seconds[known]
    return out


def median(x: np.ndarray) -> float:
    """np.median of a non-empty float64 array without NaN, to the bit: np.median's first
    call imports numpy.ma (~14 ms of every stager's start, benchmarks/first_batch.py)."""
    k = len(x) // 2
    if len(x) % 2:
        return float(np.partition(x, k)[k])
    part = np.partition(x, (k - 1, k))
    return float((part[k - 1] + part[k]) / 2)


def rate_bands(cfg: Config, index: CorpusIndex, lengths: Lengths) -> dict[str, RateBand]:
    """Each language's band (languages with fewer than MIN_CLIPS rated clips have none)."""
    log_rate = np.log(rates(cfg, lengths))
    language_ids = np.asarray(index.language_ids)
    bands = {}
    for k, language in enumerate(index.languages):
        x = log_rate[(language_ids == k) & np.isfinite(log_rate)]
        if len(x) < MIN_CLIPS:
            continue
        m = median(x)
        spread = max(MAD_TO_SIGMA * median(np.abs(x - m)), MIN_SPREAD)
        low, high = math.exp(m - BAND_K * spread), math.exp(m + BAND_K * spread)
        bands[language] = RateBand(language, len(x), math.exp(m), low, high, spread)
    return bands


def out_of_band(
    cfg: Config, index: CorpusIndex, lengths: Lengths, bands: dict[str, RateBand]
) -> list[OutOfBand]:
    """The clips outside their language's band, or else outside the plausibility bound,
    in item order."""
    rate = rates(cfg, lengths)
    language_ids = np.asarray(index.language_ids)
    known = np.isfinite(rate)
    found = []
    for k, language in enumerate(index.languages):
        mine = (language_ids == k) & known
        for band in (bands.get(language), RateBand.bound(language)):
            if band is None:
                continue
            outside = mine & ((rate < band.low) | (rate > band.high))
            found += [OutOfBand(int(i), float(rate[i]), band) for i in np.flatnonzero(outside)]
            mine &= ~outside  # a clip is told once: by its band where it has one
    return sorted(found, key=lambda o: o.item)
