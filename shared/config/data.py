"""The configuration's data section: what the corpus is and where it lives.

Part of the one configuration (shared/config/config.py); validates its own keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ringfeed.shared.config.loader import at_least_one, check
from ringfeed.shared.language.codes import valid_code


@dataclass(frozen=True)
class ColumnsConfig:
    """data.columns: which columns of a Parquet corpus (data.format: parquet) hold what;
    the defaults are what Hugging Face datasets name them."""

    # The audio: a struct of bytes and path (datasets' Audio feature, its bytes embedded).
    audio: str = "audio"
    # The transcription (Common Voice on the Hub: sentence; LibriTTS-R: text_normalized).
    text: str = "text"
    # "" = speaker_id where the files have it, else no speaker; a name: that column, which
    # must be there (Common Voice on the Hub: client_id).
    speaker: str = ""
    # "" = language where the files have it, else data.language; a name: that column.
    language: str = ""
    # The row's name in its file, which its item id is made of (<file>/<name>,
    # docs/corpora.md#item-ids): "" = id where the files have it, else the audio's file name
    # without its extension, whichever names each row of a file once, else the row's
    # number; a name: that column.
    id: str = ""

    def __post_init__(self) -> None:
        for key in ("audio", "text"):
            check(bool(getattr(self, key)), f"data.columns.{key}", "must name a column")


@dataclass(frozen=True)
class DataConfig:
    # The corpus: a folder (ljspeech, libritts, vctk) or a metadata file (csv, jsonl).
    path: str = "data/ljspeech-mini"
    # ljspeech (metadata.csv), csv (audio_file|text[|speaker_name]), jsonl (a manifest, one
    # clip per line), libritts (LibriTTS and LibriTTS-R folders), vctk; shards: WebDataset-style
    # tar shards in a folder or on object storage (s3://, gs://, https://); commonvoice: a
    # Common Voice locale folder (validated.tsv, clips/*.mp3) or one of its tsv files; lhotse:
    # a Lhotse supervisions (with its recordings) or cuts manifest, .jsonl(.gz); parquet: a
    # folder (or file) of Hugging Face datasets' Parquet files (data.columns); synthetic:
    # precomputed arrays, no files (transport tests and benchmarks). One module each in
    # shared/corpus/formats/; every format: docs/corpora.md#bring-your-own-data.
    format: Literal[
        "ljspeech",
        "csv",
        "jsonl",
        "libritts",
        "vctk",
        "commonvoice",
        "lhotse",
        "parquet",
        "shards",
        "synthetic",
    ] = "ljspeech"
    # What item ids and audio paths count from (jsonl and csv, whose lines name audio files
    # freely; relative to the config file): "" = the manifest's or metadata file's
    # folder. Set it to the corpus's top folder when a manifest lists absolute paths
    # outside its own folder, so the same corpus has the same ids wherever it lives.
    root: str = ""
    # The columns of a Parquet corpus (data.format: parquet).
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    # The split to read of a folder laid out as the Hugging Face Hub lays out splits
    # (parquet, shards: train-00000-of-00002.parquet beside test-00000-of-00001.parquet,
    # or train/ beside test/; docs/corpora.md#splits): "" = train where the folder holds
    # several, else every file; a name: that split's files only (`ringfeed validate`
    # lists the splits found). Test and validation files are never read unasked.
    split: str = ""
    # Items of format: synthetic.
    synthetic_items: int = 256
    # Lengths of synthetic items: "uniform" (max/2..max, exercises padding) or
    # "ljspeech" (LJSpeech's clip-length shape: 1..10 s, mean ~6.6 s, scaled to the slot).
    synthetic_lengths: Literal["uniform", "ljspeech"] = "uniform"
    # 1 = raw text (LJSpeech's column 1, LibriTTS' .original.txt), 2 = normalized.
    text_column: int = 2
    # The language (a code: en, de, fa, pt-br) of clips whose entry names none; auto:
    # detected from the text (shared/language/detect.py), among detect_languages if given.
    language: str = "en"
    # With language: auto, the codes detection may choose from; () = any of 97.
    detect_languages: tuple[str, ...] = ()
    # Speaker and language ids (shared/run/id_tables.py) stay below these: the sizes of the
    # model's embedding tables, fixed so that a table that grows keeps the weights' shapes;
    # the last id of each marks padding rows, so a table holds one name fewer.
    max_speakers: int = 1024
    # The size of the language embedding table (see max_speakers).
    max_languages: int = 64
    # A resume whose corpus has speakers or languages the run's id table lacks: refuse
    # (the default: the model never saw them, and it is often the wrong data.path) or
    # append them with new ids.
    new_ids: Literal["refuse", "append"] = "refuse"
    # Audio that is not its text (docs/corpora.md#audio-that-is-not-its-text): a clip whose
    # speaking rate (tokens per second of its header's duration) is outside its language's
    # band, learnt from the corpus, or whose audio is near-silent or clipped. skip (the
    # default): quarantined with the rate and the band, never trained on, as a text four
    # times too long teaches the model wrong alignments and a clip lost costs one clip;
    # flag: delivered, and listed once in the run's outliers.jsonl (review, then choose);
    # keep: not judged (speech whose text is not a transcript).
    outliers: Literal["keep", "flag", "skip"] = "skip"
    # Shards on object storage (shared/corpus/object_store.py; credentials come from each store's
    # usual environment, AWS_* or GOOGLE_*, never from here): each shard read is copied
    # once into the shard cache, the least recently used evicted past this size (MB).
    shard_cache_mb: int = 4096
    # Where the shard cache lives ("": <features.cache_dir>/shard-cache), shared by the
    # producers of a host.
    shard_cache_dir: str = ""
    # Tries in all of a read from object storage that fails on a transient error (a broken
    # pipe, a 5xx, a timeout), waiting 0.5 s, 1 s, 2 s ... in between.
    store_retries: int = 5
    # Shards: 0 (the default) plans each epoch as a permutation of all items; W > 0 deals
    # the shards in a random order and the items of each window of W shards in a random
    # order, so a shard cache of about W shards fetches each shard once an epoch
    # (consumer/stager/plan/shard_window.py).
    shard_window: int = 0

    def __post_init__(self) -> None:
        at_least_one("data", shard_cache_mb=self.shard_cache_mb, store_retries=self.store_retries)
        for key in ("max_speakers", "max_languages"):  # a name's id and the padding rows'
            check(getattr(self, key) >= 2, f"data.{key}", f"must be >= 2, got {getattr(self, key)}")
        check(self.text_column in (1, 2), "data.text_column", "must be 1 or 2")
        check(
            self.language == "auto" or valid_code(self.language),
            "data.language",
            f"must be a language code such as en, de or pt-br, or auto; got {self.language!r}",
        )
        for code in self.detect_languages:
            check(valid_code(code), "data.detect_languages", f"{code!r} is no code")
        check(self.shard_window >= 0, "data.shard_window", "must be >= 0 (0 = off)")
        check(
            "/" not in self.split and self.split == self.split.strip(),
            "data.split",
            f"must be a split's name such as train or test, got {self.split!r}",
        )
        # What a format can serve (shard windows, object-store URLs) is the format's to
        # check, when the corpus opens: shared/corpus/format.py.
