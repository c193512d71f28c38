"""The configured fields tried on a real clip before any grant: a field that would fail
every clip refuses the run at start, instead of quarantining the whole corpus.

Called by every producer's warm-up (SamplePipeline.warm_up, before its first HELLO:
a refusal exits with producer/process/session.py EXIT_REFUSED, which no pool restarts) and by
scripts/preflight.py (`ringfeed validate` exits 2, `ringfeed run` starts nothing).

Which fields, and why those:

- features.user_function: called on the first clip that reads (up to MAX_CLIPS_TRIED
  clips: one whose audio or text fails is not the function's fault), through the
  producers' own pipeline with the feature cache and the other optional built-ins off
  (the function sees the same wave, mel, text and entry a producer gives it). Its
  output is checked against features.user_fields (names, shapes, dtypes) and the
  content check (finite, within +-1e4); an exception it raises refuses too. Issue 31:
  a wrong shape quarantined all 72 items of a corpus, and `validate` exited 0.
- features.durations_dir: a path that is not a directory fails every clip.

The per-sample checks stay (producer/features/extra_fields.py): a function may still fail on
one odd clip, which costs that clip. Built-in fields are not tried: ringfeed computes
them, and the settings that skip many clips (too long, unknown characters) are what
`ringfeed validate`'s corpus report counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ringfeed.producer.sample import SkipSample, StageFailed, error_of, run_stage, stage_of
from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.sample.content import MAX_ABS, content_error

if TYPE_CHECKING:
    from ringfeed.producer.pipeline import SamplePipeline
    from ringfeed.shared.corpus.index import CorpusIndex

# Clips tried for one that reads as far as the user's function; 8 unreadable clips in a
# row at the corpus's start is a corpus problem, which validate's corpus report shows.
MAX_CLIPS_TRIED = 8
# Characters of the exception's message a refusal quotes: one line, whatever it says.
MAX_EXCEPTION_CHARS = 300


class FieldsRefused(ConfigError):
    """A configured field would fail every clip; the message says which and what to change."""


def probe_overrides() -> dict[str, object]:
    """The features keys of the pipeline that tries the user's function: no cache (the
    function must run), no other optional field (not its input; a reference costs a pass
    over the corpus's speakers, durations are checked by durations_problem)."""
    return {
        "cache": False,
        "reference": False,
        "pitch": False,
        "energy": False,
        "durations_dir": "",
    }


def durations_problem(cfg: Config) -> str:
    """'' or why features.durations_dir fails every clip."""
    directory = cfg.features.durations_dir
    if not directory or Path(directory).is_dir():
        return ""
    return (
        f"features.durations_dir={directory!r} is not a directory: every clip would be "
        "quarantined (stage durations); point it at the aligner's <item_id>.durations "
        "files"
    )


def first_clip_problem(probe: SamplePipeline, index: CorpusIndex, cfg: Config) -> str:
    """'' or the one line that refuses the run: features.user_function on the first clip
    that reads, through `probe` (a SamplePipeline of cfg with probe_overrides)."""
    spec = cfg.features.user_function
    for item in range(min(index.n_items, MAX_CLIPS_TRIED)):
        try:
            entry = run_stage("metadata", index.entry, item)
            sample = probe(entry, item)
        except (SkipSample, StageFailed) as exc:  # the function's, or the clip's
            if stage_of(exc) != "user":
                continue  # the clip's audio or text: the next clip's turn
            return _one_line(_refusal(spec, error_of(exc)), entry.item_id)
        users = [d.name for d in cfg.schema.extras if d.origin == "user"]
        why = content_error({name: sample.fields[name] for name in users}, cfg.vocab_size)
        if why:
            return _one_line(
                f"features.user_function {spec}: {why}; return finite values "
                f"within +-{MAX_ABS:g} (scale them)",
                entry.item_id,
            )
        return ""
    return ""


def _refusal(spec: str, exc: BaseException) -> str:
    """What failed and what to change."""
    if isinstance(exc, SkipSample):  # extra_fields.check_user_output: names, shapes, dtypes
        return (
            f"{exc.reason}; return what features.user_fields declares, or declare what it returns"
        )
    fix = "fix the function"
    if isinstance(exc, TypeError) and "tuple indices" in str(exc):
        fix = (
            "entry is a NamedTuple (shared/corpus/entry.py Entry, "
            "docs/sample-fields.md#fields-of-your-own): use entry.item_id, not "
            "entry['item_id']"
        )
    said = str(exc)[:MAX_EXCEPTION_CHARS]
    return f"features.user_function {spec} raised {type(exc).__name__}: {said}; {fix}"


def _one_line(why: str, item_id: str) -> str:
    text = (
        f"{why} (on {item_id}, the first clip that reads: every clip would be "
        "quarantined; change features.user_version with the function)"
    )
    return " ".join(text.split())
