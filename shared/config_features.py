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

from ringfeed.shared.sample_schema import FieldDecl

if TYPE_CHECKING:
    from ringfeed.shared.config import Config


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
    # the stager computes mels for the whole batch on its device.
    device: Literal["producer", "stager"] = "producer"
    # The feature cache and the length manifest live here.
    cache_dir: str = ".cache/features"
    # Keep each clip's features on disk, so later epochs skip decode and mel.
    cache: bool = True
    # Sample field ref_mel (README, "Sample fields"): the log-mel of another clip of the
    # same speaker, chosen from seed, epoch and item.
    reference: bool = False
    # Longest reference, mel frames (a longer clip is cut from a drawn offset).
    reference_frames: int = 200
    # A speaker with one clip: own (it is its own reference, counted) or skip the item.
    single_clip: Literal["own", "skip"] = "own"
    # Sample fields pitch (f0 per mel frame, Hz, 0 unvoiced) and voiced: pyworld DIO +
    # StoneMask, ~13 ms per second of audio.
    pitch: bool = False
    # Sample field energy: the L2 norm of each mel frame's STFT magnitude (bins <= fmax).
    energy: bool = False
    # Fields of your own: "module:function", called as function(wave, mel, text, entry)
    # and returning one array per features.user_fields entry (README, "Sample fields").
    user_function: str = ""
    # The version of user_function's output in the feature cache: change it when the
    # function changes.
    user_version: str = ""
    # The fields user_function returns: each {name, dtype: float32 | int32, shape,
    # length: frames | tokens | own | none, pad}.
    user_fields: tuple[UserFieldConfig, ...] = ()
    # Sample field durations (mel frames per token) from <durations_dir>/<item_id>.durations,
    # checked to sum to the mel frames; "" = none.
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
