"""The configuration's corpus sections: what the corpus is (data) and how its text
becomes tokens (text). Part of the one configuration (shared/config.py, which
holds them in Config and validates them with the rest); kept apart as the corpus
keys grow with each layout, language and token kind.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Literal

DEFAULT_ALPHABET = string.ascii_lowercase + " !'(),-.:;?\""


@dataclass(frozen=True)
class DataConfig:
    # The corpus: a folder (ljspeech, libritts, vctk) or a metadata file (csv, jsonl).
    path: str = "data/ljspeech-mini"
    # ljspeech (metadata.csv), csv (audio_file|text[|speaker_name]), jsonl (a manifest, one
    # clip per line), libritts (LibriTTS and LibriTTS-R folders), vctk: shared/dataset.py
    # and shared/corpora.py; shards: WebDataset-style tar shards in a folder or on object
    # storage (s3://, gs://, https://; shared/shards.py); synthetic: precomputed arrays, no
    # files (transport tests and benchmarks).
    format: Literal["ljspeech", "csv", "jsonl", "libritts", "vctk", "shards", "synthetic"] = (
        "ljspeech"
    )
    # Items of format: synthetic.
    synthetic_items: int = 256
    # Lengths of synthetic items: "uniform" (max/2..max, exercises padding) or
    # "ljspeech" (LJSpeech's clip-length shape: 1..10 s, mean ~6.6 s, scaled to the slot).
    synthetic_lengths: Literal["uniform", "ljspeech"] = "uniform"
    # 1 = raw text (LJSpeech's column 1, LibriTTS' .original.txt), 2 = normalized.
    text_column: int = 2
    # The language (a code: en, de, fa, pt-br) of clips whose entry names none; auto:
    # detected from the text (shared/language_id.py), among detect_languages if given.
    language: str = "en"
    # With language: auto, the codes detection may choose from; () = any of 97.
    detect_languages: tuple[str, ...] = ()
    # Speaker and language ids (shared/id_tables.py) stay below these: the sizes of the
    # model's embedding tables, fixed so that a table that grows keeps the weights' shapes.
    max_speakers: int = 1024
    # The size of the language embedding table (see max_speakers).
    max_languages: int = 64
    # A resume whose corpus has speakers or languages the run's id table lacks: refuse
    # (the default: the model never saw them, and it is often the wrong data.path) or
    # append them with new ids.
    new_ids: Literal["refuse", "append"] = "refuse"
    # Shards on object storage (shared/object_store.py; credentials come from each store's
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
    # (consumer/stager/shard_window.py).
    shard_window: int = 0


@dataclass(frozen=True)
class TextConfig:
    # chars: the characters of the normalized text (any script); phonemes: its IPA from
    # espeak-ng (producer/phonemes.py).
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
