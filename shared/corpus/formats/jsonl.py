"""jsonl: a manifest file (any name: NeMo writes .json), one JSON object per line::

    {"audio": "clips/a.wav", "text": "...", "speaker": "ann", "language": "fa",
     "offset": 12.5, "duration": 3.2, "id": "a-0003"}

audio and text are required; audio is relative to the manifest's folder, or
absolute. With offset, offset and duration (seconds) cut a segment of a longer
file (no duration: to its end); without offset the clip is the whole file and
duration is only what the manifest says of its length (NeMo writes it rounded,
so it is never a cut). speaker, language and id are optional (language:
data.language; id: the audio path relative to the corpus root without its
extension, with "@offset" for a segment). The corpus root is the manifest's
folder, or data.root: ids and the corpus digest count from it, so the same
corpus has the same ids wherever it lives, absolute paths included
(shared/corpus/entry.py in_corpus). NeMo's key names audio_filepath and lang are
read too, so its manifests work as they are. Unknown keys are ignored. A line
that is not such an object is unusable, with the reason.

The index build parses every line (10**7 of them for a large corpus), so a line
takes a fast path: orjson (~1.3 us a line here, against ~6 for json.loads) and
the common object read in place (:func:`_plain_row`); anything else (a line orjson
refuses, a value of another type, an escaped surrogate, a path to normalize) takes
:func:`parse_line`, the definition, whose reasons a user reads. The two agree on
every line the fast path takes (tests/unit/test_index_build.py, hypothesis).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, ClassVar

import orjson

from ringfeed.shared.corpus.entry import in_corpus
from ringfeed.shared.corpus.format import Context, LineFormat
from ringfeed.shared.language.codes import language_code, valid_code

# A manifest line longer than this is not parsed (a clip's text is a few hundred bytes).
MAX_LINE_BYTES = 1 << 16


def _number(obj: dict[str, Any], key: str) -> float | str:
    """obj[key] as a finite float >= 0 (0.0 when absent), or the reason it is not."""
    value = obj.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{key!r} must be a number of seconds, got {type(value).__name__}"
    try:
        seconds = float(value)  # an int past 1e308 overflows
    except OverflowError:
        return f"{key!r} must be finite and >= 0, got an integer past 1e308"
    if not math.isfinite(seconds) or seconds < 0:
        return f"{key!r} must be finite and >= 0, got {seconds}"
    return seconds


def _first(obj: dict[str, Any], *keys: str) -> Any:
    return next((obj[k] for k in keys if k in obj), None)


def _strings(obj: dict[str, Any]) -> tuple[str, str, str, str] | str:
    """(audio, text, speaker, language) of a manifest object, or why not."""
    audio, text = _first(obj, "audio", "audio_filepath"), obj.get("text")
    speaker, language = obj.get("speaker", ""), _first(obj, "language", "lang") or ""
    if not isinstance(audio, str) or not audio.strip():
        return "no 'audio' path (a non-empty string)"
    if not isinstance(text, str) or not text.strip():
        return "no 'text' (a non-empty string)"
    if isinstance(speaker, int) and not isinstance(speaker, bool):
        speaker = str(speaker)  # NeMo writes speaker numbers
    if not isinstance(speaker, str):
        return f"'speaker' must be a string, got {type(speaker).__name__}"
    if not isinstance(language, str) or (language and not valid_code(language)):
        return f"'language' must be a code such as en, de or pt-br, got {language!r}"
    return audio.strip(), text.strip(), speaker.strip(), language_code(language)


def _not_utf8(obj: dict[str, Any]) -> str:
    """Why a string field of obj cannot be written as UTF-8 ('' when all can): JSON may
    escape a lone surrogate ("\\udc80"), which no file, table or hash can take later."""
    for key, value in obj.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{key!r} is not valid Unicode ({exc.reason} at character {exc.start})"
    return ""


def parse_line(line: str, folder: str, root: str) -> tuple | str:
    """One manifest line (of a manifest in `folder`) -> its Entry-shaped tuple, audio
    relative to the corpus root, or the reason it is unusable."""
    if len(line) > MAX_LINE_BYTES:
        return f"line longer than {MAX_LINE_BYTES} characters"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    strings = _not_utf8(obj) or _strings(obj)
    if isinstance(strings, str):
        return strings
    audio, text, speaker, language = strings
    offset_s, duration_s = _number(obj, "offset"), _number(obj, "duration")
    for value in (offset_s, duration_s):
        if isinstance(value, str):
            return value
    if "offset" not in obj:  # NeMo: the clip is the file, its rounded duration no cut
        duration_s = 0.0
    item_id = obj.get("id", "")
    if not isinstance(item_id, str):
        return f"'id' must be a string, got {type(item_id).__name__}"
    rel = in_corpus(audio, folder, root)
    if not item_id:
        item_id = Path(rel).with_suffix("").as_posix()
        item_id += f"@{offset_s:.3f}" if offset_s else ""
    return (item_id, rel, text, speaker, language, offset_s, duration_s)


def _seconds(value: Any) -> float | None:
    """A number of seconds as _number takes it (an int or float, finite, >= 0), else None."""
    if value.__class__ is float or value.__class__ is int:
        seconds = float(value)  # orjson reads no integer past 2**64: no overflow here
        if seconds >= 0 and seconds != math.inf:  # NaN fails the first
            return seconds
    return None


def _plain_row(obj: dict[str, Any], folder: str, root: str, codes: dict[str, str]) -> tuple | None:
    """parse_line's tuple for a manifest object whose every field has its plain type, or
    None (parse_line decides). codes: language strings met so far -> their code. Once a
    line: what a call would do is written out in place (~0.1 us a call of ~7 a line)."""
    audio = obj["audio"] if "audio" in obj else obj.get("audio_filepath")
    text, speaker = obj.get("text"), obj.get("speaker", "")
    language = obj["language"] if "language" in obj else obj.get("lang")
    item_id = obj.get("id", "")
    if not (
        audio.__class__ is str
        and text.__class__ is str
        and speaker.__class__ is str
        and item_id.__class__ is str
        and (language is None or language.__class__ is str)
    ):
        return None
    audio, text = audio.strip(), text.strip()
    if not audio or not text:
        return None
    code = codes.get(language or "")
    if code is None:
        if not valid_code(language):
            return None
        code = codes[language] = language_code(language)
    duration_s = obj.get("duration", 0.0)
    if duration_s.__class__ is float:
        if not 0.0 <= duration_s < math.inf:  # NaN fails too
            return None
    elif duration_s.__class__ is int and duration_s >= 0:
        duration_s = float(duration_s)  # orjson reads no integer past 2**64
    else:
        return None
    if "offset" in obj:
        offset_s = _seconds(obj["offset"])
        if offset_s is None:
            return None
    else:  # NeMo: the clip is the file, its rounded duration no cut
        offset_s = duration_s = 0.0
    plain = folder == root and audio[0] != "/" and audio[-1] not in "/."
    if plain and "//" not in audio and "./" not in audio:
        rel = audio  # what in_corpus gives, without its two system calls
    else:
        rel = in_corpus(audio, folder, root)
    if not item_id:
        head, _, suffix = rel.rpartition(".")  # Path(rel).with_suffix("") of a plain path
        if not (suffix and "/" not in suffix and head[-1:] not in ("/", "")):
            head = Path(rel).with_suffix("").as_posix()
        item_id = f"{head}@{offset_s:.3f}" if offset_s else head
    return (item_id, rel, text, speaker.strip(), code, offset_s, duration_s)


def _fast_row(text: str, folder: str, root: str, codes: dict[str, str]) -> tuple | None:
    """_plain_row of a line that orjson reads, or None: parse_line decides, in its words
    (a line too long; an escaped lone surrogate, "\\udc80", which orjson refuses)."""
    if len(text) > MAX_LINE_BYTES or "\\ud" in text or "\\uD" in text:
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if obj.__class__ is not dict:
        return None
    try:
        return _plain_row(obj, folder, root, codes)
    except Exception:  # noqa: BLE001 - e.g. Path('.').with_suffix: parse_line says why
        return None


class Jsonl(LineFormat):
    name: ClassVar[str] = "jsonl"
    free_paths: ClassVar[bool] = True
    expects: ClassVar[str] = "the manifest file"
    json_hint: ClassVar[bool] = False

    def rows(self, texts: list[str], context: Context) -> list[tuple | str]:
        out: list[tuple | str] = []
        folder, root = os.path.dirname(context.source), context.root
        codes = {"": ""}
        for text in texts:
            row = _fast_row(text, folder, root, codes)
            if row is not None:
                out.append(row)
                continue
            try:
                out.append(parse_line(text, folder, root))
            except Exception as exc:  # noqa: BLE001 - this line only (docs/design.md#contract-9)
                # json.loads raises ValueError past 4300 digits, RecursionError when nested
                # thousands deep; whatever else one line can raise, the others stay usable.
                out.append(f"unreadable line ({type(exc).__name__}: {str(exc)[:200]})")
        return out

    def guess_id(self, raw: bytes) -> str:
        return ""
