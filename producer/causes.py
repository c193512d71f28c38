"""What decides each stage's verdict on an item: the stage's cause, as a short string.

A producer's stages (producer/pipeline.py: text, audio, features, pitch, user, ...)
judge an item with their code and some config keys. A quarantine line records the
cause of the stage that gave up on its item (consumer/stager/quarantine.py), so when
that cause changes (a fixed user function under a new features.user_version, another
normalizer version, other feature settings) the next start tries the item again
instead of skipping it for the rest of the run (docs/faults-and-security.md#causes-not-items).

Every producer sends :func:`stage_causes` in its HELLO (shared/wire/protocol.py
Hello.causes): the stager never imports producer code (a producer's imports cost
seconds and hundreds of MB), and a line records the causes of the code that judged
its item, which on another host may be another release. `ringfeed quarantine`
computes today's causes with this module, as a producer of this checkout would.

A cause is "<hash> <label>": 8 hex characters over the stage's code versions and
config values (the config fingerprint's hash of each key, shared/run/fingerprint.py),
then the code versions or the user's function for a reader. Stages with nothing to
version (the stager's own checks, a source of computed items) have none: their items
stay skipped for the run, as before causes. A lease's (the item's producers died or
stalled on it, in whatever stage) is everything that shapes a sample: a fixed user
function under a new user_version tries the item again, as for a stage of its own.
"""

from __future__ import annotations

import hashlib

from ringfeed.producer.features.prosody import PROSODY_VERSION
from ringfeed.producer.text.normalize import NORMALIZER_VERSION
from ringfeed.shared.config import Config
from ringfeed.shared.config.audio import RESAMPLE_QUALITY
from ringfeed.shared.corpus.feature_cache import CACHE_FORMAT_VERSION
from ringfeed.shared.run.fingerprint import SAMPLE_SECTIONS, config_fingerprint
from ringfeed.shared.sample.mel_definition import STFT_DTYPE
from ringfeed.shared.wire.bounds import MAX_DIGEST_KEY

# Hex characters of a cause's hash: 32 bits tell two versions of one stage apart.
HASH_HEX = 8

# The config keys whose values decide each stage's verdict ("section." is the whole
# section). audio: the slot's length bounds what is decoded (features.max_frames).
_AUDIO = ("audio.", "features.max_frames", "features.hop_length", "features.on_too_long")
_FEATURES = (
    *_AUDIO,
    "features.n_fft",
    "features.win_length",
    "features.n_mels",
    "features.fmin",
    "features.fmax",
    "features.device",
)
_TEXT = ("text.", "data.language", "data.detect_languages", "features.on_too_long")
_USER = (
    "features.user_function",
    "features.user_version",
    "features.user_fields",
    "features.device",
)
_EVERYTHING = tuple(f"{section}." for section in SAMPLE_SECTIONS)
STAGE_KEYS: dict[str, tuple[str, ...]] = {
    "text": _TEXT,
    "audio": _AUDIO,
    "features": _FEATURES,
    "pitch": _FEATURES,
    "user": _USER,
    "reference": (*_FEATURES, "features.reference_frames", "features.single_clip"),
    "durations": (*_TEXT, *_FEATURES, "features.durations_dir"),
    # An unexpected failure of the cache, the producer's content check of the whole
    # sample, or its write into the slot: anything that shapes a sample may decide it.
    "cache": _EVERYTHING,
    "check": _EVERYTHING,
    "write": _EVERYTHING,
    # Its producers died or stalled on the item (the stager gave up after
    # ring.max_item_attempts leases): in any stage, so anything may have decided it.
    "lease": _EVERYTHING,
}
# The code versions that decide each stage's verdict, by name; the first is the stage's
# own, which its label shows (the hash covers them all).
_NORMALIZER = {"normalizer": str(NORMALIZER_VERSION)}
_STFT = {"stft": STFT_DTYPE, "resampler": RESAMPLE_QUALITY}
_EVERY_VERSION = {
    **_NORMALIZER,
    **_STFT,
    "prosody": PROSODY_VERSION,
    "cache": str(CACHE_FORMAT_VERSION),
}
STAGE_CODE: dict[str, dict[str, str]] = {
    "text": _NORMALIZER,
    "audio": {"resampler": RESAMPLE_QUALITY},
    "features": _STFT,
    "pitch": {"prosody": PROSODY_VERSION, **_STFT},
    "user": {},
    "reference": _STFT,
    "durations": {**_NORMALIZER, **_STFT},
    "cache": _EVERY_VERSION,
    "check": _EVERY_VERSION,
    "write": _EVERY_VERSION,
    "lease": _EVERY_VERSION,
}


def stage_causes(cfg: Config) -> dict[str, str]:
    """stage -> its cause ("<hash> <label>"), for every stage that has one (STAGE_KEYS).
    Called once per producer process (its HELLO) and by `ringfeed quarantine`."""
    keys = config_fingerprint(cfg, corpus="")
    causes = {}
    for stage, prefixes in STAGE_KEYS.items():
        picked = sorted((k, v) for k, v in keys.items() if k.startswith(prefixes))
        versions = STAGE_CODE[stage]
        h = hashlib.blake2b(
            repr((picked, sorted(versions.items()))).encode(), digest_size=HASH_HEX // 2
        )
        if stage == "user":
            f = cfg.features
            label = f"{f.user_function} {f.user_version}" if f.user_function else "none"
        elif prefixes == _EVERYTHING:
            label = "every setting"
        else:
            label = " ".join(next(iter(versions.items())))
        causes[stage] = f"{h.hexdigest()} {label}"[:MAX_DIGEST_KEY]  # the protocol's bound
    return causes
