"""Fingerprints: what decides the plan, and what shapes a sample, as short hashes.

The plan fingerprint (stager, once at start) hashes what decides which item is at
which plan position: the dataset index content (item ids and audio paths in file
order, not mtimes), the seed, the length buckets and the length table, and
with stager.balance each item's group and the weights (a part only a balanced
plan has, so the default plan's fingerprint is what it was). Never the number of
training workers: a resume with another number continues the plan. It is
kept per part, so a refused resume can say what changed. The stager sends it in
its WELCOME to the consumer; the trainer keeps it in every checkpoint's cursor and
sends it back in its CONSUMER_HELLO when it resumes (consumer/stager/consumer_side.py).

The config fingerprint (every producer, in its HELLO) hashes each config key that
shapes a sample, one hash per key, so the stager can refuse a producer whose
config differs and name the keys (consumer/stager/producer_desk.py). It also
carries the corpus digest (CORPUS_KEY): item ids, texts, speakers, languages and
audio paths relative to the corpus root, in item order. Only the item count was
compared before, and a remote host whose metadata listed the same clips in
another order joined and paired one clip's mel with another clip's text.

Cost: the index part is kept in the mapped corpus index (shared/corpus/index.py),
hashed at its build; the length table part is one pass over its arrays; never per-clip
work in other processes (docs/plans.md#resuming-after-the-dataset-changed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.open import open_prepared

# Hex characters of each part's hash: 64 bits, enough to tell two versions apart.
PLAN_HASH_HEX = 16
# Hex characters of each config key's hash: 32 bits per key, as a key rarely changes.
KEY_HASH_HEX = 8
# What each plan part is called in a refusal.
PLAN_PARTS = {
    "index": "dataset index",
    "seed": "seed",
    "buckets": "buckets",
    "lengths": "length table",
    "balance": "balance (stager.balance: groups, temperature, weights)",
}
# Parts by an earlier key, as older checkpoints' cursors hold them: read as the new key,
# so a run saved before the rename still resumes.
RENAMED_PARTS = {"manifest": "lengths"}
# The index part under the item ids an earlier rule gave the same items, where the ids
# changed (docs/corpora.md#item-ids): a cursor that holds it names this plan, and resumes.
INDEX_BEFORE = "index_before"
# Config sections whose keys shape a sample, less the keys that do not.
SAMPLE_SECTIONS = ("data", "text", "audio", "features")
# Where the corpus and the caches live: a producer host keeps them anywhere.
NOT_SHAPING = {"data.path", "data.root", "features.cache_dir", "features.cache"}
# The config fingerprint's entry for the corpus's content (corpus_digest).
CORPUS_KEY = "data.corpus"
# Keys a refusal names at most (the message stays short whatever the peer sent).
MAX_KEYS_SHOWN = 8


def _digest(chunks: Iterable[bytes], hex_chars: int) -> str:
    h = hashlib.blake2b(digest_size=hex_chars // 2)
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def corpus_digest(cfg: Config, index: CorpusIndex) -> str:
    """What makes item k the same clip with the same text on every host: ids, texts,
    speakers, languages, segments and audio paths relative to the corpus root, in item
    order. The index's own digest (computed once at its build, kept in the index's
    header; shared/corpus/build.py), so a producer pays nothing per clip for it."""
    return index.digest


def plan_fingerprint(
    cfg: Config,
    index: CorpusIndex,
    buckets: Sequence[tuple[int, ...]],
    lengths: Sequence[np.ndarray],
) -> dict[str, str]:
    """Per part (PLAN_PARTS), the hash of what decides the plan; called once by the stager.
    buckets: each bucket's (frames, text, rows); lengths: the length table's arrays
    (shared/corpus/lengths.py; [] without buckets: then neither part decides anything)."""
    parts = {
        "index": index.plan_hash,
        "seed": _digest([str(cfg.stager.seed).encode()], PLAN_HASH_HEX),
        "buckets": _digest([json.dumps([list(b) for b in buckets]).encode()], PLAN_HASH_HEX),
        "lengths": _digest((np.ascontiguousarray(a).tobytes() for a in lengths), PLAN_HASH_HEX),
    }
    if index.plan_hash_before:
        parts[INDEX_BEFORE] = index.plan_hash_before
    return parts


def plan_changes(ours: dict[str, str], theirs: dict[str, Any]) -> list[str]:
    """The names of the plan parts that differ ([] if none); `theirs` may name a part by
    its earlier key (RENAMED_PARTS), and the index by the ids before the present rule
    (INDEX_BEFORE): a checkpoint taken before item ids changed resumes where its items
    are the same. A changed index of a corpus whose ids changed says so."""
    theirs = {RENAMED_PARTS.get(part, part): value for part, value in theirs.items()}
    if ours.get(INDEX_BEFORE) and theirs.get("index") == ours[INDEX_BEFORE]:
        theirs["index"] = ours["index"]
    changed = [name for part, name in PLAN_PARTS.items() if theirs.get(part) != ours.get(part)]
    if ours.get(INDEX_BEFORE) and INDEX_BEFORE not in theirs and PLAN_PARTS["index"] in changed:
        changed[changed.index(PLAN_PARTS["index"])] += (
            ": its item ids are made by a new rule since the checkpoint "
            "(docs/corpora.md#item-ids), and the old rule had lost rows as duplicates, or "
            "its files changed"
        )
    return changed


def config_fingerprint(cfg: Config, corpus: str | None = None) -> dict[str, str]:
    """Per "section.key", a hash of its value, for every key that shapes a sample, and
    the corpus digest under CORPUS_KEY (None: read the index to compute it); every
    producer sends it in its HELLO."""
    if corpus is None:
        corpus = corpus_digest(cfg, open_prepared(cfg))
    raw = cfg.to_dict()
    keys = {
        f"{section}.{key}": value
        for section in SAMPLE_SECTIONS
        for key, value in raw[section].items()
        if f"{section}.{key}" not in NOT_SHAPING
    }
    hashes = {k: _digest([json.dumps(v).encode()], KEY_HASH_HEX) for k, v in keys.items()}
    return hashes | {CORPUS_KEY: corpus}


def config_refusal(ours: dict[str, str], theirs: dict[str, Any]) -> str:
    """'' if a producer's config fingerprint is ours, else a refusal naming the keys that
    differ (only our own key names: nothing the peer wrote reaches the text)."""
    differ = [key for key, value in ours.items() if theirs.get(key) != value]
    if not differ and len(theirs) == len(ours):
        return ""
    if differ == [CORPUS_KEY]:
        return (
            "this producer's corpus differs from the stager's (item ids, texts, speakers, "
            "languages or audio paths relative to data.path, in file order): every host "
            "needs the same metadata and audio files (docs/scaling-out.md#what-a-remote-host-needs)"
        )
    shown = ", ".join(differ[:MAX_KEYS_SHOWN])
    more = f" and {len(differ) - MAX_KEYS_SHOWN} more" if len(differ) > MAX_KEYS_SHOWN else ""
    extra = "" if differ else f"{len(theirs) - len(ours)} keys this stager does not have"
    return (
        f"this producer's config differs from the stager's in {shown}{more}{extra}: "
        "start it with the same config file (these keys shape every sample)"
    )
