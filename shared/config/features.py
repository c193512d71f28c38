"""The configuration's features section and the sample fields it declares.

Part of the one configuration (shared/config/config.py); validates its own keys
(:func:`validate_features`: the optional fields follow from the ring, whose field
names are at most 16 bytes and at most MAX_SAMPLE_FIELDS a sample, and from the
batch, where a user field's lengths travel as ``<name>_lens``).
:func:`sample_decls` is the one place where keys become declared fields
(shared/sample/schema.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ringfeed.shared.config.environment import user_cache_dir
from ringfeed.shared.config.loader import at_least_one, check
from ringfeed.shared.sample.schema import MAX_SAMPLE_FIELDS, RESERVED, FieldDecl

if TYPE_CHECKING:
    from ringfeed.shared.config import Config


@dataclass(frozen=True)
class UserFieldConfig:
    """A field of the user's own (docs/sample-fields.md#fields-of-your-own): features.user_function
    returns it by name; its length axis (axis 0 of shape) follows the mel frames,
    the tokens, its own length up to shape[0], or there is none."""

    name: str = ""
    dtype: Literal["float32", "int32"] = "float32"
    shape: tuple[int, ...] = ()
    length: Literal["frames", "tokens", "own", "none"] = "none"
    pad: float = 0.0


@dataclass(frozen=True)
class FeaturesConfig:
    # STFT size of the log-mel, samples.
    n_fft: int = 1024
    # Samples between mel frames.
    hop_length: int = 256
    # STFT window (Hann), samples.
    win_length: int = 1024
    # Mel bands (Slaney filterbank, as librosa).
    n_mels: int = 80
    # Lowest mel band edge, Hz.
    fmin: float = 0.0
    # Highest mel band edge, Hz.
    fmax: float = 8000.0
    # Mel frames per sample slot (the longest clip: max_frames x hop_length / sample_rate s).
    max_frames: int = 800
    # A clip or text longer than its slot: skip it (quarantined, counted) or truncate it.
    on_too_long: Literal["skip", "truncate"] = "skip"
    # producer: producers compute the mel; stager: producers write the waveform and
    # the stager computes mels for the whole batch on its device (the feature cache holds
    # mels either way: a clip found there comes as its mel).
    device: Literal["producer", "stager"] = "producer"
    # Where the feature cache, the corpus index, the length table, the text cache and the
    # host's FFT choice live. "" = the per-user cache, $XDG_CACHE_HOME/ringfeed/features
    # (~/.cache/ringfeed/features), whatever the working directory; a relative path (a
    # run's own cache) is relative to the working directory, as run_root.
    cache_dir: str = ""
    # Keep each clip's features on disk, so later epochs skip decode and mel (with
    # features.device: stager, the stager keeps the mels it computes).
    cache: bool = True
    # Sample field ref_mel (docs/sample-fields.md#the-built-in-fields): the log-mel of another
    # clip of the
    # same speaker, chosen from seed, epoch and item.
    reference: bool = False
    # Longest reference, mel frames (a longer clip is cut from a drawn offset).
    reference_frames: int = 200
    # A speaker with no other clip that reads: own (the clip is its own reference, counted)
    # or skip the item.
    single_clip: Literal["own", "skip"] = "own"
    # Sample fields pitch (f0 per mel frame, Hz, 0 unvoiced) and voiced: pyworld DIO +
    # StoneMask, ~13 ms per second of audio.
    pitch: bool = False
    # The pitch field as FastPitch trains on it: none (Hz); speaker or global: log-f0 minus
    # its mean over voiced frames, over its standard deviation, per speaker or over the
    # corpus (0 on unvoiced frames), from the table `ringfeed prepare CONFIG` computes
    # (shared/run/prosody_table.py; in every checkpoint, so inference can invert it).
    pitch_norm: Literal["none", "global", "speaker"] = "none"
    # Sample field energy: the L2 norm of each mel frame's STFT magnitude (bins <= fmax).
    energy: bool = False
    # Fields of your own: "module:function", called as function(wave, mel, text, entry)
    # and returning one array per features.user_fields entry
    # (docs/sample-fields.md#fields-of-your-own).
    user_function: str = ""
    # The version of user_function's output in the feature cache and in the cause of a
    # quarantine line of stage user: change it when the function changes (a new one
    # tries the items it had quarantined again).
    user_version: str = ""
    # The fields user_function returns: each {name, dtype: float32 | int32, shape,
    # length: frames | tokens | own | none, pad}.
    user_fields: tuple[UserFieldConfig, ...] = ()
    # Sample field durations (mel frames per token) from <durations_dir>/<item_id>.durations,
    # checked to sum to the mel frames; "" = none.
    durations_dir: str = ""

    def __post_init__(self) -> None:
        if not self.cache_dir:  # never the working directory unasked: a mel computed
            # through the API from another folder wrote its FFT choice there
            object.__setattr__(self, "cache_dir", str(user_cache_dir() / "features"))
        validate_features(self)


# "<name>_lens" must fit the ring's 16-byte field names.
MAX_USER_NAME = 11
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def validate_features(f: FeaturesConfig) -> None:
    """Every check of the features section alone; ConfigError naming the key."""
    at_least_one(
        "features",
        n_fft=f.n_fft,
        hop_length=f.hop_length,
        win_length=f.win_length,
        n_mels=f.n_mels,
        max_frames=f.max_frames,
    )
    check(
        f.win_length <= f.n_fft,
        "features.win_length",
        f"{f.win_length} > features.n_fft={f.n_fft}: lower win_length or raise n_fft",
    )
    stager = f.device == "stager"
    for key in ("pitch", "energy"):
        check(
            not (stager and getattr(f, key)),
            f"features.{key}",
            "needs the mel's STFT on the producer: set features.device: producer "
            f"or features.{key}: false",
        )
    check(
        f.pitch_norm == "none" or f.pitch,
        "features.pitch_norm",
        "normalizes the pitch field: set features.pitch: true, or pitch_norm: none",
    )
    check(
        not f.reference or 1 <= f.reference_frames <= f.max_frames,
        "features.reference_frames",
        f"{f.reference_frames}: must be 1..features.max_frames={f.max_frames}",
    )
    _validate_user_fields(f.user_fields, stager)
    n = 2 + f.reference + 2 * f.pitch + f.energy + bool(f.durations_dir) + len(f.user_fields)
    why = f"a sample would hold {n} fields, at most {MAX_SAMPLE_FIELDS}: declare fewer"
    check(n <= MAX_SAMPLE_FIELDS, "features.user_fields", why)
    _validate_user_function(f)


def _validate_user_fields(fields: Any, stager: bool) -> None:
    """features.user_fields: names, shapes and lengths a ring and a batch can hold."""
    names: set[str] = set()
    for i, u in enumerate(fields):
        key = f"features.user_fields[{i}]"
        check(
            bool(_NAME.match(u.name)) and len(u.name) <= MAX_USER_NAME,
            f"{key}.name",
            f"{u.name!r}: use 1..{MAX_USER_NAME} lowercase letters, digits or _ (a letter first)",
        )
        check(
            u.name not in RESERVED and not u.name.endswith("_lens"),
            f"{key}.name",
            f"{u.name!r} is a built-in field's name: pick another",
        )
        check(u.name not in names, f"{key}.name", f"{u.name!r} is declared twice")
        names.add(u.name)
        check(
            all(d >= 1 for d in u.shape) and len(u.shape) <= 3,
            f"{key}.shape",
            f"{list(u.shape)}: at most 3 dimensions, each >= 1",
        )
        if u.length in ("own", "none"):
            check(
                len(u.shape) >= 1,
                f"{key}.shape",
                f"length {u.length} needs a shape of at least one dimension "
                "(axis 0: the length, or the field's size)",
            )
        else:
            check(
                len(u.shape) <= 2,
                f"{key}.shape",
                f"{list(u.shape)} is the shape of one {u.length[:-1]}'s row: at most 2 dimensions",
            )
        check(
            not (stager and u.length == "frames"),
            f"{key}.length",
            "frames follows the producer's mel: set features.device: producer",
        )


def _validate_user_function(f: Any) -> None:
    """features.user_function, user_fields and user_version: all or none."""
    spec = f.user_function
    if f.user_fields or spec:
        module, sep, func = spec.partition(":")
        check(
            bool(sep and module and func),
            "features.user_function",
            f"{spec!r}: write it as 'package.module:function' (it returns the "
            "features.user_fields by name)",
        )
        check(
            bool(f.user_fields),
            "features.user_fields",
            f"features.user_function={spec!r} declares no field: list its fields here",
        )
        check(
            bool(f.user_version),
            "features.user_version",
            "name your function's version (e.g. 'v1'): the feature cache keeps its "
            "output under it; change it when the function changes",
        )


def sample_decls(cfg: Config) -> tuple[FieldDecl, ...]:
    """The sample's fields in ring order: the built-ins as features.* asks, then the
    user's (features.user_fields)."""
    f, frames = cfg.features, cfg.features.max_frames
    f32 = np.dtype(np.float32)
    decls = [FieldDecl("tokens", np.dtype(np.int32), (cfg.text.max_text_len,), "tokens")]
    if f.device == "producer":
        decls.append(FieldDecl("mel", f32, (frames, f.n_mels), "frames"))
    else:
        decls.append(FieldDecl("wave", f32, (cfg.max_samples,), "own"))
    if f.reference:
        decls.append(FieldDecl("ref_mel", f32, (f.reference_frames, f.n_mels), "own"))
    if f.pitch:
        decls.append(FieldDecl("pitch", f32, (frames,), "frames"))
        decls.append(FieldDecl("voiced", np.dtype(np.uint8), (frames,), "frames"))
    if f.energy:
        decls.append(FieldDecl("energy", f32, (frames,), "frames"))
    if f.durations_dir:
        decls.append(FieldDecl("durations", np.dtype(np.int32), (cfg.text.max_text_len,), "tokens"))
    for u in f.user_fields:
        shape = (
            (frames, *u.shape)
            if u.length == "frames"
            else ((cfg.text.max_text_len, *u.shape) if u.length == "tokens" else u.shape)
        )
        decls.append(FieldDecl(u.name, np.dtype(u.dtype), shape, u.length, u.pad, "user"))
    return tuple(decls)
