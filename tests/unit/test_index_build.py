"""The index build's fast paths (shared/corpus/lines.py, block.py, formats/jsonl.py): a
pool of processes over byte ranges builds, byte for byte, the index one process builds,
and JSON lines read by orjson give what json.loads and parse_line give, unusable lines
with the same reasons, on the shipped corpora and on a generated manifest of
unicode, escapes and broken lines."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.build import Builder, build
from ringfeed.shared.corpus.format import Context
from ringfeed.shared.corpus.formats.jsonl import MAX_LINE_BYTES, Jsonl, parse_line
from tests.support.paths import REPO

# Blocks this small cut a test corpus into tens of ranges, lines split across none.
SMALL_BLOCK = 512


class PlainJsonl(Jsonl):
    """The JSON-lines format read the plain way, json.loads line by line: the reference."""

    def rows(self, texts: list[str], context: Context) -> list[tuple | str]:
        return [_guarded(text, context) for text in texts]


def _guarded(text: str, context: Context) -> tuple | str:
    try:
        return parse_line(text, str(Path(context.source).parent), context.root)
    except Exception as exc:  # noqa: BLE001 - the words Jsonl.rows gives for such a line
        return f"unreadable line ({type(exc).__name__}: {str(exc)[:200]})"


def built(cfg: Config, fmt=None, **how) -> tuple[dict, dict[str, np.ndarray]]:
    """The index's header (less its build time) and arrays; fmt: a format of the same
    name to read it with instead (the plain reference)."""
    if fmt is None:
        header, arrays = build(cfg, **how)
    else:
        builder = Builder(cfg, fmt, fmt.root(cfg), **how)
        fmt.scan(cfg, builder)
        header, arrays = builder.finish()
    header = {k: v for k, v in header.items() if k not in ("build_s", "version")}
    return header, arrays


def assert_same(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        assert a[1][name].dtype == b[1][name].dtype, name
        assert np.array_equal(a[1][name], b[1][name]), name


def generated_manifest(path: Path, n: int = 600) -> tuple[int, int]:
    """n entries of every kind a manifest holds, each twice: good ones (raw unicode,
    \\u escapes, surrogate pairs, quotes and backslashes, NeMo keys, segments, absolute,
    './' and '../' paths, ids) and broken ones; blank and whitespace lines between, CRLF
    ends on some, a BOM first, a line that is not UTF-8. Returns (usable, unusable)."""
    texts = [
        "Печать, в единственном смысле",
        "چاپ، به تنها معنا",
        "日本語のテキスト",
        'quote " and \\ backslash\ttab',
        "emoji 🎉 and ümlaut",
        "plain text",
    ]
    good, bad, lines = 0, 0, []
    for k in range(n):
        text = f"{texts[k % len(texts)]} {k}"
        kind = k % 10
        obj: dict = {"audio": f"d{k % 7}/c{k:05d}.wav", "text": text, "speaker": f"s{k % 5}"}
        if kind == 1:
            obj = {
                "audio_filepath": f"c{k}.flac",
                "text": text,
                "lang": "fa",
                "speaker": k % 3,
                "duration": 2.5,
            }
        elif kind == 2:
            obj.update(offset=k * 0.5, duration=1.25, language="ru")
        elif kind == 3:
            obj.update(audio=str(path.parent / f"abs{k}.wav"), id=f"id-{k}")
        elif kind == 4:
            obj.update(audio=f"./x/../y{k}.wav", language="pt_BR")
        elif kind == 5:
            obj.update(audio=f"../outside/o{k}.mp3", language="en")
        line = json.dumps(obj, ensure_ascii=kind in (6, 7))
        lines.append(line + ("\r" if kind == 8 else ""))
        good += 1
        if kind == 9:
            lines += ["", "   \t", "\r"]
    broken = [
        '{"audio": "a.wav"',
        "[1, 2]",
        '{"audio": "a.wav", "text": ""}',
        '{"audio": "", "text": "t"}',
        '{"audio": "a.wav", "text": "t", "duration": -1}',
        '{"audio": "a.wav", "text": "t", "duration": "3"}',
        '{"audio": "a.wav", "text": "t", "offset": NaN}',
        '{"audio": "a.wav", "text": "t", "offset": 1e400}',
        '{"audio": "a.wav", "text": "t", "language": "not a code!"}',
        '{"audio": "a.wav", "text": "t", "speaker": ["x"]}',
        '{"audio": "a.wav", "text": "t", "id": 7}',
        '{"audio": "a.wav", "text": "t \\udc80"}',
        "[" * 5000 + "]" * 5000,
        '{"audio": "clips/..", "text": "t"}',
        '{"audio": "a.wav", "text": "t", "x": 1}x',
        '{"audio": "a.wav", "text": "' + "y" * MAX_LINE_BYTES + '"}',
    ]
    for k, line in enumerate(broken):
        lines.insert(1 + k * (len(lines) // len(broken)), line)
        bad += 1
    lines.append(lines[0])  # a duplicate id: unusable, found at finish
    data = "\ufeff" + "\n".join(lines) + "\n"
    path.write_bytes(data.encode("utf-8") + b'{"audio": "\xff.wav", "text": "t"}\n')
    return good, bad + 2


def test_a_pool_over_byte_ranges_builds_what_one_process_builds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = tmp_path / "corpus" / "train.jsonl"
    manifest.parent.mkdir()
    good, bad = generated_manifest(manifest)
    corpora = {
        "generated": replace(Config(), data={"path": str(manifest), "format": "jsonl"}),
        "ljspeech": replace(Config(), data={"path": str(REPO / "data/ljspeech-mini")}),
        "multilingual": replace(
            Config(),
            data={
                "path": str(REPO / "data/multilingual-demo/train.jsonl"),
                "format": "jsonl",
                "language": "auto",
                "detect_languages": ["en", "de", "ru", "fa"],
            },
        ),
    }
    for name, cfg in corpora.items():
        one = built(cfg, workers=1)
        with caplog.at_level(logging.INFO, logger="ringfeed.shared.corpus.build"):
            caplog.clear()
            pooled = built(cfg, workers=2, block_bytes=SMALL_BLOCK)
        assert "read by 2 processes" in caplog.text, name  # the pool did read it
        assert_same(one, pooled)
        if cfg.data.format == "jsonl":  # and orjson's path gives what json.loads gives
            assert_same(one, built(cfg, fmt=PlainJsonl(), workers=1))
    header, arrays = one = built(corpora["generated"], workers=1)
    assert header["n_items"] == good and len(header["bad_lines"]) == bad
    reasons = "\n".join(b[2] for b in header["bad_lines"])
    for words in (
        "not JSON",
        "expected a JSON object",
        "no 'text'",
        "no 'audio' path",
        "must be finite and >= 0",
        "must be a number of seconds",
        "'language' must be",
        "'speaker' must be a string",
        "'id' must be a string",
        "not valid Unicode",
        "RecursionError",
        "unreadable line (ValueError",
        "longer than 65536",
        "not valid UTF-8",
        "duplicate item id",
    ):
        assert words in reasons, words
    assert "set data.format: jsonl" not in reasons  # it is jsonl
    assert header["outside_root"] == sum(k % 10 == 5 for k in range(600))


# Values a manifest's fields may hold, of every JSON type and the edges of each.
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            " ",
            "en",
            "EN",
            "pt_BR",
            "zz-zz",
            "a.wav",
            "./b.wav",
            "c//d.flac",
            "/abs/e.wav",
            "../f.wav",
            "g.",
            ".h",
            "x/..",
            "\udc80",
        ]
    ),
    st.lists(st.integers(), max_size=2),
)
KEYS = [
    "audio",
    "audio_filepath",
    "text",
    "speaker",
    "language",
    "lang",
    "offset",
    "duration",
    "id",
    "other",
]
OBJECTS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=len(KEYS))


@settings(max_examples=400, deadline=None)
@given(st.lists(OBJECTS, min_size=1, max_size=8), st.booleans(), st.booleans())
def test_orjson_and_the_fast_path_read_each_line_as_parse_line_does(objects, ascii_, moved):
    texts = [json.dumps(o, ensure_ascii=ascii_) for o in objects]
    texts += [text[: len(text) // 2] for text in texts]  # cut: mostly not JSON
    texts += [json.dumps(o).replace("1", "1e999").replace('"\\u', '"\\uD800\\u') for o in objects]
    lines = [text.encode("utf-8", "surrogatepass") for text in texts]  # as a file holds them
    lines += [line[:-1] + b"\xff" for line in lines[: len(objects)]]  # not UTF-8
    context = Context(0, "/root/corpus" if moved else "/data/corpus", "/data/corpus/m.jsonl")
    fast = Jsonl().parse(lines, context)
    plain = PlainJsonl().parse(lines, context)
    for line, a, b in zip(lines, fast, plain, strict=True):
        assert repr(a) == repr(b), line  # repr: -0.0 is not 0.0 in the digest
