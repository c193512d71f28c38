"""The corpus formats by name (data.format): the one place that knows them all.

Adding a format is one module in shared/corpus/formats/ (a class with the face
of shared/corpus/format.py CorpusFormat), one line in FORMATS below and its
tests; data.format's allowed names are config's (shared/config/data.py), and a
test checks that the two lists agree.
"""

from __future__ import annotations

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.format import CorpusFormat
from ringfeed.shared.corpus.formats.commonvoice import CommonVoice
from ringfeed.shared.corpus.formats.csv import Csv
from ringfeed.shared.corpus.formats.jsonl import Jsonl
from ringfeed.shared.corpus.formats.lhotse import Lhotse
from ringfeed.shared.corpus.formats.libritts import LibriTTS
from ringfeed.shared.corpus.formats.ljspeech import LJSpeech
from ringfeed.shared.corpus.formats.parquet import Parquet
from ringfeed.shared.corpus.formats.shards import Shards
from ringfeed.shared.corpus.formats.synthetic import Synthetic
from ringfeed.shared.corpus.formats.vctk import Vctk

FORMATS: dict[str, CorpusFormat] = {
    f.name: f
    for f in (
        LJSpeech(),
        Csv(),
        Jsonl(),
        LibriTTS(),
        Vctk(),
        CommonVoice(),
        Lhotse(),
        Parquet(),
        Shards(),
        Synthetic(),
    )
}


def format_named(name: str) -> CorpusFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"no corpus format {name!r} (known: {sorted(FORMATS)})") from None


def format_of(cfg: Config) -> CorpusFormat:
    """data.format's format."""
    return format_named(cfg.data.format)
