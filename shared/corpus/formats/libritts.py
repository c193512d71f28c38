"""LibriTTS and LibriTTS-R: ``<speaker>/<chapter>/<utt>.wav`` with its text beside it,
``<utt>.normalized.txt`` (data.text_column 2) or ``<utt>.original.txt`` (1).

data.path is a subset (train-clean-100) or the LibriTTS root holding several. The
speaker is the utterance id's first part (``<speaker>_<chapter>_<n>_<n>``), else
the folder two levels above the file. English unless data.language says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry
from ringfeed.shared.corpus.folders import FolderFormat, split, text_entry, walk, warn_layout

TEXT_SUFFIX = {1: ".original.txt", 2: ".normalized.txt"}


def speaker_of(txt: Path, stem: str, root: Path, mismatched: list[Path]) -> str:
    """The speaker of an utterance: its id's first part, else the folder two levels above
    it; the file is noted when the two disagree. Never the first folder under data.path,
    which is the subset (train-clean-100) when data.path is the LibriTTS root."""
    parts = stem.split("_")
    depth = len(txt.relative_to(root).parts)
    folders = (txt.parent.parent.name, txt.parent.name) if depth >= 3 else None
    if len(parts) >= 3 and parts[0] and parts[1]:
        if folders != (parts[0], parts[1]):
            mismatched.append(txt)
        return parts[0]
    mismatched.append(txt)
    return folders[0] if folders else ""


class LibriTTS(FolderFormat):
    name: ClassVar[str] = "libritts"

    def read(self, cfg: Config, root: str) -> tuple[list[Entry], list[BadLine]]:
        suffix = TEXT_SUFFIX[cfg.data.text_column]
        results = []
        mismatched: list[Path] = []
        top = Path(root)
        for txt in walk(top):
            if txt.name.endswith(suffix):
                stem = txt.name.removesuffix(suffix)
                speaker = speaker_of(txt, stem, top, mismatched)
                results.append(text_entry(txt, txt.with_name(stem + ".wav"), stem, speaker, root))
        if not results:
            raise CorpusError(
                f"data.path: no *{suffix} files under {root} (data.format: libritts expects "
                "<speaker>/<chapter>/<utterance>.wav with its text beside it)"
            )
        warn_layout(mismatched, "<speaker>/<chapter>/<speaker>_<chapter>_<n>_<n>")
        return split(results)
