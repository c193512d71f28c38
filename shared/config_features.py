"""The configuration's features section and the sample fields it declares.

Part of the one configuration (shared/config.py, which holds FeaturesConfig in
Config and validates it with the rest: shared/config_checks.py,
shared/field_config_checks.py); kept apart as the optional sample fields grow.
:func:`sample_decls` is the one place where keys become declared fields
(shared/sample_schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from shared.sample_schema import FieldDecl

if TYPE_CHECKING:
    from shared.config import Config


@dataclass(frozen=True)
class UserFieldConfig:
    """A field of the user's own (README, "Sample fields"): features.user_function
    returns it by name; its length axis (axis 0 of shape) follows the mel frames,
    the tokens, its own length up to shape[0], or there is none."""

    name: str = ""
    dtype: Literal["float32", "int32"] = "float32"
    shape: tuple[int, ...] = ()
    length: Literal["frames", "tokens", "own", "none"] = "none"
    pad: float = 0.0


@dataclass(frozen=True)
class FeaturesConfig:
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    max_frames: int = 800
    on_too_long: Literal["skip", "truncate"] = "skip"
    # producer: producers compute the mel; stager: producers write the waveform and
    # the stager computes mels for the whole batch on its device.
    device: Literal["producer", "stager"] = "producer"
    cache_dir: str = ".cache/features"
    cache: bool = True
    # Optional sample fields (README, "Sample fields"); off, a sample is tokens + mel.
    # reference: a log-mel of another clip of the same speaker (ref_mel), at most
    # reference_frames long; a speaker's only clip is its own reference or is skipped.
    reference: bool = False
    reference_frames: int = 200
    single_clip: Literal["own", "skip"] = "own"
    # pitch: f0 per mel frame, Hz (0 unvoiced), and a voiced flag (pyworld DIO+StoneMask).
    pitch: bool = False
    # energy: L2 norm of each mel frame's STFT magnitude (the mel's own STFT, bins <= fmax).
    energy: bool = False
    # A fields-of-your-own function, "module:function"(wave, mel, text, entry) -> arrays;
    # user_version names its output in the feature cache: change it when the function does.
    user_function: str = ""
    user_version: str = ""
    user_fields: tuple[UserFieldConfig, ...] = ()
    # Durations per token (mel frames) from <durations_dir>/<item_id>.durations, one
    # integer per token, checked to sum to the mel's frames ("" = no durations field).
    durations_dir: str = ""


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
        decls.append(FieldDecl("durations", np.dtype(np.int32), (cfg.text.max_text_len,),
                               "tokens"))  # fmt: skip
    for u in f.user_fields:
        shape = (
            (frames, *u.shape)
            if u.length == "frames"
            else ((cfg.text.max_text_len, *u.shape) if u.length == "tokens" else u.shape)
        )
        decls.append(FieldDecl(u.name, np.dtype(u.dtype), shape, u.length, u.pad, "user"))
    return tuple(decls)
