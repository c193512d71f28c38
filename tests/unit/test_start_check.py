"""A configured field that would fail every clip is refused at start (issue 31), not by
quarantining the corpus: the user's function on the first clip that reads, through the
producers' own pipeline, by `ringfeed validate` (exit 2, one line naming the field and
both shapes, or the exception, and what to change) and by each producer's warm-up; a
function that fails on some other clip passes (that clip alone costs itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.producer.pipeline import SamplePipeline, fields_problem
from ringfeed.producer.start_check import FieldsRefused
from ringfeed.scripts.cli import build_parser
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import open_corpus
from tests.support import user_fields
from tests.support.configs import write_config
from tests.support.paths import MINI

# LJ001-0001 is 9.66 s, longer than max_frames=800 at 22,050 Hz: skipped at its audio,
# so the first clip that reads is the second.
FIRST_READ = "LJ001-0002"


def config(tmp_path: Path, function: str, **features: object) -> Path:
    return write_config(
        tmp_path,
        {
            "data": {"path": str(MINI)},
            "features": {
                "cache_dir": str(tmp_path / "cache"),
                "user_version": "v1",
                "user_function": f"tests.support.user_fields:{function}",
                "user_fields": user_fields.FIELDS,
                **features,
            },
        },
    )


def validate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """`ringfeed validate PATH` in this process: its exit code and its error lines."""
    args = build_parser().parse_args(["validate", str(path)])
    code = args.fn(args)
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith("config error")]


@pytest.mark.parametrize(
    ("function", "needles"),
    [
        (
            "wrong_shape",
            [
                "features.user_function tests.support.user_fields:wrong_shape: field "
                "'emotion' has shape (3,), declared (2,)",
                "return what features.user_fields declares",
            ],
        ),
        ("by_key", ["raised TypeError", "use entry.item_id, not entry['item_id']"]),
        ("too_loud", ["loudness values 32768.0..32768.0", "scale them"]),
    ],
)
def test_validate_refuses_a_field_that_fails_the_first_clip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], function: str, needles: list[str]
) -> None:
    code, errors = validate(config(tmp_path, function), capsys)
    assert code == 2
    assert len(errors) == 1, errors  # one line, whatever the function said
    for needle in [
        *needles,
        f"on {FIRST_READ}, the first clip that reads",
        "change features.user_version",
    ]:
        assert needle in errors[0], errors[0]


def test_each_producer_refuses_in_its_warm_up(tmp_path: Path) -> None:
    cfg = load_config(config(tmp_path, "wrong_shape"))
    with pytest.raises(FieldsRefused, match=r"field 'emotion' has shape \(3,\), declared"):
        SamplePipeline(cfg, index=open_corpus(cfg)).warm_up()


def test_a_function_that_fails_on_other_clips_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fussy() fails on two later clips: those cost themselves, the run starts."""
    cfg = load_config(config(tmp_path, "fussy"))
    assert fields_problem(cfg, open_corpus(cfg)) == ""
    SamplePipeline(cfg, index=open_corpus(cfg)).warm_up()
    code, errors = validate(config(tmp_path, "fields"), capsys)
    assert (code, errors) == (0, [])


def test_a_durations_dir_that_is_not_there_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, errors = validate(config(tmp_path, "fields", durations_dir=str(tmp_path / "no")), capsys)
    assert code == 2 and len(errors) == 1, errors
    assert "features.durations_dir=" in errors[0] and "is not a directory" in errors[0]
