"""WebDataset-style tar shards: indexed once, read by random access.

``data.format: shards`` and ``data.path`` a folder (or an object-store prefix,
shared/corpus/object_store.py) of ``*.tar`` shards, read in sorted name order. Each clip
is the members that share a key (the member name up to the first dot of its base
name, WebDataset's rule): its audio (``.wav``, ``.flac`` or ``.mp3``) and its text,
either ``.txt`` or ``.json`` (``{"text": ..., "speaker": ..., "language": ...}``)::

    LJ001-0001.wav  LJ001-0001.txt  LJ001-0002.flac  LJ001-0002.json ...

Per shard a member index (each key's audio offset and size in the tar, its text,
speaker and language) is built once by reading the tar headers and the small text
members, never the audio, and cached beside the feature cache under a hash of the
shard's name, size and mtime (``shards/<hash>.json``): a corpus index rebuilt after
one shard was added scans that shard only. The corpus index (shared/corpus/index.py)
stores every clip as one line with its shard (relative to data.path) and its audio
member's (offset, size), so the deterministic plan, exactly-once and O(1) resume
work across shards as for loose files: a producer reads one clip with one ranged
read (:func:`read_member`). A clip whose member is corrupt fails its decode and is
quarantined with the reason; a tar header that cannot be read ends that shard's
scan there, counted as an unusable line naming the shard and the byte.

A clip's item id (docs/corpora.md#item-ids) is ``<shard>/<key>``: the shard's name
without ``.tar``, and the key, which a tar holds once; shards written a speaker each,
each with its ``0001``, give distinct ids by construction. The same sample twice
(the same key, text, speaker, language and audio bytes) is used once
(shared/corpus/repeats.py). A folder whose shards name splits the Hub's way
(``train-0000.tar``, ``test-0000.tar``) is read a split at a time (data.split,
shared/corpus/splits.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import tarfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import AUDIO_EXTENSIONS, BadLine, CorpusError, Entry
from ringfeed.shared.corpus.format import Scan, StoredFormat, data_path
from ringfeed.shared.corpus.object_store import is_remote, list_shards, scan_remote
from ringfeed.shared.corpus.repeats import range_reader, repeats
from ringfeed.shared.corpus.splits import Splits, choose_split
from ringfeed.shared.language.codes import language_code, valid_code

log = logging.getLogger(__name__)

SHARD_SUFFIX = ".tar"
TEXT_EXTENSIONS = (".txt", ".json")
MEMBER_INDEX_VERSION = 1
# A text member larger than this is not read (a clip's text is a few hundred bytes).
MAX_TEXT_BYTES = 1 << 16


def split_key(name: str) -> tuple[str, str]:
    """(key, extension with its dot) of a member name: the base name up to its first dot."""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem) if folder else stem, dot + ext.lower()


def shard_names(cfg: Config) -> tuple[str, list[tuple[str, int, str]]]:
    """(root, [(shard name relative to root, size, version stamp)]) in sorted name order,
    of data.split's split."""
    root, found = every_shard(cfg)
    return root, choose_split(found, cfg.data.split, root)[0]


def every_shard(cfg: Config) -> tuple[str, list[tuple[str, int, str]]]:
    """shard_names(), of every split."""
    if is_remote(cfg.data.path):
        return list_shards(cfg)
    root = data_path(cfg)
    if not root.is_dir():
        raise CorpusError(
            f"data.path: {root} is not a folder of {SHARD_SUFFIX} shards (data.format: shards)"
        )
    found = []
    for name in sorted(os.listdir(root)):
        if name.endswith(SHARD_SUFFIX):
            st = os.stat(root / name)
            found.append((name, st.st_size, str(st.st_mtime_ns)))
    if not found:
        raise CorpusError(f"data.path: no *{SHARD_SUFFIX} shards in {root} (data.format: shards)")
    return str(root), found


def _text_fields(raw: bytes, ext: str) -> tuple[str, str, str] | str:
    """(text, speaker, language) of a text member, or why it is unusable."""
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"text member is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if ext == ".txt":
        return (decoded.strip(), "", "") if decoded.strip() else "empty text"
    try:
        obj = json.loads(decoded)
    except ValueError as exc:
        return f"json member is not JSON ({str(exc)[:100]})"
    if not isinstance(obj, dict):
        return "json member is not an object"
    text, speaker, language = obj.get("text"), obj.get("speaker", ""), obj.get("language", "")
    if not isinstance(text, str) or not text.strip():
        return "no 'text' (a non-empty string) in the json member"
    if not isinstance(speaker, str) or not isinstance(language, str):
        return "'speaker' and 'language' must be strings"
    if language and not valid_code(language):
        return f"'language' must be a code such as en, de or pt-br, got {language!r}"
    return text.strip(), speaker.strip(), language_code(language) if language else ""


def _check_end(fileobj: Any, offset: int, shard: str, bad: list[list[Any]]) -> None:
    """tarfile ends a scan at an invalid header past the first as if it were the end of
    the archive; a real end is a zero block (or the end of the file)."""
    fileobj.seek(offset)
    block = fileobj.read(512)
    if block.strip(b"\0"):
        bad.append(
            [
                "",
                f"shard {shard}: unreadable tar header at byte {offset}: the "
                "members after it are lost",
            ]
        )


def scan_shard(fileobj: Any, shard: str, strict: bool = False) -> dict[str, Any]:
    """The member index of one tar: {"items": [[key, audio offset, audio size, text,
    speaker, language]...], "bad": [[key, reason]...]}; reads headers and text members.
    strict: an OSError (a remote read that broke) is raised, for the caller to retry."""
    groups: OrderedDict[str, dict[str, Any]] = OrderedDict()
    bad: list[list[Any]] = []
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            while True:
                try:
                    member = tar.next()
                except tarfile.TarError as exc:
                    why = f"unreadable tar header at byte {tar.offset} ({exc})"
                    bad.append(["", f"shard {shard}: {why}: the members after it are lost"])
                    break
                if member is None:  # the end, or a header tarfile gave up on in silence
                    _check_end(fileobj, tar.offset, shard, bad)
                    break
                if not member.isfile():
                    continue
                key, ext = split_key(member.name)
                group = groups.setdefault(key, {})
                if ext in AUDIO_EXTENSIONS:
                    group["audio"] = (member.offset_data, member.size)
                elif ext in TEXT_EXTENSIONS and member.size <= MAX_TEXT_BYTES:
                    handle = tar.extractfile(member)
                    group["text"] = _text_fields(handle.read() if handle else b"", ext)
    except (tarfile.TarError, OSError) as exc:
        if strict and isinstance(exc, OSError):
            raise
        bad.append(["", f"shard {shard}: not a readable tar file ({exc})"])
    items = []
    for key, group in groups.items():
        text = group.get("text", f"no text member ({'/'.join(TEXT_EXTENSIONS)}) for this key")
        if "audio" not in group:
            bad.append([key, f"no audio member ({'/'.join(AUDIO_EXTENSIONS)}) for this key"])
        elif isinstance(text, str):
            bad.append([key, text])
        else:
            items.append([key, *group["audio"], *text])
    return {"items": items, "bad": bad}


def member_index(cfg: Config, root: str, name: str, size: int, stamp: str) -> dict[str, Any]:
    """One shard's member index, from its cache file or scanned (then cached)."""
    ident = json.dumps([MEMBER_INDEX_VERSION, root, name, size, stamp]).encode()
    cache = (
        Path(cfg.features.cache_dir)
        / "shards"
        / (hashlib.blake2b(ident, digest_size=12).hexdigest() + ".json")
    )
    try:
        return json.loads(cache.read_text("utf-8"))
    except (OSError, ValueError):
        pass
    if is_remote(root):
        found = scan_remote(cfg, f"{root}/{name}", lambda f: scan_shard(f, name, strict=True))
    else:
        with open(os.path.join(root, name), "rb") as f:
            found = scan_shard(f, name)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(found, ensure_ascii=False), "utf-8")
        os.replace(tmp, cache)
    except OSError as exc:  # a cache that cannot be written costs a scan next time only
        log.warning("shard member index not cached (%s): %s", cache, exc)
    return found


def shards_stamp(cfg: Config) -> str:
    """A hash of every shard's name, size and version: the corpus index's source stamp."""
    root, shards = shard_names(cfg)
    return hashlib.blake2b(json.dumps([root, shards]).encode(), digest_size=16).hexdigest()


class Shards(StoredFormat):
    name: ClassVar[str] = "shards"
    remote: ClassVar[bool] = True
    shards: ClassVar[bool] = True
    has_splits: ClassVar[bool] = True
    in_memory_ok: ClassVar[bool] = False

    def locate(self, cfg: Config) -> str:
        return shard_names(cfg)[0]

    def root(self, cfg: Config) -> str:
        path = cfg.data.path
        return path.rstrip("/") if is_remote(path) else str(data_path(cfg))

    def stamp(self, cfg: Config) -> list:
        return ["shards", shards_stamp(cfg)]

    def splits(self, cfg: Config) -> Splits:
        root, found = every_shard(cfg)
        return choose_split(found, cfg.data.split, root)[1]

    def scan(self, cfg: Config, builder: Any) -> None:
        """Every shard's member index into builder, and the shards' item counts into its
        header: items of a shard are consecutive (data.shard_window deals them)."""
        root, shards = shard_names(cfg)
        samples = []  # (shard, 1-based place in it, its member index's item: key, offset, ...)
        bad: list[BadLine] = []
        for name, size, stamp in shards:
            found = member_index(cfg, root, name, size, stamp)
            samples += [(name, j, item) for j, item in enumerate(found["items"], 1)]
            where = f"{root}/{name}"
            bad += [
                BadLine(where, 1, reason, sample_id(name, key) if key else "")
                for key, reason in found["bad"]
            ]
        read = range_reader(cfg, root)
        twice = repeats(
            np.fromiter((hash(_same(i)) for *_, i in samples), np.int64, len(samples)),
            lambda k: _same(samples[k][2]),
            lambda k: read(samples[k][0], *samples[k][2][1:3]),
        )
        entries, kept = [], []  # kept: each entry's place in samples
        counts: dict[str, int] = dict.fromkeys((name for name, _, _ in shards), 0)
        for k, (name, at, (key, offset, length, text, speaker, language)) in enumerate(samples):
            if k in twice:
                first = samples[twice[k]][0]
                why = (
                    f"duplicate sample {key!r}: the same as in {root}/{first} (its text, "
                    "speaker, language and audio bytes): used once"
                )
                bad.append(BadLine(f"{root}/{name}", at, why, sample_id(first, key)))
                continue
            entries.append(
                Entry(
                    sample_id(name, key), name, text, speaker, language, 0.0, 0.0, (offset, length)
                )
            )
            kept.append(k)
            counts[name] += 1
        log.info("shards: %d shards, %d clips, %d unusable", len(shards), len(entries), len(bad))
        before = [samples[k][2][0] for k in kept]  # the ids before: the keys alone
        shard_of = [samples[k][0] for k in kept]  # not the samples: they go once scanned
        at = np.fromiter((samples[k][1] for k in kept), np.int64, len(kept))
        place = lambda item: (f"{root}/{shard_of[item]}", int(at[item]))  # noqa: E731
        builder.add_stored(Scan(entries, bad, place, before))
        builder.header["shards"] = [[name, n] for name, n in counts.items()]


def _same(item: list) -> tuple:
    """What makes two samples the same (shared/corpus/repeats.py): key, text, speaker,
    language and audio size; then their audio bytes."""
    return item[0], item[3], item[4], item[5], item[2]


def sample_id(shard: str, key: str) -> str:
    """A sample's item id: its shard without .tar, and its key (module docstring)."""
    return f"{shard.removesuffix(SHARD_SUFFIX)}/{posixpath.normpath(key).lstrip('/')}"
