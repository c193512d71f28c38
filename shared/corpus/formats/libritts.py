"""LibriTTS and LibriTTS-R: ``<speaker>/<chapter>/<utt>.wav`` with its text beside it,
``<utt>.normalized.txt`` (data.text_column 2) or ``<utt>.original.txt`` (1).

data.path is a subset (train-clean-100) or the LibriTTS root holding several. The
speaker is the utterance id's first part (``<speaker>_<chapter>_<n>_<n>``), else
the folder two levels above the file. English unless data.language says otherwise.

The item id is the utterance id where it names the speaker and chapter folders the
file is in, as LibriTTS's do (unique across its subsets, the name aligners and papers
use); any other file's id is its path under data.path without the text suffix
(``spk/chap/0001``), so names that repeat across folders are distinct items
(docs/corpora.md#item-ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.folders import FolderFormat, scanned, text_entry, walk, warn_layout
from ringfeed.shared.corpus.format import Scan

TEXT_SUFFIX = {1: ".original.txt", 2: ".normalized.txt"}


def speaker_of(txt: Path, stem: str, root: Path) -> tuple[str, bool]:
    """(the speaker of an utterance, whether the file is laid out as LibriTTS's): its
    id's first part, else the folder two levels above it. Never the first folder under
    data.path, which is the subset (train-clean-100) when data.path is the LibriTTS
    root."""
    parts = stem.split("_")
    depth = len(txt.relative_to(root).parts)
    folders = (txt.parent.parent.name, txt.parent.name) if depth >= 3 else None
    if len(parts) >= 3 and parts[0] and parts[1]:
        return parts[0], folders == (parts[0], parts[1])
    return (folders[0] if folders else ""), False


class LibriTTS(FolderFormat):
    name: ClassVar[str] = "libritts"

    def read(self, cfg: Config, root: str) -> Scan:
        suffix = TEXT_SUFFIX[cfg.data.text_column]
        results = []
        mismatched: list[Path] = []
        top = Path(root)
        for txt in walk(top):
            if txt.name.endswith(suffix):
                stem = txt.name.removesuffix(suffix)
                speaker, laid_out = speaker_of(txt, stem, top)
                item_id = stem
                if not laid_out:
                    mismatched.append(txt)
                    item_id = txt.relative_to(top).as_posix().removesuffix(suffix)
                found = text_entry(txt, txt.with_name(stem + ".wav"), item_id, speaker, root)
                results.append((found, txt, stem))
        if not results:
            raise CorpusError(
                f"data.path: no *{suffix} files under {root} (data.format: libritts expects "
                "<speaker>/<chapter>/<utterance>.wav with its text beside it)"
            )
        warn_layout(mismatched, "<speaker>/<chapter>/<speaker>_<chapter>_<n>_<n>")
        return scanned(results)
