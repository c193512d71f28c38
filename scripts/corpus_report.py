"""What `ringfeed validate` says about a corpus: speakers, languages, clips and hours.

Reads the dataset index as the stager will (shared/dataset.py) and the audio
headers (never decodes): a segment's hours are its duration, a whole file's
its header's. Costs one stat and one header read per clip.
"""

from __future__ import annotations

import collections

import soundfile as sf

from shared.config import Config
from shared.dataset import DatasetEntry, dataset_index
from shared.id_tables import corpus_tables

# Speakers listed by name at most; the rest are counted.
MAX_SPEAKERS_SHOWN = 12
# Texts normalized to check the vocabulary, evenly spread over the corpus.
VOCAB_SAMPLE = 500


def clip_seconds(entry: DatasetEntry) -> float:
    """The clip's duration from its entry or its file's header; 0.0 if unreadable."""
    if entry.duration_s:
        return entry.duration_s
    try:
        info = sf.info(entry.audio_path)
    except (sf.LibsndfileError, RuntimeError):
        return 0.0
    return max(0.0, info.frames / info.samplerate - entry.offset_s) if info.samplerate else 0.0


def corpus_report(cfg: Config) -> list[str]:
    """Lines for validate: the id tables as the stager would build them on a fresh run,
    and clips and hours per language."""
    index = dataset_index(cfg)
    tables = corpus_tables(cfg, index)
    clips: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    per_speaker: collections.Counter[str] = collections.Counter()
    for entry in index.entries:
        clips[entry.language] += 1
        seconds[entry.language] += clip_seconds(entry)
        per_speaker[entry.speaker] += 1
    lines = [f"  corpus        {index.n_items} clips, {len(index.bad_lines)} bad entries"]
    names = [f"{n or '(unnamed)'} ({per_speaker[n]})" for n in tables.speakers]
    more = len(names) - MAX_SPEAKERS_SHOWN
    shown = ", ".join(names[:MAX_SPEAKERS_SHOWN]) + (f" and {more} more" if more > 0 else "")
    lines.append(f"  speakers      {len(tables.speakers)} (id order): {shown}")
    codes = ", ".join(tables.languages)
    lines.append(f"  languages     {len(tables.languages)} (id order): {codes}")
    for language in tables.languages:
        hours = seconds[language] / 3600
        lines.append(f"    {language:10s} {clips[language]:8d} clips {hours:9.3f} h")
    alphabet = cfg.text.alphabet
    lines.append(f"  vocabulary    {cfg.vocab_size} ids: pad, unknown, end and {len(alphabet)} "
                 f"{cfg.text.tokens} (text.alphabet) {alphabet!r}")  # fmt: skip
    return lines + vocabulary_check(cfg, index.entries)


def vocabulary_check(cfg: Config, entries: tuple[DatasetEntry, ...]) -> list[str]:
    """A line saying whether a sample of the corpus's texts, normalized as the producers
    will, has characters outside text.alphabet (those tokens would be 'unknown')."""
    from producer.text import TextEncoder  # the producers' own normalizer

    step = max(1, len(entries) // VOCAB_SAMPLE)
    sample = entries[::step]
    encoder = TextEncoder(cfg)
    known = set(cfg.text.alphabet)
    missing: collections.Counter[str] = collections.Counter()
    texts = 0
    try:
        for entry in sample:
            outside = set(encoder.clean(entry.text, entry.language)) - known
            texts += bool(outside)
            missing.update(outside)
    finally:
        encoder.close()
    if not missing:
        return [f"    all characters of {len(sample)} sampled texts are in text.alphabet"]
    chars = "".join(sorted(missing))
    return [
        f"    {texts} of {len(sample)} sampled texts have characters outside "
        f"text.alphabet: {chars!r} (`ringfeed vocab CONFIG` builds it from the corpus)"
    ]
