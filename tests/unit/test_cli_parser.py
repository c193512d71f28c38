"""The command line built for one verb (each process's start builds only its own
parser: benchmarks/first_batch.py) takes the same arguments as the whole one, and a
word that names no verb gets the whole one's help."""

from __future__ import annotations

import pytest

from ringfeed.scripts.cli import build_parser


def _verbs(parser) -> dict:
    return parser._subparsers._group_actions[0].choices


def _shape(parser) -> list[tuple]:
    return [(a.dest, a.option_strings, a.default, a.required, a.nargs) for a in parser._actions]


def test_each_verb_built_alone_takes_the_same_arguments() -> None:
    everything = _verbs(build_parser())
    assert {"run", "stager", "producers", "validate", "inspect"} <= set(everything)
    for name, full in everything.items():
        alone = _verbs(build_parser(name))
        assert list(alone) == [name]
        assert _shape(alone[name]) == _shape(full), name
        assert alone[name].get_default("fn") is full.get_default("fn")


def test_a_word_that_names_no_verb_is_told_every_verb(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser("stagr").parse_args(["stagr"])
    err = capsys.readouterr().err
    assert "invalid choice: 'stagr'" in err and "'stager'" in err and "'producers'" in err


def test_an_unknown_option_is_refused_with_every_verb_in_the_usage(capsys) -> None:
    from ringfeed.scripts.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--bogus"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bogus" in err and "producers" in err
