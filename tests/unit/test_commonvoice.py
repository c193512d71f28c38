"""Common Voice releases (shared/corpus/formats/commonvoice.py): the columns by the header
whatever the release's order, client_id the speaker, the locale the language, mp3 clips
decoded; a bad line costs itself; a folder without a tsv, a header without a column the
format needs, one line each that says what to change. (Real runs:
tests/process/test_published_e2e.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.open import open_corpus, read_corpus
from tests.support.audio import load_file
from tests.support.published import CV5_COLUMNS, client_id, demo_rows, write_commonvoice


def cv_cfg(path: Path, **data: str) -> Config:
    return replace(
        Config(),
        data={"path": str(path), "format": "commonvoice", **data},
        audio={"sample_rate": 16000},
        features={"cache_dir": str(path.parent / "cache")},
    )


def test_a_release_reads_as_its_tsv_says(tmp_path: Path) -> None:
    reference = write_commonvoice(tmp_path / "cv", "ru")
    tsv = tmp_path / "cv" / "ru" / "validated.tsv"
    header, *lines = tsv.read_text("utf-8").splitlines()
    bad = [
        lines[0].replace(".mp3\t", ".mp3\textra\t", 1),  # one column too many
        "\t".join(f if k != 3 else " " for k, f in enumerate(lines[1].split("\t"))),  # no text
        lines[2].replace("common_voice", "../common_voice", 1),  # a path out of clips/
        lines[3].replace("\tru\t", "\tRussisch\t"),  # a locale that is no code
    ]
    tsv.write_text("\n".join([header, *lines, *bad]) + "\n", "utf-8")
    entries, skipped = read_corpus(cv_cfg(tmp_path / "cv" / "ru", language="en"))
    assert [tuple(e) for e in entries] == [tuple(e) for e in reference.values()]
    assert {e.speaker for e in entries} == {client_id(s) for s in ("ava", "ben", "cyrus")}
    assert {e.language for e in entries} == {"ru"}  # the locale, not data.language
    reasons = [(b.line, b.reason) for b in skipped]
    assert [line for line, _ in reasons] == [12, 13, 14, 15], reasons
    expected = [
        "expected 13 tab-separated columns",
        "empty sentence",
        "'path' must name a clip",
        "'locale' must be a code",
    ]
    for (_, reason), want in zip(reasons, expected, strict=True):
        assert want in reason


def test_an_older_release_and_a_split_file(tmp_path: Path) -> None:
    """Before release 8 no locale column: the locale folder's name is the language
    (zh-CN -> zh-cn); data.path may name a split file such as train.tsv."""
    reference = write_commonvoice(tmp_path / "cv", "zh-CN", CV5_COLUMNS, "train.tsv", "de")
    entries, bad = read_corpus(cv_cfg(tmp_path / "cv" / "zh-CN" / "train.tsv"))
    assert bad == [] and [tuple(e) for e in entries] == [tuple(e) for e in reference.values()]
    assert [e.text for e in entries] == [r["text"] for r in demo_rows("de")]
    assert {e.language for e in entries} == {"zh-cn"}


def test_the_mp3_decodes_to_the_clip_it_was_made_from(tmp_path: Path) -> None:
    reference = write_commonvoice(tmp_path / "cv", "fa")
    cfg = replace(cv_cfg(tmp_path / "cv" / "fa"), audio={"normalize": "none"})
    entry = open_corpus(cfg, in_subprocess=False).entry(0)
    mp3 = load_file(entry.audio_path, cfg)
    flac = load_file(demo_rows("fa")[0]["audio"], cfg)
    assert entry.audio_path == reference[entry.item_id].audio_path
    assert abs(len(mp3) - len(flac)) < 0.05 * len(flac)  # an encoder's padding, no more
    n = min(len(mp3), len(flac)) - 4000
    best = max(np.corrcoef(mp3[lag : lag + n], flac[:n])[0, 1] for lag in range(0, 4000, 8))
    assert best > 0.9, best  # the same clip, shifted by the encoder's delay


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            "no tsv",
            r"^data.path: no validated.tsv in .*\(found: train.tsv; data.format: "
            r"commonvoice expects a Common Voice locale folder",
        ),
        ("no clips", r"^data.path: no clips/ folder beside .*validated.tsv"),
        (
            "no sentence",
            r"validated.tsv:1: data.format: commonvoice needs the columns "
            r"client_id, path, sentence in its header, found 'client_id, path, "
            r"text, locale' \(missing: sentence",
        ),
    ],
)
def test_what_is_not_a_release_is_one_line_that_says_what_to_change(
    tmp_path: Path, damage: str, message: str
) -> None:
    write_commonvoice(tmp_path / "cv", "de")
    folder = tmp_path / "cv" / "de"
    if damage == "no tsv":
        (folder / "validated.tsv").rename(folder / "train.tsv")
    elif damage == "no clips":
        shutil.rmtree(folder / "clips")
    else:
        (folder / "validated.tsv").write_text("client_id\tpath\ttext\tlocale\nx\ty.mp3\tz\tde\n")
    with pytest.raises(CorpusError, match=message) as caught:
        open_corpus(cv_cfg(folder), in_subprocess=False)
    assert "\n" not in str(caught.value)
