"""VCTK 0.92 and 0.80: ``txt/<speaker>/<utt>.txt``, the audio in
``wav48_silence_trimmed/<speaker>/<utt>_mic1.flac`` (0.92) or
``wav48/<speaker>/<utt>.wav`` (0.80). English unless data.language says otherwise.

The item id is the utterance's name where it starts with its speaker's folder, as
VCTK's do (``p225_001``); any other text file's id is its path under ``txt/`` without
``.txt`` (``spk_a/001``), so names that repeat across speakers are distinct items
(docs/corpora.md#item-ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.folders import FolderFormat, scanned, text_entry, walk, warn_layout
from ringfeed.shared.corpus.format import Scan

AUDIO = (("wav48_silence_trimmed", "_mic1.flac"), ("wav48", ".wav"))


class Vctk(FolderFormat):
    name: ClassVar[str] = "vctk"

    def read(self, cfg: Config, root: str) -> Scan:
        top = Path(root)
        txt_root = top / "txt"
        if not txt_root.is_dir():
            raise CorpusError(f"data.path: {root} has no txt/ folder (data.format: vctk)")
        results = []
        mismatched: list[Path] = []
        for txt in walk(txt_root):
            if txt.suffix != ".txt":
                continue
            speaker = txt.parent.name
            item_id = txt.stem
            if txt.parent.parent != txt_root or not txt.stem.startswith(f"{speaker}_"):
                mismatched.append(txt)
                item_id = txt.relative_to(txt_root).with_suffix("").as_posix()
            candidates = [top / d / speaker / f"{txt.stem}{end}" for d, end in AUDIO]
            audio = next((c for c in candidates if c.is_file()), candidates[0])
            results.append((text_entry(txt, audio, item_id, speaker, root), txt, txt.stem))
        warn_layout(mismatched, "txt/<speaker>/<speaker>_<n>.txt")
        return scanned(results)
