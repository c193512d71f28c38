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
  or <utt>.original.txt (1) beside it, or the LibriTTS root holding such subsets;
  the speaker is the utterance id's first part (<speaker>_<chapter>_<n>_<n>), else
  the folder two levels above the file. Linked folders are followed.
- ``vctk`` (0.92 and 0.80): data.path holds txt/<speaker>/<utt>.txt and the audio
  in wav48_silence_trimmed/<speaker>/<utt>_mic1.flac (0.92) or
  wav48/<speaker>/<utt>.wav (0.80).

All are English unless the entry says otherwise (LibriTTS and VCTK are English).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from ringfeed.shared.dataset import BadLine, DatasetEntry, DatasetError
from ringfeed.shared.language_codes import language_code, valid_code

log = logging.getLogger(__name__)

# A manifest line longer than this is not parsed (a clip's text is a few hundred bytes).
MAX_LINE_BYTES = 1 << 16
LIBRITTS_TEXT = {1: ".original.txt", 2: ".normalized.txt"}
VCTK_AUDIO = (("wav48_silence_trimmed", "_mic1.flac"), ("wav48", ".wav"))


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
    strings = _not_utf8(obj) or _strings(obj)
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
        try:
            result = jsonl_entry(text, base) if text is not None else reason
        except Exception as exc:  # noqa: BLE001 - one line costs that line (contract 9)
            # json.loads raises ValueError past 4300 digits, RecursionError when nested
            # thousands deep; whatever else one line can raise, the others stay usable.
            result = f"unreadable line ({type(exc).__name__}: {str(exc)[:200]})"
        out.append((number, result, "" if isinstance(result, str) else result.item_id))
    return out


def _walk(root: Path) -> list[Path]:
    """Every file under root, in sorted order (never the listing order). Linked folders
    are followed (corpora are often assembled from linked subsets), each real folder
    once: a link back up the tree, or a second link to a subset, is read no more."""
    found = []
    seen = {os.path.realpath(root)}
    for folder, dirs, files in os.walk(root, followlinks=True):
        kept = []
        for name in sorted(dirs):
            real = os.path.realpath(os.path.join(folder, name))
            if real in seen:
                log.warning("%s: a link to a folder already read (%s), not read again",
                            os.path.join(folder, name), real)  # fmt: skip
                continue
            seen.add(real)
            kept.append(name)
        dirs[:] = kept
        found.extend(Path(folder) / name for name in sorted(files))
    return found


def _warn_layout(mismatched: list[Path], expected: str) -> None:
    if mismatched:
        log.warning("%d files are not laid out as %s, e.g. %s: check data.path and data.format",
                    len(mismatched), expected, mismatched[0])  # fmt: skip


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        return None


def _text_entry(txt: Path, audio: Path, item_id: str, speaker: str) -> DatasetEntry | BadLine:
    try:
        str(audio).encode("utf-8")  # names the id, the speaker and the audio path
    except UnicodeEncodeError:
        name = str(txt).encode("utf-8", "replace").decode()
        return BadLine(name, 1, "file or folder name is not valid UTF-8: rename it")
    text = _read_text(txt)
    if text is None:
        return BadLine(str(txt), 1, "not valid UTF-8", item_id)
    if not text:
        return BadLine(str(txt), 1, "empty text", item_id)
    return DatasetEntry(item_id, str(audio), text, speaker)


def _libritts_speaker(txt: Path, stem: str, root: Path, mismatched: list[Path]) -> str:
    """The speaker of a LibriTTS utterance: its id's first part (<speaker>_<chapter>_...),
    else the folder two levels above it; the file is noted when the two disagree. Never
    the first folder under data.path, which is the subset (train-clean-100) when data.path
    is the LibriTTS root."""
    parts = stem.split("_")
    depth = len(txt.relative_to(root).parts)
    folders = (txt.parent.parent.name, txt.parent.name) if depth >= 3 else None
    if len(parts) >= 3 and parts[0] and parts[1]:
        if folders != (parts[0], parts[1]):
            mismatched.append(txt)
        return parts[0]
    mismatched.append(txt)
    return folders[0] if folders else ""


def read_libritts(root: Path, text_column: int) -> tuple[list, list[BadLine]]:
    """LibriTTS / LibriTTS-R: (entries in sorted path order, bad text files). data.path
    is a subset (train-clean-100) or the root holding several."""
    suffix = LIBRITTS_TEXT[text_column]
    results = []
    mismatched: list[Path] = []
    for txt in _walk(root):
        if txt.name.endswith(suffix):
            stem = txt.name.removesuffix(suffix)
            speaker = _libritts_speaker(txt, stem, root, mismatched)
            results.append(_text_entry(txt, txt.with_name(stem + ".wav"), stem, speaker))
    if not results:
        raise DatasetError(
            f"data.path: no *{suffix} files under {root} (data.format: libritts expects "
            "<speaker>/<chapter>/<utterance>.wav with its text beside it)"
        )
    _warn_layout(mismatched, "<speaker>/<chapter>/<speaker>_<chapter>_<n>_<n>")
    return _split(results)


def read_vctk(root: Path) -> tuple[list, list[BadLine]]:
    """VCTK 0.92 or 0.80: (entries in sorted path order, bad text files)."""
    txt_root = root / "txt"
    if not txt_root.is_dir():
        raise DatasetError(f"data.path: {root} has no txt/ folder (data.format: vctk)")
    results = []
    mismatched: list[Path] = []
    for txt in _walk(txt_root):
        if txt.suffix != ".txt":
            continue
        speaker = txt.parent.name
        if txt.parent.parent != txt_root or not txt.stem.startswith(f"{speaker}_"):
            mismatched.append(txt)
        candidates = [root / d / speaker / f"{txt.stem}{end}" for d, end in VCTK_AUDIO]
        audio = next((c for c in candidates if c.is_file()), candidates[0])
        results.append(_text_entry(txt, audio, txt.stem, speaker))
    _warn_layout(mismatched, "txt/<speaker>/<speaker>_<n>.txt")
    return _split(results)


def _split(results: list) -> tuple[list, list[BadLine]]:
    return [r for r in results if isinstance(r, DatasetEntry)], [
        r for r in results if isinstance(r, BadLine)
    ]
