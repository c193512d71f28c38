"""Load-time checks of the optional sample fields (features.pitch, energy, user_*).

Called by shared/config_checks.py validate; every error names the key and what
to change. The rules follow from the ring (shared/ring.py: field names of at
most 16 bytes, at most MAX_LENGTHS fields a sample) and from the batch (a user
field's lengths travel as ``<name>_lens``).
"""

from __future__ import annotations

import re
from typing import Any

from ringfeed.shared.sample_schema import MAX_SAMPLE_FIELDS, RESERVED
from ringfeed.shared.schema import check

# "<name>_lens" must fit the ring's 16-byte field names.
MAX_USER_NAME = 11
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def validate_fields(cfg: Any) -> None:
    f = cfg.features
    stager = f.device == "stager"
    for key in ("pitch", "energy"):
        check(not (stager and getattr(f, key)), f"features.{key}",
              "needs the mel's STFT on the producer: set features.device: producer "
              f"or features.{key}: false")  # fmt: skip
    check(not f.reference or 1 <= f.reference_frames <= f.max_frames, "features.reference_frames",
          f"{f.reference_frames}: must be 1..features.max_frames={f.max_frames}")  # fmt: skip
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
        check(bool(_NAME.match(u.name)) and len(u.name) <= MAX_USER_NAME, f"{key}.name",
              f"{u.name!r}: use 1..{MAX_USER_NAME} lowercase letters, digits or _ "
              "(a letter first)")  # fmt: skip
        check(u.name not in RESERVED and not u.name.endswith("_lens"), f"{key}.name",
              f"{u.name!r} is a built-in field's name: pick another")  # fmt: skip
        check(u.name not in names, f"{key}.name", f"{u.name!r} is declared twice")
        names.add(u.name)
        check(all(d >= 1 for d in u.shape) and len(u.shape) <= 3, f"{key}.shape",
              f"{list(u.shape)}: at most 3 dimensions, each >= 1")  # fmt: skip
        if u.length in ("own", "none"):
            check(len(u.shape) >= 1, f"{key}.shape",
                  f"length {u.length} needs a shape of at least one dimension "
                  "(axis 0: the length, or the field's size)")  # fmt: skip
        else:
            check(len(u.shape) <= 2, f"{key}.shape",
                  f"{list(u.shape)} is the shape of one {u.length[:-1]}'s row: at most 2 "
                  "dimensions")  # fmt: skip
        check(not (stager and u.length == "frames"), f"{key}.length",
              "frames follows the producer's mel: set features.device: producer")  # fmt: skip


def _validate_user_function(f: Any) -> None:
    """features.user_function, user_fields and user_version: all or none."""
    spec = f.user_function
    if f.user_fields or spec:
        module, sep, func = spec.partition(":")
        check(bool(sep and module and func), "features.user_function",
              f"{spec!r}: write it as 'package.module:function' (it returns the "
              "features.user_fields by name)")  # fmt: skip
        check(
            bool(f.user_fields),
            "features.user_fields",
            f"features.user_function={spec!r} declares no field: list its fields here",
        )
        check(bool(f.user_version), "features.user_version",
              "name your function's version (e.g. 'v1'): the feature cache keeps its "
              "output under it; change it when the function changes")  # fmt: skip
