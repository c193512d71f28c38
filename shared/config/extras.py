"""What only some roles install: the extras of the package (pyproject.toml) that a config
or a command may need, and the error that names the one missing.

The base install is what a producer host needs (docs/loaders.md#installs-by-role).
Parquet corpora (pyarrow), object storage (s3fs and its botocore) and the inspector's
charts (matplotlib) are extras: `pip install 'ringfeed[parquet]'`, `'ringfeed[s3]'`,
`'ringfeed[plot]'`. Code that needs one imports it through need_extra, so that its
absence says which extra to install and why, not a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """A module of an extra this install lacks: the message says what to install."""


def need_extra(module: str, extra: str, why: str) -> ModuleType:
    """The module, imported; MissingExtra naming the extra (and why it is needed)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        root = module.split(".")[0]
        raise MissingExtra(
            f"{why}, and this install has no {root} ({exc}): pip install "
            f"'ringfeed[{extra}]' (from a clone: pip install -e '.[{extra}]')",
            name=root,
        ) from None
