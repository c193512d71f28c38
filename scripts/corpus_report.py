"""What `ringfeed validate` says about a corpus: speakers, languages, clips and hours,
and how many clips each of the producers' rules will skip.

Reads the corpus index as the stager will (shared/corpus/index.py) and the audio
headers by read_clip (shared/corpus/clips.py; never decodes): a segment's hours are its
duration, a whole file's its header's. Costs one stat and one header read per clip; a header read
cannot see what only a decode finds (a corrupt body, silence, a clip that
trimming makes too short), so "usable" is an upper bound. Text rules are
judged on an even sample of the texts, normalized as the producers will.
"""

from __future__ import annotations

import collections
import re
import sys
import time
from dataclasses import dataclass

import soundfile as sf

from ringfeed.consumer.stager.plan.balance import balance_lines
from ringfeed.producer.audio.containers import shortfall
from ringfeed.producer.audio.decode import SEGMENT_SLACK_S, read_header
from ringfeed.producer.prepare.prepare import Prepared
from ringfeed.scripts.outlier_report import rate_lines
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.clips import Clip, ClipError, ClipMissing, ClipReader, in_a_store
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.registry import format_of
from ringfeed.shared.run.fingerprint import corpus_digest
from ringfeed.shared.run.id_tables import corpus_tables

# Speakers listed by name at most; the rest are counted.
MAX_SPEAKERS_SHOWN = 12
# Texts normalized to check the vocabulary, evenly spread over the corpus.
VOCAB_SAMPLE = 500


# Formats soundfile may not read whose files a producer still decodes (librosa).
FALLBACK_EXTENSIONS = (".mp3", ".m4a", ".ogg", ".opus")
# Bytes of a tar member read for its header (wav and flac headers fit many times over).
HEADER_BYTES = 65536
# validate prints progress on stderr while reading headers takes longer than this.
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class Rule:
    """One reason a producer skips a clip, and what changes it."""

    name: str
    fix: str


def audio_rules(cfg: Config) -> dict[str, Rule]:
    a, f = cfg.audio, cfg.features
    slot_s = cfg.max_samples / a.sample_rate
    return {
        "missing": Rule("audio file not found", "fix data.path or the metadata's file names"),
        "empty": Rule("zero-byte audio file", "replace or remove these files"),
        "unreadable": Rule("header unreadable", "convert them to wav or flac"),
        "truncated": Rule(
            "shorter than its header says (a copy cut short?)", "copy these files again"
        ),
        "too_long": Rule(
            f"longer than a slot ({slot_s:.2f} s)",
            f"raise features.max_frames (now {f.max_frames}) or set features.on_too_long: truncate",
        ),
        "too_long_file": Rule(
            f"longer than audio.max_duration_s={a.max_duration_s} s",
            "raise audio.max_duration_s",
        ),
        "too_short": Rule(
            f"shorter than audio.min_duration_s={a.min_duration_s} s",
            "lower audio.min_duration_s",
        ),
        "past_end": Rule(
            "segment runs past its file's end", "fix its offset and duration in the manifest"
        ),
        "remote": Rule(
            "on object storage, not checked", "their headers are read when a producer reads them"
        ),
    }


def audio_verdict(entry: Entry, cfg: Config, clips: ClipReader) -> tuple[str, float, int]:
    """(the rule that skips the clip, "" if none, "remote" if not checked; its seconds,
    0.0 if unknown; its channels, 0 if unknown) from its header (HEADER_BYTES of a member:
    never the whole clip), as producer/audio/decode.py judges it. Object storage is not
    read here: validate would fetch the corpus."""
    if in_a_store(entry):
        return "remote", entry.duration_s, 0
    try:
        clip = clips.read_clip(entry, head=HEADER_BYTES)
    except ClipMissing:
        return "missing", 0.0, 0
    except ClipError:
        return "unreadable", 0.0, 0
    with clip:
        return _verdict(entry, cfg, clip)


def _verdict(entry: Entry, cfg: Config, clip: Clip) -> tuple[str, float, int]:
    if clip.size == 0:
        return "empty", 0.0, 0
    try:
        info = read_header(clip)
    except (OSError, sf.LibsndfileError, RuntimeError):
        if entry.audio_path.lower().endswith(FALLBACK_EXTENSIONS):
            return "", entry.duration_s, 0  # another decoder may read it: decode decides
        return "unreadable", 0.0, 0
    if info.samplerate <= 0:
        return "unreadable", 0.0, 0
    if shortfall(clip.read_at, clip.size) is not None:  # as the producers check it
        return "truncated", 0.0, info.channels
    file_s = info.frames / info.samplerate
    # As the producers judge it (producer/audio/decode.py check_duration): a segment that starts
    # past the end, or ends more than SEGMENT_SLACK_S after it.
    end_s = entry.offset_s + entry.duration_s if entry.duration_s else entry.offset_s
    if (entry.offset_s and entry.offset_s >= file_s) or end_s > file_s + SEGMENT_SLACK_S:
        return "past_end", 0.0, info.channels
    seconds = max(0.0, info.frames / info.samplerate - entry.offset_s)
    if entry.duration_s:
        seconds = min(seconds, entry.duration_s)
    a, f = cfg.audio, cfg.features
    if seconds > a.max_duration_s:
        return "too_long_file", seconds, info.channels
    slot_s = cfg.max_samples / a.sample_rate
    if f.on_too_long == "skip" and not a.trim_silence and seconds > slot_s + 1 / a.sample_rate:
        return "too_long", seconds, info.channels
    if seconds < a.min_duration_s:
        return "too_short", seconds, info.channels
    return "", seconds, info.channels


@dataclass(frozen=True)
class CorpusReport:
    """lines for validate; usable: clips no header rule skips (an upper bound)."""

    lines: list[str]
    usable: int
    n_items: int
    missing: int = 0  # clips whose audio file is not on this host


def corpus_report(cfg: Config, prepared: Prepared) -> list[str]:
    return corpus_check(cfg, prepared).lines


@dataclass
class HeaderTally:
    """What every clip's header says, counted: clips and seconds per language, clips per
    speaker, clips per skip rule ("" none), clips of more than one channel, and the
    items no header rule skips."""

    clips: collections.Counter[str]
    seconds: collections.Counter[str]
    per_speaker: collections.Counter[str]
    skips: collections.Counter[str]
    multichannel: int
    clean: set[int]


def read_headers(cfg: Config, index: CorpusIndex) -> HeaderTally:
    """Every clip's header once (audio_verdict), with progress on stderr past
    PROGRESS_EVERY_S."""
    c = collections.Counter
    tally = HeaderTally(c(), c(), c(), c(), 0, set())
    started = shown = time.monotonic()
    clips = ClipReader(cfg)
    for i, entry in enumerate(index.entries):
        rule, clip_s, channels = audio_verdict(entry, cfg, clips)
        tally.skips[rule] += 1
        if rule in ("", "remote"):
            tally.clean.add(i)
        tally.multichannel += channels > 1
        tally.clips[entry.language] += 1
        tally.seconds[entry.language] += clip_s
        tally.per_speaker[entry.speaker] += 1
        if time.monotonic() - shown > PROGRESS_EVERY_S:
            shown = time.monotonic()
            rate = (i + 1) / (shown - started)
            print(
                f"validate: read {i + 1} of {index.n_items} audio headers ({rate:.0f}/s)",
                file=sys.stderr,
            )
    return tally


def corpus_check(cfg: Config, prepared: Prepared) -> CorpusReport:
    """validate's corpus section, from what preparation wrote (producer/prepare/prepare.py):
    the id tables as the stager would settle them on a fresh run, clips and hours per
    language, the clips each skip rule will cost, and each language's speaking-rate band
    with the clips outside it."""
    index = prepared.index
    tables = corpus_tables(cfg, index)
    tally = read_headers(cfg, index)
    lines = [f"  corpus        {index.n_items} clips, {len(index.bad_lines)} bad entries"]
    splits = format_of(cfg).splits(cfg)  # a folder of splits: which one the run reads
    if splits is not None and splits.named:
        lines.append(f"  splits        {splits.describe()}")
    same = "`ringfeed validate CONFIG --role producer` on a producer host must print the same"
    lines.append(f"  corpus digest {corpus_digest(cfg, index)} ({same})")
    names = [f"{n or '(unnamed)'} ({tally.per_speaker[n]})" for n in tables.speakers]
    more = len(names) - MAX_SPEAKERS_SHOWN
    shown = ", ".join(names[:MAX_SPEAKERS_SHOWN]) + (f" and {more} more" if more > 0 else "")
    lines.append(f"  speakers      {len(tables.speakers)} (id order): {shown}")
    codes = ", ".join(tables.languages)
    lines.append(f"  languages     {len(tables.languages)} (id order): {codes}")
    for language in tables.languages:
        hours = tally.seconds[language] / 3600
        lines.append(f"    {language:10s} {tally.clips[language]:8d} clips {hours:9.3f} h")
    skips = tally.skips
    rate, outside = rate_lines(cfg, index, tally.clean, prepared.lengths)
    usable = skips.pop("", 0) + skips.get("remote", 0) - outside  # unchecked: counted usable
    lines.append(
        f"  usable        {usable} of {index.n_items} clips by their audio headers "
        "and speaking rates"
    )
    rules = audio_rules(cfg)
    for rule, n in skips.most_common():
        verb = "note" if rule == "remote" else "skip"
        lines.append(f"    {verb} {n:8d} {rules[rule].name}: {rules[rule].fix}")
    if tally.multichannel:
        lines.append(
            f"    {tally.multichannel} clips have more than one channel (mixed down to mono)"
        )
    lines += rate + balance_lines(cfg, index, tables)
    alphabet = cfg.text.alphabet
    lines.append(
        f"  vocabulary    {cfg.vocab_size} ids: pad, unknown, end and {len(alphabet)} "
        f"{cfg.text.tokens} (text.alphabet) {alphabet!r}"
    )
    lines += vocabulary_check(cfg, index.entries)
    return CorpusReport(lines, usable, index.n_items, skips.get("missing", 0))


def vocabulary_check(cfg: Config, entries: tuple[Entry, ...]) -> list[str]:
    """Lines saying how many of a sample of the corpus's texts the producers' text rules
    skip (and why), then whether the sample, normalized as the producers will, has
    characters outside text.alphabet (those tokens would be 'unknown')."""
    from ringfeed.producer.sample import SkipSample
    from ringfeed.producer.text.encoder import TextEncoder  # the producers' own normalizer

    step = max(1, len(entries) // VOCAB_SAMPLE)
    sample = entries[::step]
    encoder = TextEncoder(cfg)
    known = set(cfg.text.alphabet)
    missing: collections.Counter[str] = collections.Counter()
    skipped: collections.Counter[str] = collections.Counter()
    example: dict[str, str] = {}  # a reason of each kind, with its numbers
    texts = 0
    try:
        for entry in sample:
            try:
                encoder.encode(entry.text, entry.audio_path, entry.language)
            except SkipSample as skip:
                kind = re.sub(r"'[^']*'|\d+(\.\d+)?", "_", skip.reason)
                skipped[kind] += 1
                example.setdefault(kind, skip.reason)
            try:
                outside = set(encoder.clean(entry.text, entry.language)) - known
            except Exception:  # noqa: BLE001 - counted above as "cannot be cleaned"
                continue
            texts += bool(outside)
            missing.update(outside)
    finally:
        encoder.close()
    lines = [
        f"    text: {n} of {len(sample)} sampled texts skipped, e.g. {example[kind]}"
        for kind, n in skipped.most_common()
    ]
    if not missing:
        return lines + [f"    all characters of {len(sample)} sampled texts are in text.alphabet"]
    chars = "".join(sorted(missing))
    return lines + [
        f"    {texts} of {len(sample)} sampled texts have characters outside "
        f"text.alphabet: {chars!r} (`ringfeed vocab CONFIG` builds it from the corpus)"
    ]
