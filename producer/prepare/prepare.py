"""`ringfeed prepare CONFIG`: everything a run reads about its corpus, written once.

The steps, in order, each skipped when what it wrote is current (a changed corpus or
setting makes it stale, and only what changed is done again):

    index       the corpus index (shared/corpus/build.py; a process per core for a large
                metadata file) with the id tables in its header: speakers and
                languages, sorted (shared/run/id_tables.py corpus_tables)
    lengths     the length table and the vocabulary, by one text and header pass
                (producer/prepare/lengths.py, a process per core), when a run reads
                lengths: length buckets, or data.outliers' speaking-rate band (a corpus
                on object storage: buckets only, as the pass fetches every clip's header
                from the store; `ringfeed lengths CONFIG` measures it anyway)
    prosody     the per-speaker prosody statistics, when features.pitch_norm applies
                them (producer/prepare/prosody_pass.py, a process per core)
    bands       each language's speaking-rate band, from the length table
                (shared/corpus/speaking_rate.py): said here; the stager and validate
                take them from the same table by the same function, so no band outlives
                a change of its rule

All of it lives beside the feature cache (features.cache_dir), or in memory when that
disk is full (shared/corpus/memory_copies.py); the passes show progress and resume
after an interruption. `ringfeed run` and `ringfeed validate` prepare first; the
processes of a run only read (shared/corpus/open.py open_prepared) and say what to run
when something is missing. `ringfeed index`, `lengths`, `vocab` and `stats` run one
step whatever the config asks.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from ringfeed.producer.prepare.lengths import measure_lengths
from ringfeed.producer.prepare.prosody_pass import compute_table
from ringfeed.producer.prepare.vocabulary import (
    Vocabulary,
    keep_vocabulary,
    read_record,
    vocabulary,
    vocabulary_path,
    vocabulary_record,
)
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.lengths import Lengths, load_lengths
from ringfeed.shared.corpus.object_store import is_remote
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.corpus.speaking_rate import RateBand, rate_bands

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """What a run reads about its corpus, as preparation left it: the index (its id
    tables in its header), the length table (None when no run of this config reads it),
    the vocabulary's and the prosody table's files (None when not asked), the bands
    (none without a length table), and one line per step for whoever prints it."""

    index: CorpusIndex
    lengths: Lengths | None = None
    vocabulary: Path | None = None
    prosody: Path | None = None
    bands: dict[str, RateBand] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def say(self, step: str, what: str) -> None:
        self.lines.append(f"  {step:12s}{what}")
        log.info("prepare: %s: %s", step, what)


def reads_lengths(cfg: Config, index: CorpusIndex) -> bool:
    """Does a run of cfg read the length table: length buckets, or the speaking-rate band
    of data.outliers (not for a corpus on object storage: the pass would fetch it)?"""
    if not index.has_audio:
        return cfg.stager.bucketed
    return cfg.stager.bucketed or (cfg.data.outliers != "keep" and not is_remote(cfg.data.path))


def prepare(
    cfg: Config, workers: int = 0, role: str = "head", in_subprocess: bool = True
) -> Prepared:
    """Every step cfg's runs need, each skipped when current (module docstring). role
    "producer": a host that only runs producers (the index, and the prosody table they
    apply). workers: processes of the passes (0: one per core); in_subprocess: the index
    built in a child process (its memory not kept here). Raises CorpusError, ConfigError."""
    t0 = time.monotonic()
    index = open_corpus(cfg, in_subprocess)
    done = Prepared(index)
    done.say(
        "index",
        f"{index.location}: {index.n_items} items, {len(index.bad_lines)} "
        f"unusable lines, {len(index.speakers)} speakers, {len(index.languages)} "
        f"languages (the id tables), digest {index.digest[:16]}",
    )
    if role == "head" and reads_lengths(cfg, index):
        lengths_step(cfg, index, done, workers)
    elif role == "head":
        done.say(
            "lengths",
            "not read by a run of this config (no length buckets, "
            "data.outliers: keep, or a corpus on object storage)",
        )
    if cfg.features.pitch_norm != "none":
        done.prosody, table = compute_table(cfg, index, workers)
        done.say(
            "prosody",
            f"{done.prosody}: {len(table['speakers'])} speakers, {table['skipped']} clips skipped",
        )
    log.info("prepare: done in %.1f s", time.monotonic() - t0)
    return done


def lengths_step(cfg: Config, index: CorpusIndex, done: Prepared, workers: int = 0) -> None:
    """The length table and, with it, the vocabulary (when either is not current), and
    the bands the table gives."""
    stale = int(load_lengths(cfg, index)[1].sum())
    count = index.has_audio and read_record(cfg, index.digest) is None
    lengths, tally, where = measure_lengths(cfg, index, count, workers)
    done.lengths = lengths
    said = f"measured {stale}, {index.n_items - stale} current" if stale else "current"
    done.say("lengths", f"{where}: {index.n_items} items, {said}")
    if tally is not None:
        done.vocabulary = keep_vocabulary(cfg, index.digest, vocabulary_record(cfg, index, tally))
        done.say(
            "vocabulary",
            f"{done.vocabulary}: {len(tally.chars)} characters of "
            f"{tally.texts} texts, {len(tally.failed)} not cleaned",
        )
    elif index.has_audio:
        done.vocabulary = vocabulary_path(cfg, index.digest)
        done.say("vocabulary", f"{done.vocabulary}: current")
    if cfg.data.outliers != "keep" and index.has_audio:
        done.bands = rate_bands(cfg, index, lengths)
        bands = ", ".join(f"{b.language} {b.low:.1f}..{b.high:.1f}" for b in done.bands.values())
        done.say("bands", f"tokens/s: {bands or 'none (fewer than 10 clips a language)'}")


def corpus_vocabulary(cfg: Config, min_count: int = 1, workers: int = 0) -> Vocabulary:
    """The corpus's vocabulary (`ringfeed vocab`): read when current, else counted by the
    text pass (which measures what the length table lacks on the way) and kept."""
    index = open_corpus(cfg)
    record = read_record(cfg, index.digest)
    if record is None:
        _, tally, _ = measure_lengths(cfg, index, True, workers)
        assert tally is not None
        record = vocabulary_record(cfg, index, tally)
        keep_vocabulary(cfg, index.digest, record)
    return vocabulary(record, min_count)
