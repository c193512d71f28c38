"""Corpus layouts beyond LJSpeech and csv: JSON-lines manifests, LibriTTS, VCTK.

Called through shared.dataset.read_dataset (stager, producers, `ringfeed
validate`); each reader returns (entries in a stable order, bad lines) and
never depends on the file system's listing order (folders are walked sorted).

- ``jsonl``: data.path is a file, one JSON object per line::

      {"audio": "clips/a.wav", "text": "...", "speaker": "ann", "language": "fa",
       "offset": 12.5, "duration": 3.2, "id": "a-0003"}

  audio and text are required; audio is relative to the manifest's folder (or
  absolute). offset and duration (seconds) cut a segment of a longer file
  (duration alone: the first `duration` seconds); speaker, language and id
  are optional (language: data.language; id: the audio path without its
  extension, with "@offset" for a segment). NeMo's key names audio_filepath
  and lang are read too, so its manifests work as they are. Unknown keys are
  ignored. A line that is not such an object becomes a BadLine with the reason.
- ``libritts`` (LibriTTS and LibriTTS-R): data.path is a folder holding
  <speaker>/<chapter>/<utt>.wav with <utt>.normalized.txt (data.text_column 2)
  or <utt>.original.txt (1) beside it; the speaker is the first folder level.
- ``vctk`` (0.92 and 0.80): data.path holds txt/<speaker>/<utt>.txt and the audio
  in wav48_silence_trimmed/<speaker>/<utt>_mic1.flac (0.92) or
  wav48/<speaker>/<utt>.wav (0.80).

All are English unless the entry says otherwise (LibriTTS and VCTK are English).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from shared.config_checks import LANGUAGE_RE
from shared.dataset import BadLine, DatasetEntry, DatasetError

# A manifest line longer than this is not parsed (a clip's text is a few hundred bytes).
MAX_LINE_BYTES = 1 << 16
LIBRITTS_TEXT = {1: ".original.txt", 2: ".normalized.txt"}
VCTK_AUDIO = (("wav48_silence_trimmed", "_mic1.flac"), ("wav48", ".wav"))


def _number(obj: dict[str, Any], key: str) -> float | str:
    """obj[key] as a finite float >= 0 (0.0 when absent), or the reason it is not."""
    value = obj.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{key!r} must be a number of seconds, got {type(value).__name__}"
    if not math.isfinite(value) or value < 0:
        return f"{key!r} must be finite and >= 0, got {value}"
    return float(value)


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
    if not isinstance(language, str) or (language and not LANGUAGE_RE.fullmatch(language)):
        return f"'language' must be a code such as en, de or pt-br, got {language!r}"
    return audio.strip(), text.strip(), speaker.strip(), language


def jsonl_entry(line: str, base: Path) -> DatasetEntry | str:
    """One manifest line -> its entry, or the reason it is unusable."""
    if len(line) > MAX_LINE_BYTES:
        return f"line longer than {MAX_LINE_BYTES} characters"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    strings = _strings(obj)
    if isinstance(strings, str):
        return strings
    audio, text, speaker, language = strings
    offset_s, duration_s = _number(obj, "offset"), _number(obj, "duration")
    for value in (offset_s, duration_s):
        if isinstance(value, str):
            return value
    item_id = obj.get("id", "")
    if not isinstance(item_id, str):
        return f"'id' must be a string, got {type(item_id).__name__}"
    if not item_id:
        item_id = Path(audio).with_suffix("").as_posix().lstrip("/")
        item_id += f"@{offset_s:.3f}" if offset_s else ""
    path = audio if os.path.isabs(audio) else str(base / audio)
    return DatasetEntry(item_id, path, text, speaker, language, offset_s, duration_s)


def read_jsonl(path: Path, lines: list[tuple[int, str | None, str]]) -> list[tuple]:
    """(line number, entry or reason, item id) per decoded line of a manifest."""
    out = []
    base = path.parent.absolute()
    for number, text, reason in lines:
        result = jsonl_entry(text, base) if text is not None else reason
        out.append((number, result, "" if isinstance(result, str) else result.item_id))
    return out


def _walk(root: Path) -> list[Path]:
    """Every file under root, in sorted order (never the listing order)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        found.extend(Path(folder) / name for name in sorted(files))
    return found


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        return None


def _text_entry(txt: Path, audio: Path, item_id: str, speaker: str) -> DatasetEntry | BadLine:
    text = _read_text(txt)
    if text is None:
        return BadLine(str(txt), 1, "not valid UTF-8", item_id)
    if not text:
        return BadLine(str(txt), 1, "empty text", item_id)
    return DatasetEntry(item_id, str(audio), text, speaker)


def read_libritts(root: Path, text_column: int) -> tuple[list, list[BadLine]]:
    """LibriTTS / LibriTTS-R: (entries in sorted path order, bad text files)."""
    suffix = LIBRITTS_TEXT[text_column]
    results = []
    for txt in _walk(root):
        if txt.name.endswith(suffix):
            stem = txt.name.removesuffix(suffix)
            speaker = txt.relative_to(root).parts[0] if txt.parent != root else ""
            results.append(_text_entry(txt, txt.with_name(stem + ".wav"), stem, speaker))
    if not results:
        raise DatasetError(
            f"data.path: no *{suffix} files under {root} (data.format: libritts expects "
            "<speaker>/<chapter>/<utterance>.wav with its text beside it)"
        )
    return _split(results)


def read_vctk(root: Path) -> tuple[list, list[BadLine]]:
    """VCTK 0.92 or 0.80: (entries in sorted path order, bad text files)."""
    txt_root = root / "txt"
    if not txt_root.is_dir():
        raise DatasetError(f"data.path: {root} has no txt/ folder (data.format: vctk)")
    results = []
    for txt in _walk(txt_root):
        if txt.suffix != ".txt":
            continue
        speaker = txt.parent.name
        candidates = [root / d / speaker / f"{txt.stem}{end}" for d, end in VCTK_AUDIO]
        audio = next((c for c in candidates if c.is_file()), candidates[0])
        results.append(_text_entry(txt, audio, txt.stem, speaker))
    return _split(results)


def _split(results: list) -> tuple[list, list[BadLine]]:
    return [r for r in results if isinstance(r, DatasetEntry)], [
        r for r in results if isinstance(r, BadLine)
    ]
