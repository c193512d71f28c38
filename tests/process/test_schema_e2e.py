"""Every declared field through real processes: a reference clip, pitch, energy,
durations and fields of the user's own, length buckets on, a local producer and a
remote one (every field as payload frames), the stager killed and resumed in the
middle; every row of every field is what the producer computes for its item, and
each reference is another clip of the row's speaker whenever it has one."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.features.references import SpeakerClips, choose_reference, cut_reference
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import load_config, replace
from ringfeed.shared.corpus.open import open_corpus
from tests.support import user_fields
from tests.support.checks import same_rows
from tests.support.configs import EIGHT_KHZ_FEATURES, tcp, write_config
from tests.support.paths import WAVS
from tests.support.ports import free_port
from tests.support.runs import Run, rid, shm_segments

pytestmark = pytest.mark.slow
# "solo" has one clip: its own reference (features.single_clip: own).
SPEAKERS = ["zoe", "ann", "bob"]


def manifest(path: Path) -> Path:
    """12 whole clips and 12 one-second segments of them, three speakers, and one clip
    of a speaker of its own."""
    lines = []
    for k in range(25):
        speaker = "solo" if k == 24 else SPEAKERS[k % 3]
        line = {
            "audio": str(WAVS / f"LJ001-{k % 12 + 1:04d}.wav"),
            "text": f"Clip {k} of the test.",
            "speaker": speaker,
            "id": f"c{k}",
        }
        if 12 <= k < 24:
            line |= {"offset": 0.5, "duration": 1.0}
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


def config(tmp_path: Path, port: int) -> Path:
    return write_config(
        tmp_path,
        {
            "data": {"path": str(manifest(tmp_path / "train.jsonl")), "format": "jsonl"},
            "audio": {"sample_rate": 8000},
            "features": {
                **EIGHT_KHZ_FEATURES,
                "max_frames": 320,
                "cache_dir": str(tmp_path / "cache"),
                "reference": True,
                "reference_frames": 24,
                "pitch": True,
                "energy": True,
                "user_function": "tests.support.user_fields:fields",
                "user_version": "e2e",
                "user_fields": user_fields.FIELDS,
                "durations_dir": str(tmp_path / "durations"),
            },
            "ring": {"heartbeat_s": 0.1},
            "stager": {"batch_size": 4, "epochs": 1, "buckets": [64, 160, 320]},
            "producers": {"workers": 1},
            "transport": tcp(port),
        },
    )


def check_rows(a: dict[str, np.ndarray], n: int, expected: list, cfg) -> list[int]:
    """Every row of every field against what the producer computes for its item."""
    items = [int(i) for i in a["items"][:n]]
    schema = cfg.schema
    for row, item in enumerate(items):
        want = expected[item]
        t, f = int(a["text_lens"][row]), int(a["mel_lens"][row])
        assert np.array_equal(a["tokens"][row, :t], want.tokens), (row, item)
        assert not a["tokens"][row, t:].any()
        assert f == len(want.mel) and same_rows(a["mel"][row, :f], want.mel), (row, item)
        for d in schema.extras:
            got, exp = a[d.name][row], want.fields[d.name]
            m = len(exp) if d.length != "none" else d.shape[0]
            if d.length == "own":
                assert a[d.lens_name][row] == m, (d.name, row, item)
            elif d.length == "frames":
                assert m == f, (d.name, row, item)
            assert same_rows(got[:m], exp), (d.name, row, item)
            assert (got[m:] == d.pad).all(), (d.name, "padding", row, item)
    for d in schema.extras:  # rows past n_valid: the pad value, lengths 0
        assert (a[d.name][n:] == d.pad).all(), d.name
    return items


def test_every_field_of_every_row_across_a_stager_restart(tmp_path: Path) -> None:
    port = free_port()
    cfg_path = config(tmp_path, port)
    cfg = load_config(cfg_path)
    index = open_corpus(cfg)
    no_durations = replace(cfg, features={"cache": False, "durations_dir": ""})
    plain = SamplePipeline(no_durations, index=index)
    for k, e in enumerate(index.entries):  # what an aligner would have written
        s = plain(e, k)
        user_fields.write_durations(tmp_path / "durations", e.item_id, len(s.tokens), len(s.mel))
    pipe = SamplePipeline(replace(cfg, features={"cache": False}), index=index)
    expected = [pipe(e, k, epoch=0) for k, e in enumerate(index.entries)]
    clips = SpeakerClips(index)
    for k, e in enumerate(index.entries):  # the reference: another clip of the speaker
        ref, rng = choose_reference(clips, k, 0, cfg)
        assert index.entries[ref].speaker == e.speaker and (ref != k) == (e.speaker != "solo")
        want = cut_reference(expected[ref].mel, cfg.features.reference_frames, rng)
        assert np.array_equal(expected[k].fields["ref_mel"], want), k
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")  # one local worker, writing into the ring
        run.procs["remote"] = run.start(  # and one sending every field as payload frames
            "producers", "--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", "far"
        )
        client = run.client(timeout_s=60)
        items: list[int] = []
        shapes = set()
        while (batch := client.next(timeout_s=90)) is not None:
            items += check_rows(batch.arrays, batch.meta.n_valid, expected, cfg)
            shapes.add(batch.arrays["pitch"].shape[1])
            client.free(batch)
            if len(items) >= 8 and run.launches == 2:  # the stager dies mid-epoch
                run.signal("stager", 9)
                run.wait("stager", 10)
                run.start("stager")
        client.close()
        assert run.wait("stager", 30) == 0, run.logs()
        kinds = {p["remote"] for p in run.json("stager.json")["producers"] if p["samples"]}
    assert run.launches == 3, "the stager was never restarted"
    assert collections.Counter(items) == collections.Counter(range(25)), "each item once"
    assert len(shapes) > 1, "one bucket only: buckets were not exercised"
    assert kinds == {True, False}, "a local and a remote producer must both have written"
    assert shm_segments(run_id) == []
