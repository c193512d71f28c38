"""VCTK 0.92 and 0.80: ``txt/<speaker>/<utt>.txt``, the audio in
``wav48_silence_trimmed/<speaker>/<utt>_mic1.flac`` (0.92) or
``wav48/<speaker>/<utt>.wav`` (0.80). English unless data.language says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import BadLine, CorpusError, Entry
from ringfeed.shared.corpus.folders import FolderFormat, split, text_entry, walk, warn_layout

AUDIO = (("wav48_silence_trimmed", "_mic1.flac"), ("wav48", ".wav"))


class Vctk(FolderFormat):
    name: ClassVar[str] = "vctk"

    def read(self, cfg: Config, root: str) -> tuple[list[Entry], list[BadLine]]:
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
            if txt.parent.parent != txt_root or not txt.stem.startswith(f"{speaker}_"):
                mismatched.append(txt)
            candidates = [top / d / speaker / f"{txt.stem}{end}" for d, end in AUDIO]
            audio = next((c for c in candidates if c.is_file()), candidates[0])
            results.append(text_entry(txt, audio, txt.stem, speaker, root))
        warn_layout(mismatched, "txt/<speaker>/<speaker>_<n>.txt")
        return split(results)
