"""Causes, not items, are quarantined (issue 31): each quarantine line records what
decided it (producer/causes.py, sent in every producer's HELLO), a start tries again
the items whose cause changed (old lines without a cause included) and skips the rest,
and `ringfeed quarantine` lists a run's lines by stage and cause and clears a stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import QuarantineWriter, clear_stage, read_quarantine
from ringfeed.producer.causes import stage_causes
from ringfeed.scripts.cli import build_parser
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.config.environment import run_dir
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.bounds import MAX_DIGEST_KEY
from tests.support import user_fields
from tests.support.configs import write_config
from tests.support.paths import MINI

USER = {
    "user_function": "tests.support.user_fields:fields",
    "user_version": "v2",
    "user_fields": user_fields.FIELDS,
}


def test_a_hello_carries_the_producers_causes_within_bounds() -> None:
    causes = stage_causes(replace(Config(), features=USER))
    hello = p.Hello("w0", 7, "host", False, "t", "", {}, causes)
    assert p.decode([bytes(f) for f in p.encode(hello)])[0] == hello
    assert all(len(c) <= MAX_DIGEST_KEY for c in causes.values())
    assert causes["user"].endswith(" tests.support.user_fields:fields v2")
    long = p.encode(p.Hello("w0", 7, "host", False, "t", "", {}, {"user": "x" * 65}))
    with pytest.raises(p.ProtocolError, match="HELLO.causes"):
        p.decode([bytes(f) for f in long])
    said = p.encode(p.Hello("w0", 7, "host", False, "t", "", {}, {"user": "v\x1b\u202e1"}))
    assert p.decode([bytes(f) for f in said])[0].causes == {"user": "v1"}  # no escapes


@pytest.mark.parametrize(
    ("change", "stages"),
    [
        ({"features": {"user_version": "v3"}}, {"user"}),
        ({"text": {"alphabet": "abc "}}, {"text", "durations"}),
        ({"features": {"n_mels": 40}}, {"features", "pitch", "reference", "durations"}),
        (
            {"audio": {"sample_rate": 16000}},
            {"audio", "features", "pitch", "reference", "durations"},
        ),
        ({"features": {"cache_dir": "/elsewhere"}}, set()),  # where, not what
    ],
)
def test_a_stage_cause_changes_with_what_decides_that_stage(change: dict, stages: set[str]) -> None:
    before = stage_causes(replace(Config(), features=USER))
    after = stage_causes(replace(replace(Config(), features=USER), **change))
    whole = {"cache", "check", "write", "lease"} if stages else set()  # all that shapes one
    assert {s for s in before if before[s] != after[s]} == stages | whole
    assert before == stage_causes(replace(Config(), features=USER))  # the same config: same


def lines(tmp_path: Path, cfg: Config) -> tuple[Path, dict[str, str]]:
    """A run's quarantine as a restarted stager finds it: a user line of an earlier
    function, one of today's, a lease line of today, a line of a ringfeed before causes (no
    "cause"), a metadata line. -> (its path, today's causes)."""
    causes = stage_causes(cfg)
    path = run_dir(cfg, "r1") / "quarantine.jsonl"
    with QuarantineWriter(path) as q:
        q.write(
            "LJ001-0004",
            "/w/4.wav",
            "unexpected KeyError in user",
            "user",
            "0badc0de tests.support.user_fields:fussy v1",
        )
        q.write("LJ001-0008", "/w/8.wav", "unexpected KeyError in user", "user", causes["user"])
        q.write("LJ001-0009", "/w/9.wav", "lease expired 3 times", "lease", causes["lease"])
        q.write("", "metadata.csv:17", "expected 3 columns", "metadata")
    old = {
        "item_id": "LJ001-0010",
        "path": "/w/10.wav",
        "reason": "empty audio",
        "stage": "audio",
        "time": 1.0,
    }
    with open(path, "a") as fh:
        fh.write(json.dumps(old) + "\n")
    return path, causes


def test_a_start_retries_the_items_whose_cause_changed(tmp_path: Path) -> None:
    cfg = replace(
        Config(),
        data={"path": str(MINI)},
        run_root=str(tmp_path / "runs"),
        features={**USER, "cache_dir": str(tmp_path / "cache")},
    )
    path, causes = lines(tmp_path, cfg)
    index = open_corpus(cfg)
    with QuarantineWriter(path) as q:
        assert q.by_stage() == {"user": 2, "lease": 1, "audio": 1, "metadata": 1}
        skips, retried = q.settle(index, causes)
        assert q.by_stage() == {"user": 1, "lease": 1, "metadata": 1}  # the retried left
        # Today's user cause and today's lease: skipped without a try, as before.
        assert {index.item_id(k): stage for k, (_, stage) in skips.items()} == {
            "LJ001-0008": "user",
            "LJ001-0009": "lease",
        }
        # Another function's verdict, and a line before causes: tried again.
        assert retried == {"user": 1, "audio": 1}
        kept = [r["item_id"] or r["path"] for r in read_quarantine(path)]
        assert kept == ["LJ001-0008", "LJ001-0009", "metadata.csv:17"]
        # A retried item that fails again gets its line back, with today's cause.
        assert q.write("LJ001-0004", "/w/4.wav", "still no label", "user", causes["user"])
        assert not q.write("LJ001-0008", "/w/8.wav", "again", "user", causes["user"])
        assert q.by_stage() == {"user": 2, "lease": 1, "metadata": 1}
        # The stager's own lease verdict carries the cause its producers judge by: a fixed
        # user function under a new user_version tries the item again.
        assert q.write("LJ001-0011", "/w/11.wav", "lease expired 3 times", "lease")
    again = read_quarantine(path)
    assert again[-2]["item_id"] == "LJ001-0004" and again[-2]["cause"] == causes["user"]
    assert again[-1]["cause"] == causes["lease"]
    with QuarantineWriter(path) as q:  # the next start: nothing left to retry
        skips, retried = q.settle(index, causes)
    assert len(skips) == 4 and not retried
    changed = stage_causes(replace(cfg, features={"user_version": "v9"}))
    with QuarantineWriter(path) as q:
        _, retried = q.settle(index, changed)
    assert retried == {"user": 2, "lease": 2}


def test_a_producer_that_names_no_causes_keeps_every_item_skipped(tmp_path: Path) -> None:
    """A peer of this protocol without causes (a test's own producer): as before causes."""
    cfg = replace(
        Config(),
        data={"path": str(MINI)},
        run_root=str(tmp_path / "runs"),
        features={**USER, "cache_dir": str(tmp_path / "cache")},
    )
    path, _ = lines(tmp_path, cfg)
    with QuarantineWriter(path) as q:
        skips, retried = q.settle(open_corpus(cfg), {})
    assert len(skips) == 4 and not retried


def quarantine_verb(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    args = build_parser().parse_args(["quarantine", *argv])
    code = args.fn(args)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_quarantine_verb_lists_by_stage_and_cause_and_clears(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path_cfg = write_config(
        tmp_path, {"data": {"path": str(MINI)}, "features": {**USER, "cache": False}}
    )
    cfg = load_config(path_cfg)
    path, causes = lines(tmp_path, cfg)
    code, said = quarantine_verb([str(path_cfg), "--run-id", "r1"], capsys)
    assert code == 0, said
    assert f"{path}: 4 items quarantined, 1 metadata lines" in said
    assert "user: 1, cause '0badc0de tests.support.user_fields:fussy v1'" in said
    assert f"today's cause is {causes['user']!r}: the next start retries them" in said
    assert f"user: 1, cause {causes['user']!r}\n    still today's cause" in said
    assert f"lease: 1, cause {causes['lease']!r}\n    still today's cause" in said
    assert "audio: 1, cause none recorded\n    today's cause is" in said  # before causes
    assert "e.g. LJ001-0004: unexpected KeyError in user" in said
    with QuarantineWriter(path):  # a live stager holds the file: no edit under it
        code, said = quarantine_verb([str(path_cfg), "--run-id", "r1", "--clear", "user"], capsys)
        assert code == 1 and "a stager of this run is running" in said, said
    code, said = quarantine_verb([str(path_cfg), "--run-id", "r1", "--clear", "user"], capsys)
    assert code == 0 and "removed 2 lines of stage 'user'" in said, said
    assert [r["stage"] for r in read_quarantine(path)] == ["lease", "metadata", "audio"]
    assert clear_stage(path, "user") == 0
    code, said = quarantine_verb([str(path_cfg), "--run-id", "nope"], capsys)
    assert code == 2 and "no run 'nope'" in said
