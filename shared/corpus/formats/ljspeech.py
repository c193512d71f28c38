"""LJSpeech: ``metadata.csv`` of ``id|text|normalized`` lines beside ``wavs/<id>.wav``.

data.path is the folder (or the metadata file itself); data.text_column picks the
raw (1) or the normalized (2) text. Many corpora in this layout drop the second
copy of the text: an ``id|text`` line is read too, with that text.
"""

from __future__ import annotations

from typing import ClassVar

from ringfeed.shared.corpus.format import Context, LineFormat


def reason(fields: list[str], column: int) -> str:
    """Why a line split into `fields` is not a clip ("" if it is)."""
    if len(fields) not in (2, 3):
        return (
            f"expected 'id|text|normalized' or 'id|text' ('|'-separated), got {len(fields)} columns"
        )
    if not fields[0].strip():
        return "empty item id"
    if not fields[min(column, len(fields) - 1)].strip():
        return f"empty text in column {column + 1} (data.text_column={column})"
    return ""


class LJSpeech(LineFormat):
    name: ClassVar[str] = "ljspeech"
    file_name: ClassVar[str] = "metadata.csv"
    expects: ClassVar[str] = "a directory holding metadata.csv, or the file itself"

    def rows(self, texts: list[str], context: Context) -> list[tuple | str]:
        """One loop with no call per good line (the build's hot path); the setting is
        data.text_column."""
        setting = context.setting
        out: list[tuple | str] = []
        append = out.append
        for line in texts:
            fields = line.split("|")
            if len(fields) in (2, 3):  # id|text too: that text whatever text_column says
                item_id, text = fields[0].strip(), fields[min(setting, len(fields) - 1)].strip()
                if item_id and text:
                    append((item_id, f"wavs/{item_id}.wav", text, "", "", 0.0, 0.0))
                    continue
            append(reason(fields, setting))
        return out
