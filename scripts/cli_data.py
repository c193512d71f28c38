"""The `ringfeed` verbs that look at a config and its corpus without starting a run:
prepare (and its steps alone: index, lengths, stats, vocab), validate (its producer-host
role too), text and config, and quarantine (a run's quarantine, listed or cleared).
Thin, as scripts/cli.py is: each calls the module that does the work."""

from __future__ import annotations

import argparse
import collections
import re
import signal
import sys
import time
from collections.abc import Callable

import numpy as np


def _config(path: str):
    from ringfeed.shared.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)


def _print_schema(cfg) -> None:
    """The declared sample schema, bytes per slot and per batch (docs/sample-fields.md)."""
    mib = 2**20
    print("  sample schema (docs/sample-fields.md):")
    for line in cfg.schema.describe():
        print(f"    {line}")
    fixed = cfg.batch_fields()
    per_batch = sum(int(np.prod(s)) * d.itemsize for s, d in fixed.values())
    print(
        f"  batch of {cfg.stager.batch_size} at the fixed shape: {per_batch / mib:.3f} MiB, "
        f"{per_batch // cfg.stager.batch_size:,} B per sample"
    )


def cmd_validate(args: argparse.Namespace, quiet: bool = False) -> int:
    """Check what can be checked without starting a run; exit 2 on a fatal finding."""
    from ringfeed.scripts.preflight import preflight
    from ringfeed.shared.corpus.registry import format_of
    from ringfeed.shared.memory.ring import rings_bytes, slot_bytes
    from ringfeed.shared.memory.shm import free_shm_bytes

    cfg = _config(args.config)
    role = getattr(args, "role", "head")
    if cfg.text.tokens == "phonemes":  # before preparation, whose text pass phonemizes
        from ringfeed.producer.text.phonemes import espeak_problem

        if problem := espeak_problem():
            print(
                f"config error: text.tokens: phonemes needs espeak-ng: {problem}", file=sys.stderr
            )
            return 2
    prepared = prepared_or_exit(cfg, getattr(args, "workers", 0), role)
    findings = preflight(cfg, role)
    for finding in findings:
        print(
            f"{'config error' if finding.fatal else 'warning'}: {finding.message}", file=sys.stderr
        )
    if any(f.fatal for f in findings):
        return 2
    if quiet:
        return 0
    if role == "producer":
        return _validate_producer_host(args.config, cfg, prepared)
    mib = 2**20
    print(f"{args.config}: the config is valid; what it makes:")
    _print_schema(cfg)
    sample, batch = slot_bytes(cfg.sample_fields()), slot_bytes(cfg.batch_ring_fields())
    ahead, held = cfg.lookahead_batches, cfg.stager.batch_slots
    print(
        f"  batch slot    {batch / mib:8.3f} MiB x {cfg.batch_ring_slots} slots "
        f"({ahead} filled ahead, {held} for the consumer, 1 to move a batch)"
    )
    print(f"  spare place   {sample / mib:8.3f} MiB x {cfg.spare_slots}")
    print(
        f"  rings total   {rings_bytes(cfg) / mib:8.1f} MiB "
        f"(/dev/shm free: {free_shm_bytes() / mib:.0f} MiB)"
    )
    print("  prepared (`ringfeed prepare`):")
    print("\n".join(prepared.lines))
    return _validate_corpus(args, cfg, prepared) if format_of(cfg).has_audio else 0


def prepared_or_exit(cfg, workers: int = 0, role: str = "head", in_subprocess: bool = True):
    """What `ringfeed run` and `validate` run first: the corpus prepared
    (producer/prepare/prepare.py), each step skipped when current; an error is one line
    and exit code 2, an interruption exit code 130 (SIGINT) or 143 (SIGTERM), what was
    done kept. in_subprocess: the index built in a child (a launcher that lives on keeps
    none of its memory)."""
    from ringfeed.producer.prepare.prepare import prepare
    from ringfeed.shared.config import ConfigError
    from ringfeed.shared.corpus.entry import CorpusError
    from ringfeed.shared.run.process import Interrupted, interrupted_by_stop_signals

    try:
        with interrupted_by_stop_signals():
            return prepare(cfg, workers, role, in_subprocess)
    except (CorpusError, ConfigError, OSError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as exc:
        print("prepare: interrupted; what was done is kept: run it again to go on", file=sys.stderr)
        sys.exit(128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT))


def _validate_corpus(args: argparse.Namespace, cfg, prepared) -> int:
    """validate's corpus section (the STFT the producers will run; with --deep, every clip
    decoded); 2 if no clip is usable."""
    from ringfeed.producer.features.fft import fastest
    from ringfeed.scripts.corpus_report import corpus_check

    if cfg.features.device == "producer":  # the library this host's producers will use
        name, _ = fastest(cfg.features.n_fft, cfg.features.cache_dir)
        print(f"  STFT          float64, FFT by {name} here")
    report = corpus_check(cfg, prepared)
    print("\n".join(report.lines))
    if getattr(args, "deep", False):
        from ringfeed.scripts.outlier_report import deep_lines

        print("\n".join(deep_lines(cfg, args.workers)))
    if report.usable == 0:
        print(
            f"config error: none of the {report.n_items} clips is usable (the skip "
            "lines above say which key changes each rule)",
            file=sys.stderr,
        )
        return 2
    return 0


def _validate_producer_host(path: str, cfg, prepared) -> int:
    """What a producer host needs to know: whether it holds every file of the corpus
    (one it lacks would be quarantined for the whole run, though the head has it), and
    the corpus digest, which the head's `ringfeed validate CONFIG` prints too."""
    from ringfeed.scripts.corpus_report import corpus_check

    report = corpus_check(cfg, prepared)
    print(f"{path}: checked for a producer host")
    print("\n".join(report.lines))
    if report.missing:
        print(
            f"config error: this host lacks {report.missing} of the corpus's "
            f"{report.n_items} audio files: copy them here (a producer would have each "
            "one quarantined for the run)",
            file=sys.stderr,
        )
        return 2
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    """Everything a run reads about the corpus, written once (producer/prepare/prepare.py)."""
    cfg = _config(args.config)
    t0 = time.monotonic()
    prepared = prepared_or_exit(cfg, args.workers, in_subprocess=False)  # its own process
    print(f"{args.config}: prepared in {time.monotonic() - t0:.1f} s")
    print("\n".join(prepared.lines))
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    """The index step of preparation alone: built if missing or stale, and described."""
    from ringfeed.shared.corpus.entry import CorpusError
    from ringfeed.shared.corpus.open import open_corpus

    cfg = _config(args.config)
    t0 = time.monotonic()
    try:
        index = open_corpus(cfg, in_subprocess=False)
    except (CorpusError, OSError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{index.location}: {index.n_items} items, {len(index.bad_lines)} unusable lines, "
        f"digest {index.digest}, {time.monotonic() - t0:.2f} s"
    )
    return 0


def cmd_lengths(args: argparse.Namespace) -> int:
    """The lengths step of preparation alone, whatever the config reads (a corpus on
    object storage: it fetches every clip's header)."""
    from ringfeed.producer.prepare.lengths import measure_lengths
    from ringfeed.shared.corpus.entry import CorpusError
    from ringfeed.shared.corpus.open import open_corpus

    cfg = _config(args.config)
    try:
        index = open_corpus(cfg)
        lengths, _, where = measure_lengths(cfg, index)
    except CorpusError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    known = lengths.frames[lengths.frames >= 0]
    spread = f"{known.min()}..{known.max()} frames" if known.size else "no readable headers"
    print(f"{where}: {len(lengths.frames)} items, {spread}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """The prosody step of preparation alone (producer/prepare/prosody_pass.py)."""
    from ringfeed.producer.prepare.prosody_pass import compute_table
    from ringfeed.shared.corpus.entry import CorpusError
    from ringfeed.shared.corpus.open import open_corpus

    cfg = _config(args.config)
    try:
        path, table = compute_table(cfg, open_corpus(cfg), args.workers)
    except CorpusError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: {len(table['speakers'])} speakers, {table['skipped']} clips skipped")
    head = ("speaker", "clips", "log-f0 mean", "std", "energy mean", "std")
    print("{:<24} {:>6} {:>12} {:>7} {:>12} {:>9}".format(*head))
    for name, s in [*table["speakers"].items(), ("(all)", table["global"])]:
        print(
            f"{name[:24]:<24} {s['clips']:>6} {s['log_f0_mean']:>12.4f} {s['log_f0_std']:>7.4f} "
            f"{s['energy_mean']:>12.3f} {s['energy_std']:>9.3f}"
        )
    return 0


def cmd_vocab(args: argparse.Namespace) -> int:
    """The corpus's token vocabulary as a text.alphabet line (producer/prepare/vocabulary.py),
    counted by the text pass of preparation when it is not current."""
    import yaml

    from ringfeed.producer.prepare.prepare import corpus_vocabulary
    from ringfeed.shared.corpus.entry import CorpusError

    cfg = _config(args.config)
    try:
        vocab = corpus_vocabulary(cfg, args.min_count)
    except CorpusError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    for char, n, item in vocab.rare:
        print(f"rare: {char!r} (U+{ord(char):04X}) {n} times, e.g. in {item}", file=sys.stderr)
    for item, reason in vocab.failed:
        print(f"not cleaned (the producers skip it): {item}: {reason}", file=sys.stderr)
    print(f"# {len(vocab.alphabet)} {cfg.text.tokens} from {vocab.texts} texts; in {args.config}:")
    print(yaml.safe_dump({"text": {"alphabet": vocab.alphabet}}, allow_unicode=True), end="")
    return 0


def cmd_text(args: argparse.Namespace) -> int:
    """What the producers make of a text: its language, normalized form and tokens."""
    from ringfeed.producer.sample import SkipSample
    from ringfeed.producer.text.encoder import TextEncoder
    from ringfeed.producer.text.normalize import has_number_rules
    from ringfeed.shared.config import replace

    cfg = replace(_config(args.config), features={"cache": False})  # a preview writes nothing
    language, why = args.language, "--language"
    if not language:
        language, why = cfg.data.language, "data.language"
        if language == "auto":
            from ringfeed.shared.language.detect import detector

            language, why = detector(cfg.data.detect_languages).detect(args.text), "detected"
    print(f"language   {language} ({why})")
    if not has_number_rules(language):
        print(
            f"numbers    kept as digits: {language!r} has no number rules here (a typo of "
            "a code? see producer/text/normalize.py LANGUAGES, NUM2WORDS_CHECKED)"
        )
    encoder = TextEncoder(cfg)
    try:
        cleaned = encoder.clean(args.text, language)
        ids, truncated = encoder.encode(args.text, "", language)
    except SkipSample as skip:
        print(f"skipped    the producers skip this text: {skip.reason}")
        return 1
    finally:
        encoder.close()
    print(f"{cfg.text.tokens:10s} {cleaned!r}")
    print(
        f"tokens     {len(ids)} of text.max_text_len={cfg.text.max_text_len}"
        + (" (cut: features.on_too_long: truncate)" if truncated else "")
    )
    print(f"ids        {' '.join(map(str, ids.tolist()))}")
    print(f"read back  {encoder.decode(ids)!r} (0 pad, 1 unknown, 2 end of text)")
    return 0


# Lines shown of each group of `ringfeed quarantine`.
QUARANTINE_EXAMPLES = 3


def cmd_quarantine(args: argparse.Namespace) -> int:
    """A run's quarantine by stage and cause, each with today's cause and whether the
    run's next start tries its items again; --clear STAGE removes that stage's lines."""
    from ringfeed.consumer.stager.quarantine import (
        QuarantineBusy,
        clear_stage,
        latest,
        read_quarantine,
    )
    from ringfeed.producer.causes import stage_causes
    from ringfeed.shared.config.environment import run_dir

    cfg = _config(args.config)
    path = run_dir(cfg, args.run_id) / "quarantine.jsonl"
    if not path.parent.is_dir():
        print(
            f"config error: no run {args.run_id!r} in run_root={cfg.run_root}: give the "
            "run id `ringfeed run` printed, with the run's config",
            file=sys.stderr,
        )
        return 2
    if args.clear:
        try:
            n = clear_stage(path, args.clear)
        except QuarantineBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(
            f"{path}: removed {n} lines of stage {args.clear!r}; the run's next start "
            "tries those items again"
        )
        return 0
    _print_quarantine(path, latest(read_quarantine(path)), stage_causes(cfg))
    return 0


def _print_quarantine(path, records: list[dict], causes: dict[str, str]) -> None:
    """Groups of (stage, cause), largest first: count, what the next start does, examples."""
    from ringfeed.consumer.stager.quarantine import stale

    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for r in records:
        groups[(r["stage"], r.get("cause", ""))].append(r)
    items = sum(r["stage"] != "metadata" for r in records)
    print(f"{path}: {items} items quarantined, {len(records) - items} metadata lines")
    for (stage, cause), group in sorted(groups.items(), key=lambda g: -len(g[1])):
        if stage == "metadata":
            then = "found again at every start: fix those lines of the metadata"
        elif stage not in causes:
            then = f"no cause to change: skipped for the run (--clear {stage} retries them)"
        elif stale(group[0], causes):
            then = f"today's cause is {causes[stage]!r}: the next start retries them"
        else:
            then = f"still today's cause: skipped for the run (--clear {stage} retries them)"
        print(f"  {stage}: {len(group)}, cause {repr(cause) if cause else 'none recorded'}")
        print(f"    {then}")
        for r in group[:QUARANTINE_EXAMPLES]:
            print(f"    e.g. {r['item_id'] or r['path']}: {str(r.get('reason', ''))[:160]}")


def cmd_config(args: argparse.Namespace) -> int:
    """Every config key with its type, default and meaning (docs/config-reference.md)."""
    from ringfeed.shared.config.reference import REFERENCE, reference_markdown

    text = reference_markdown()
    if args.write:
        REFERENCE.parent.mkdir(exist_ok=True)
        REFERENCE.write_text(text)
        print(f"wrote {REFERENCE}")
    else:
        print(text, end="")
    return 0


def run_id_arg(value: str) -> str:
    """A run id names a directory under run_root and a socket: no path of its own."""
    if value and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value):
        raise argparse.ArgumentTypeError(
            f"{value!r}: a run id is up to 100 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (it names the run's directory under run_root)"
        )
    return value


def add_data_verbs(verb: Callable[[str, Callable], argparse.ArgumentParser]) -> None:
    """The verbs of scripts/cli_data.py: each needs a config; quarantine a run id too."""
    validate = verb("validate", cmd_validate)
    validate.add_argument("config")
    validate.add_argument(
        "--role",
        choices=("head", "producer"),
        default="head",
        help="producer: check a host that only runs `ringfeed producers --connect`",
    )
    validate.add_argument(
        "--deep",
        action="store_true",
        help="decode every clip (in parallel) for what headers cannot show",
    )
    validate.add_argument(
        "--workers", type=int, default=0, help="--deep's processes (default: one per core)"
    )
    prepare = verb("prepare", cmd_prepare)
    prepare.add_argument("config")
    prepare.add_argument(
        "--workers", type=int, default=0, help="processes of its passes (default: one per core)"
    )
    verb("index", cmd_index).add_argument("config")
    verb("lengths", cmd_lengths).add_argument("config")
    stats = verb("stats", cmd_stats)
    stats.add_argument("config")
    stats.add_argument("--workers", type=int, default=0, help="processes (default: one per core)")
    vocab = verb("vocab", cmd_vocab)
    vocab.add_argument("config")
    vocab.add_argument("--min-count", type=int, default=1, help="drop rarer ones")
    config = verb("config", cmd_config)
    config.add_argument("--write", action="store_true", help="(re)write docs/config-reference.md")
    text = verb("text", cmd_text)
    text.add_argument("config")
    text.add_argument("text", help="a transcription, quoted")
    text.add_argument("--language", default="", help="default: data.language (auto: detected)")
    quarantine = verb("quarantine", cmd_quarantine)
    quarantine.add_argument("config")
    quarantine.add_argument("--run-id", required=True, type=run_id_arg)
    quarantine.add_argument(
        "--clear",
        default="",
        metavar="STAGE",
        help="remove that stage's lines (the run stopped): its next start retries them",
    )
