"""Writes the Lhotse manifests beside this file with lhotse itself (lhotse 1.33.0, torch
2.13.0+cpu), so the tests read files lhotse really wrote without lhotse installed (it
needs torch, which the project does not). The project's `fixtures` extra (pyproject.toml)
declares what it needs; to regenerate, from the repository root, in a throwaway venv
(neither the run time nor the tests need these, so keep them out of .venv):

    python3.11 -m venv /tmp/venv-fixtures
    /tmp/venv-fixtures/bin/pip install -e '.[fixtures]'
    /tmp/venv-fixtures/bin/python tests/data/lhotse/write_manifests.py

The recordings are clips of data/multilingual-demo (the first three of each language:
ava, ben and cyrus), named relative to this folder. Each clip is one supervision with its
manifest line's text, speaker and language (English as lhotse's LibriTTS recipe writes
it, "English"; the others as codes); the first clip of each language has a second
supervision, its 0.5 s to 1.5 s, whose text is the sentence's first three words
(tests/support/published.py lhotse_reference makes the same rule from the demo's
manifest). The cuts are lhotse's own trim_to_supervisions of the two.
"""

import json
import os
from pathlib import Path

from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

HERE = Path(__file__).resolve().parent
DEMO = Path("../../../data/multilingual-demo")  # relative to HERE, as the manifests say
NAMES = {"en": "English"}


def main() -> None:
    os.chdir(HERE)
    rows = [json.loads(line) for line in (DEMO / "train.jsonl").read_text().splitlines()]
    recordings, supervisions = [], []
    for language in ("de", "en", "fa", "ru"):
        mine = [r for r in rows if Path(r["audio"]).name.startswith(f"{language}-")][:3]
        for k, row in enumerate(mine):
            recording = Recording.from_file(DEMO / row["audio"])
            recordings.append(recording)
            said = {
                "text": row["text"],
                "speaker": row["speaker"],
                "language": NAMES.get(language, language),
            }
            supervisions.append(
                SupervisionSegment(
                    id=recording.id,
                    recording_id=recording.id,
                    start=0.0,
                    duration=recording.duration,
                    channel=0,
                    **said,
                )
            )
            if k == 0:
                part = {**said, "text": " ".join(row["text"].split()[:3])}
                supervisions.append(
                    SupervisionSegment(
                        id=f"{recording.id}-part",
                        recording_id=recording.id,
                        start=0.5,
                        duration=1.0,
                        channel=0,
                        **part,
                    )
                )
    recordings = RecordingSet.from_recordings(recordings)
    supervisions = SupervisionSet.from_segments(supervisions)
    recordings.to_file(HERE / "demo_recordings_train.jsonl.gz")
    supervisions.to_file(HERE / "demo_supervisions_train.jsonl.gz")
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    cuts.trim_to_supervisions(keep_overlapping=False).to_file(HERE / "demo_cuts_train.jsonl")


if __name__ == "__main__":
    main()
