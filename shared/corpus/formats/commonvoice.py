"""commonvoice: a Mozilla Common Voice release as it is downloaded, one locale folder::

    cv-corpus-17.0-2024-03-15/de/validated.tsv   train.tsv  dev.tsv  test.tsv ...
    cv-corpus-17.0-2024-03-15/de/clips/common_voice_de_17300000.mp3 ...

data.path is the locale folder (its ``validated.tsv`` is read) or one of its
tab-separated split files (``train.tsv``). The header names the columns, in
whatever order the release writes them (they changed across releases): ``client_id``
is the speaker, ``path`` the clip under ``clips/`` (its name without the extension
is the item id), ``sentence`` the text; ``locale`` (since release 8), else the
locale folder's name, is the language. Other columns (votes, age, accents,
sentence_id ...) are ignored. Common Voice writes its tsv files unquoted
(a ``"`` in a sentence is a character of it), so a line is split on tabs, nothing
else. The mp3 clips are decoded by libsndfile (>= 1.1) in the producers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import AUDIO_EXTENSIONS, CorpusError
from ringfeed.shared.corpus.format import FORMATS_DOC, Context, LineFormat, data_path
from ringfeed.shared.language.codes import language_code, valid_code

FILE_NAME = "validated.tsv"
CLIPS = "clips"
REQUIRED = ("client_id", "path", "sentence")
# A column's place in the packed setting (Context.setting is one int): the column
# count, then client_id, path, sentence and locale + 1 (0: no locale column), a byte
# each; a header of 256 columns or more is refused (releases have 8 to 13).
_FIELDS = (*REQUIRED, "locale")
_MAX_COLUMNS = 255


def pack(columns: list[str]) -> int:
    """The setting of a header's columns (see _FIELDS)."""
    at = {name: k for k, name in enumerate(columns)}
    setting = len(columns)
    for shift, name in enumerate(_FIELDS, start=1):
        place = at[name] if name in REQUIRED else at.get(name, -1) + 1
        setting |= place << (8 * shift)
    return setting


def unpack(setting: int) -> tuple[int, int, int, int, int]:
    """(n_columns, client_id, path, sentence, locale + 1) of a packed setting."""
    n, client, path, sentence, locale = ((setting >> (8 * k)) & 0xFF for k in range(5))
    return n, client, path, sentence, locale


def folder_language(root: str) -> str:
    """The code of the locale folder's name ("zh-CN" -> "zh-cn"), "" when it is none."""
    name = os.path.basename(root.rstrip("/"))
    return language_code(name) if valid_code(name) else ""


class CommonVoice(LineFormat):
    name: ClassVar[str] = "commonvoice"
    file_name: ClassVar[str] = FILE_NAME
    expects: ClassVar[str] = (
        "a Common Voice locale folder holding validated.tsv and clips/, or one of its "
        ".tsv files such as train.tsv"
    )

    def locate(self, cfg: Config) -> str:
        """The tsv; a folder without validated.tsv names the tsv files it holds."""
        path = data_path(cfg)
        if path.is_dir() and not (path / FILE_NAME).is_file():
            found = sorted(p.name for p in path.glob("*.tsv")) or ["no .tsv file"]
            raise CorpusError(
                f"data.path: no {FILE_NAME} in {path} (found: {', '.join(found)}; "
                f"data.format: commonvoice expects {self.expects})"
            )
        located = super().locate(cfg)
        clips = Path(located).parent / CLIPS
        if not clips.is_dir():
            raise CorpusError(
                f"data.path: no {CLIPS}/ folder beside {located} (data.format: "
                "commonvoice reads each clip from clips/<path>)"
            )
        return located

    def setting(self, cfg: Config, path: str, first: bytes | None) -> tuple[int, bool]:
        """The header's columns, packed (pack); the header is skipped."""
        columns = [c.strip() for c in (first or b"").decode("utf-8", "replace").split("\t")]
        missing = [name for name in REQUIRED if name not in columns]
        if missing or len(columns) > _MAX_COLUMNS:
            raise CorpusError(
                f"{path}:1: data.format: commonvoice needs the columns "
                f"{', '.join(REQUIRED)} in its header, found {', '.join(columns)!r} "
                f"(missing: {', '.join(missing) or 'none'}; {FORMATS_DOC})"
            )
        return pack(columns), True

    def rows(self, texts: list[str], context: Context) -> list[tuple | str]:
        n, client, path, sentence, locale = unpack(context.setting)
        default = folder_language(context.root)
        out: list[tuple | str] = []
        for line in texts:
            fields = line.split("\t")
            if len(fields) != n:
                out.append(f"expected {n} tab-separated columns as the header, got {len(fields)}")
                continue
            clip, text = fields[path].strip(), fields[sentence].strip()
            code = fields[locale - 1].strip() if locale else ""
            if not clip or "/" in clip:
                out.append(f"'path' must name a clip in clips/, got {clip!r}")
            elif not text:
                out.append("empty sentence")
            elif code and not valid_code(code):
                out.append(f"'locale' must be a code such as de or zh-CN, got {code!r}")
            else:
                stem, dot, ext = clip.rpartition(".")
                item_id = stem if dot and f".{ext.lower()}" in AUDIO_EXTENSIONS else clip
                language = language_code(code) if code else default
                out.append(
                    (item_id, f"{CLIPS}/{clip}", text, fields[client].strip(), language, 0.0, 0.0)
                )
        return out

    def guess_id(self, raw: bytes) -> str:
        return ""  # which column is path depends on the header
