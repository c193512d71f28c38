"""lhotse: manifests as lhotse (https://github.com/lhotse-speech/lhotse) writes them, JSON
lines, gzipped or not::

    libritts_recordings_train.jsonl.gz    {"id", "sources": [{"type": "file", "source"}], ...}
    libritts_supervisions_train.jsonl.gz  {"id", "recording_id", "start", "duration",
                                           "text", "speaker", "language", ...}
    libritts_cuts_train.jsonl.gz          {"id", "start", "duration", "recording": {...},
                                           "supervisions": [...], "type": "MonoCut"}

data.path is a supervisions manifest (its recordings manifest beside it, the same name
with "recordings" for "supervisions"), a cuts manifest, or a folder holding one cuts
or one supervisions manifest. A supervision is a clip: its recording's file from
``start`` for ``duration`` seconds. A cut is a clip: its recording from the cut's
``start`` for its ``duration``, the text its supervisions' texts joined (one speaker
and one language). The item id is the supervision's or the cut's id (one manifest,
whose ids lhotse keeps unique: a repeat is reported with both lines); speaker and
language come from the supervision (a code, or an English name as lhotse's recipes
write it: "English"; none: data.language). A recording's file is relative to the
manifest's folder, or absolute (lhotse writes the path it was given: write
relative paths from the manifest's folder, or absolute ones). Channels are mixed to
mono, so the clips of a recording whose supervisions name different channels (a
conversation, a speaker a channel) are unusable, with the reason. A recording's
Resample transform is what the producers do anyway; any other transform (speed,
volume, reverb) would make the clip what ringfeed does not read, so that clip is
unusable with the reason. Read once at the index build, like every
format found by scanning (shared/corpus/format.py StoredFormat).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry, in_corpus
from ringfeed.shared.corpus.format import FORMATS_DOC, Scan, StoredFormat, data_path
from ringfeed.shared.language.codes import code_or_name

SUFFIXES = (".jsonl", ".jsonl.gz")
# Transforms that leave the audio as the producers would make it (they resample anyway).
HARMLESS_TRANSFORMS = ("Resample",)


def lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of every non-blank line; gzipped or not, by its magic."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, line


def objects(path: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line number, the line's object or why it is none) of a manifest."""
    for number, line in lines(path):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            yield number, f"not JSON ({str(exc)[:100]})"
            continue
        yield number, obj if isinstance(obj, dict) else f"expected a JSON object, got {obj!r:.40}"


def kind(obj: dict[str, Any]) -> str:
    """What a manifest object is: recording, supervision, cut, or ""."""
    if "supervisions" in obj or str(obj.get("type", "")).endswith("Cut"):
        return "cut"
    if "recording_id" in obj:
        return "supervision"
    return "recording" if "sources" in obj else ""


def first_kind(path: Path) -> str:
    """The kind of a manifest's first object; CorpusError when it is none."""
    for _, obj in objects(str(path)):
        found = kind(obj) if isinstance(obj, dict) else ""
        if not found:
            keys = ", ".join(obj) if isinstance(obj, dict) else obj
            raise CorpusError(
                f"data.path: {path}'s first line is no Lhotse recording, "
                f"supervision or cut ({keys}; {FORMATS_DOC})"
            )
        return found
    raise CorpusError(f"data.path: {path} is empty (data.format: lhotse)")


def sibling(path: Path, was: str, now: str) -> Path:
    return path.with_name(path.name.replace(was, now))


def seconds(obj: dict[str, Any], key: str) -> float | str:
    value = obj.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"{key!r} must be a number of seconds, got {value!r:.40}"
    return float(value) if value >= 0 else f"{key!r} must be >= 0, got {value}"


def audio_of(recording: Any, folder: str) -> str:
    """A recording's file relative to the manifest's folder, or why it cannot be read
    (a reason starting with "!")."""
    if not isinstance(recording, dict):
        return "!no recording"
    sources = recording.get("sources")
    if not isinstance(sources, list) or len(sources) != 1 or not isinstance(sources[0], dict):
        n = len(sources) if isinstance(sources, list) else 0
        return f"!recording {recording.get('id')!r} has {n} sources: one file a recording is read"
    source = sources[0]
    if source.get("type") != "file" or not isinstance(source.get("source"), str):
        return (
            f"!recording {recording.get('id')!r}: a source of type "
            f"{source.get('type')!r}, only 'file' is read"
        )
    names = [t.get("name") if isinstance(t, dict) else t for t in recording.get("transforms") or []]
    if set(names) - set(HARMLESS_TRANSFORMS):
        return (
            f"!recording {recording.get('id')!r} has the transforms {names}: ringfeed "
            "reads the file as it is, so the clip would not be what lhotse gives"
        )
    return in_corpus(source["source"], folder, folder)


def clip(supervisions: Any) -> tuple[str, str, str] | str:
    """(text, speaker, language) of a clip's supervisions (one or more, in order)."""
    if not isinstance(supervisions, list) or not supervisions:
        return "no supervision (no text)"
    texts, speakers, languages = [], set(), set()
    for sup in supervisions:
        text, speaker, language = (
            sup.get(k) if isinstance(sup, dict) else None for k in ("text", "speaker", "language")
        )
        if not isinstance(text, str) or not text.strip():
            return "no 'text' (a non-empty string) in a supervision"
        if not isinstance(speaker, str | None) or not isinstance(language, str | None):
            return "'speaker' and 'language' must be strings"
        code = code_or_name(language) if language else ""
        if language and not code:
            return (
                f"'language' must be a code such as de or a name such as German, got {language!r}"
            )
        texts.append(text.strip())
        speakers.add((speaker or "").strip())
        languages.add(code)
    if len(speakers) > 1 or len(languages) > 1:
        return f"supervisions of several speakers or languages ({sorted(speakers | languages)})"
    return " ".join(texts), speakers.pop(), languages.pop()


def entry(item_id: Any, audio: str, segment: tuple[Any, Any], sups: Any) -> Entry | str:
    """The Entry of one clip (a supervision, or a cut), or why it is none."""
    if not isinstance(item_id, str) or not item_id.strip():
        return "no 'id' (a non-empty string)"
    if audio.startswith("!"):
        return audio[1:]
    for value in segment:
        if isinstance(value, str):
            return value
    if not segment[1]:
        return "'duration' is 0: an empty clip"
    fields = clip(sups)
    if isinstance(fields, str):
        return fields
    return Entry(item_id, audio, fields[0], fields[1], fields[2], *segment)


class Lhotse(StoredFormat):
    name: ClassVar[str] = "lhotse"

    def locate(self, cfg: Config) -> str:
        """The supervisions or cuts manifest (module docstring)."""
        path = data_path(cfg)
        if path.is_dir():
            path = self._in_folder(path)
        if not path.is_file():
            raise CorpusError(
                f"data.path: no Lhotse manifest at {path} (data.format: "
                f"lhotse expects a supervisions or cuts manifest; "
                f"{FORMATS_DOC})"
            )
        found = first_kind(path)
        if found == "recording":
            sups = sibling(path, "recordings", "supervisions")
            if sups == path or not sups.is_file():
                raise CorpusError(
                    f"data.path: {path} holds recordings and no supervisions "
                    f"manifest is beside it ({sups.name}): name the supervisions "
                    "or cuts manifest, which hold the texts"
                )
            return str(sups)
        recordings = self._recordings(path)
        if found == "supervision" and (recordings == path or not recordings.is_file()):
            expected = recordings.name if recordings != path else "its name with 'recordings'"
            raise CorpusError(
                f"data.path: no recordings manifest beside {path} (expected "
                f"{expected} for 'supervisions', as lhotse names them)"
            )
        return str(path)

    def _in_folder(self, folder: Path) -> Path:
        found = sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIXES))
        for word in ("cuts", "supervisions"):
            named = [p for p in found if word in p.name]
            if len(named) == 1:
                return named[0]
        names = ", ".join(p.name for p in found) or "none"
        raise CorpusError(
            f"data.path: {folder} holds no single cuts or supervisions manifest "
            f"(found: {names}): name the one to read in data.path"
        )

    def _recordings(self, supervisions: Path) -> Path:
        return sibling(supervisions, "supervisions", "recordings")

    def root(self, cfg: Config) -> str:
        return os.path.dirname(self.locate(cfg))

    def stamp(self, cfg: Config) -> list:
        path = Path(self.locate(cfg))
        files = [path] if first_kind(path) == "cut" else [path, self._recordings(path)]
        return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]

    def read(self, cfg: Config, root: str) -> Scan:
        path = self.locate(cfg)
        bad: list[BadLine] = []
        if first_kind(Path(path)) == "cut":
            clips = list(self._cuts(path, root))
        else:
            clips = list(self._supervisions(path, root, bad))
        channels: dict[Any, set[str]] = {}  # per recording, the channels its clips name
        for _, _, found, (recording, channel) in clips:
            if isinstance(found, Entry) and channel != "null":  # no channel: all of them
                channels.setdefault(recording, set()).add(channel)
        entries: list[Entry] = []
        numbers: list[int] = []
        for number, item_id, found, (recording, _) in clips:
            if isinstance(found, Entry) and len(channels.get(recording, ())) > 1:
                found = (
                    f"recording {recording!r} has supervisions on channels "
                    f"{', '.join(sorted(channels[recording]))}: ringfeed mixes a "
                    "recording's channels to mono, so each would hear the others: "
                    "split its channels into files of their own"
                )
            if isinstance(found, Entry):
                entries.append(found)
                numbers.append(number)
            else:
                bad.append(
                    BadLine(path, number, found, item_id if isinstance(item_id, str) else "")
                )
        return Scan(entries, bad, lambda k: (path, numbers[k]))

    def _cuts(self, path: str, root: str) -> Iterator[tuple[int, Any, Entry | str, tuple]]:
        """(line, id, the clip or why not, (its recording, its channel)) of each cut."""
        for number, cut in objects(path):
            if isinstance(cut, str):
                yield number, "", cut, (None, "")
                continue
            recording = cut.get("recording")
            where = (
                recording.get("id") if isinstance(recording, dict) else None,
                json.dumps(cut.get("channel")),
            )
            if cut.get("type", "MonoCut") != "MonoCut":
                yield number, cut.get("id"), f"a {cut.get('type')} is not read: only MonoCut", where
            else:
                segment = (seconds(cut, "start"), seconds(cut, "duration"))
                found = entry(
                    cut.get("id"), audio_of(recording, root), segment, cut.get("supervisions")
                )
                yield number, cut.get("id"), found, where

    def _supervisions(
        self, path: str, root: str, bad: list[BadLine]
    ) -> Iterator[tuple[int, Any, Entry | str, tuple]]:
        """(line, id, the clip or why not, (its recording, its channel)) of each
        supervision; the recordings manifest's bad lines into bad."""
        recordings: dict[str, str] = {}
        where = str(self._recordings(Path(path)))
        for number, rec in objects(where):
            if isinstance(rec, str) or not isinstance(rec.get("id"), str):
                bad.append(BadLine(where, number, rec if isinstance(rec, str) else "no 'id'"))
            else:
                recordings[rec["id"]] = audio_of(rec, root)
        for number, sup in objects(path):
            if isinstance(sup, str):
                yield number, "", sup, (None, "")
                continue
            audio = recordings.get(sup.get("recording_id"))
            if audio is None:
                audio = f"!no recording {sup.get('recording_id')!r} in {os.path.basename(where)}"
            segment = (seconds(sup, "start"), seconds(sup, "duration"))
            place = (sup.get("recording_id"), json.dumps(sup.get("channel")))
            yield number, sup.get("id"), entry(sup.get("id"), audio, segment, [sup]), place
