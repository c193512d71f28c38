"""The optional fields of a sample: pitch, voiced, energy and the user's own.

Called in producer processes by the sample pipeline (producer/pipeline.py), after
the mel, on the decoded waveform. Which fields exist is the declared schema's
business (shared/sample/schema.py, from features.pitch, features.energy and
features.user_fields); this module computes them, checks the user's, and keeps
them in the feature cache beside the mel, each group under its own key:

    blake2b(mel key, group name, version[, the entry's id, text, speaker, language])

where a group is "pitch" (f0 and voiced, one [n, 2] entry), "energy", or one user
field, and the version is PROSODY_VERSION (producer/features/prosody.py) or
features.user_version. So turning a field on or off never invalidates the
mels, and a new user_version recomputes only the user's fields. A user field's
key also holds the entry: the function sees the text and the entry, and two
entries may share one audio file (the end-to-end test caught a clip's text-derived
field served to another entry of the same file).

The user's function ("module:function", features.user_function) is called as
``function(wave, mel, text, entry)``: wave float32 [n] at audio.sample_rate
(after trimming, normalizing and fitting to max_frames), mel float32 [frames,
n_mels] (None with features.device: stager), text the entry's raw text, entry the
corpus entry (shared/corpus/entry.py Entry, a NamedTuple read by attribute:
item_id, audio_path, speaker, language, ...; docs/sample-fields.md#fields-of-your-own).
It returns a mapping of field name -> array for every declared field. Its exceptions
are that sample's failure (the pipeline quarantines it with stage "user"); an output
of the wrong shape or dtype is refused with a message naming the field and both
shapes.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ringfeed.producer.features.prosody import PROSODY_VERSION
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.sample.schema import FieldDecl

UserFunction = Callable[..., Mapping[str, Any]]


def load_user_function(spec: str) -> UserFunction:
    """Import features.user_function ("module:function"); ConfigError saying what to
    change when it cannot be found."""
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"features.user_function={spec!r}: cannot import {module_name}: "
            f"{exc} (is it on PYTHONPATH?)"
        ) from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError(
            f"features.user_function={spec!r}: {module_name} has no function {func_name}"
        )
    return func


def expected_shape(f: FieldDecl, n_frames: int, n_tokens: int, got: tuple[int, ...]) -> tuple:
    """The shape field f must have for a sample of n_frames mel frames and n_tokens
    tokens; for length "own" any length 1..shape[0] (taken from `got`) is right."""
    if f.length == "frames":
        return (n_frames, *f.inner)
    if f.length == "tokens":
        return (n_tokens, *f.inner)
    if f.length == "own":
        n = got[0] if got and 1 <= got[0] <= f.shape[0] else f"1..{f.shape[0]}"
        return (n, *f.inner)
    return f.shape


def check_user_output(
    out: Any, decls: list[FieldDecl], n_frames: int, n_tokens: int, spec: str
) -> dict[str, np.ndarray]:
    """The user's arrays, checked and cast to their declared dtypes; raises SkipSample
    (stage "user") naming the field and both shapes when one does not fit."""

    def refuse(why: str) -> SkipSample:
        return SkipSample(f"features.user_function {spec}: {why}", stage="user")

    if not isinstance(out, Mapping):
        raise refuse(f"returned {type(out).__name__}, need a dict of field name -> array")
    names = {f.name for f in decls}
    unknown = sorted(set(out) - names)
    missing = sorted(names - set(out))
    if unknown or missing:
        raise refuse(
            f"returned fields {sorted(out)}, declared {sorted(names)} "
            "(features.user_fields): return exactly those"
        )
    arrays = {}
    for f in decls:
        x = np.asarray(out[f.name])
        want = expected_shape(f, n_frames, n_tokens, x.shape)
        if x.shape != want:
            raise refuse(
                f"field {f.name!r} has shape {x.shape}, declared {want} "
                f"(length: {f.length}; this sample has {n_frames} mel frames, "
                f"{n_tokens} tokens)"
            )
        if not np.can_cast(x.dtype, f.dtype, "same_kind"):
            raise refuse(f"field {f.name!r} has dtype {x.dtype}, declared {f.dtype}")
        if x.size and x.dtype.kind in "iu" and np.dtype(f.dtype).kind in "iu":
            # int64 -> int32 is "same_kind" and wraps: 2**32 + 7 would arrive as 7.
            bounds = np.iinfo(f.dtype)
            if x.min() < bounds.min or x.max() > bounds.max:
                raise refuse(
                    f"field {f.name!r} holds {x.min()}..{x.max()}, beyond "
                    f"{f.dtype}'s {bounds.min}..{bounds.max}"
                )
        arrays[f.name] = np.ascontiguousarray(x, dtype=f.dtype)
    return arrays


def read_only(x: np.ndarray) -> np.ndarray:
    view = x.view()
    view.flags.writeable = False
    return view


class ExtraFields:
    """The optional fields of one producer's samples: what to compute, and their cache."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        f = cfg.features
        self.pitch, self.energy = f.pitch, f.energy
        self.user_decls = [d for d in cfg.schema.extras if d.origin == "user"]
        self.user: UserFunction | None = (
            load_user_function(f.user_function) if self.user_decls else None
        )
        self.active = bool(self.pitch or self.energy or self.user_decls)
        # Cache groups: name -> (version, the fields it holds).
        self.groups: dict[str, tuple[str, list[FieldDecl]]] = {}
        schema = cfg.schema
        if self.pitch:
            self.groups["pitch"] = (PROSODY_VERSION, [schema["pitch"], schema["voiced"]])
        if self.energy:
            self.groups["energy"] = (PROSODY_VERSION, [schema["energy"]])
        # The user's function sees no mel with features.device: stager: its output is kept
        # apart from the producer mode's (the mels themselves are the same).
        user_version = f.user_version if f.device == "producer" else f"{f.user_version}\0no mel"
        for d in self.user_decls:
            self.groups[d.name] = (user_version, [d])

    def call_user(
        self, wave: np.ndarray, mel: np.ndarray | None, n_frames: int, n_tokens: int, entry: Any
    ) -> dict[str, np.ndarray]:
        """The user's fields for one sample (their exceptions propagate: the sample's)."""
        assert self.user is not None
        # Read-only views: a function that edited them in place (mel -= mel.mean()) would
        # change the delivered sample and the feature cache; now it raises, for that clip.
        out = self.user(read_only(wave), None if mel is None else read_only(mel), entry.text, entry)
        spec = self.cfg.features.user_function
        return check_user_output(out, self.user_decls, n_frames, n_tokens, spec)

    @staticmethod
    def group_key(key: bytes, group: str, version: str) -> bytes:
        return hashlib.blake2b(
            b"\0".join([key, group.encode(), version.encode()]), digest_size=16
        ).digest()

    def group_keys(self, key: bytes, entry: Any) -> dict[str, bytes]:
        """The cache key of each group for the entry whose audio has mel key `key`."""
        user = "\0".join([entry.item_id, entry.text, entry.speaker, entry.language])
        return {
            group: self.group_key(
                key, group, version if d[0].origin == "builtin" else f"{version}\0{user}"
            )
            for group, (version, d) in self.groups.items()
        }

    def from_cache(
        self, get: Callable[[bytes], Any], key: bytes, entry: Any
    ) -> dict[str, np.ndarray] | None:
        """Every optional field from the cache (get: FeatureCache.get), or None when one
        group is missing (the sample is then computed whole)."""
        fields: dict[str, np.ndarray] = {}
        keys = self.group_keys(key, entry)
        for group, (_, decls) in self.groups.items():
            hit = get(keys[group])
            if hit is None:
                return None
            fields.update(_unpack(hit[0], decls))
        return fields

    def to_cache(
        self,
        put: Callable[[bytes, np.ndarray, bool], Any],
        key: bytes,
        entry: Any,
        fields: dict[str, np.ndarray],
        truncated: bool,
    ) -> None:
        """Write every group of `fields` (put: FeatureCache.put)."""
        keys = self.group_keys(key, entry)
        for group, (_, decls) in self.groups.items():
            put(keys[group], _pack(fields, decls), truncated)


def _pack(fields: dict[str, np.ndarray], decls: list[FieldDecl]) -> np.ndarray:
    """A group's arrays as one float32 [rows, cols] cache entry, bit for bit: int32
    values are viewed as float32, never converted; several fields side by side."""
    cols = []
    for d in decls:
        x = fields[d.name]
        x = x.reshape(x.shape[0], -1) if x.ndim else x.reshape(1, 1)
        cols.append(x.view(np.float32) if x.dtype.itemsize == 4 else x.astype(np.float32))
    return np.concatenate(cols, axis=1) if len(cols) > 1 else cols[0]


def _unpack(array: np.ndarray, decls: list[FieldDecl]) -> dict[str, np.ndarray]:
    array = array.reshape(array.shape[0], -1)
    out, col = {}, 0
    for d in decls:
        width = int(np.prod(d.inner)) if d.length != "none" else int(np.prod(d.shape[1:]))
        part = np.ascontiguousarray(array[:, col : col + width])
        col += width
        x = part.view(d.dtype) if d.dtype.itemsize == 4 else part.astype(d.dtype)
        out[d.name] = (
            x.reshape((array.shape[0], *d.shape[1:]))
            if d.length == "none"
            else (x.reshape((array.shape[0], *d.inner)))
        )
    return out
