"""Frozen dataclasses from a plain mapping (as YAML gives), with errors that name the key.

The machinery under shared/config/config.py, which holds ringfeed's own schema and its
rules: unknown keys, wrong types and impossible values raise
:class:`ConfigError` naming the key (``ring.slots: must be an integer``).
Supported field types: bool, int, float, str, Literal, tuple[T, ...],
dict[str, T] (keys named ``key.name`` in errors), Any (plain YAML data,
checked by whoever reads it) and nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or impossible."""


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def at_least_one(section: str, **values: int) -> None:
    """Each of a section's counts must be >= 1: ConfigError naming the first that is not."""
    for name, value in values.items():
        check(value >= 1, f"{section}.{name}", f"must be >= 1, got {value}")


def is_plain(value: Any) -> bool:
    """YAML's own data: None, bool, int, float, str, and lists and string-keyed
    mappings of those (what a config can write back to YAML)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def _coerce(value: Any, tp: Any, key: str) -> Any:
    if tp is Any:
        check(is_plain(value), key, f"must be plain YAML data, got {type(value).__name__}")
        return value
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        check(value in choices, key, f"must be one of {list(choices)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{key}: union types are not supported in the config schema")
    if dataclasses.is_dataclass(tp):
        check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return build(tp, value, key)
    if tp is bool:
        check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        check(
            isinstance(value, int) and not isinstance(value, bool),
            key,
            f"must be an integer, got {value!r}",
        )
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 2e-3 (no dot) as text
            value = _number(value)
        check(
            isinstance(value, (int, float)) and not isinstance(value, bool),
            key,
            f"must be a number, got {value!r}",
        )
        return float(value)
    if tp is str:
        check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        check(key_tp is str, key, f"unsupported mapping type {tp}: keys must be str")
        check(isinstance(value, dict), key, f"must be a mapping, got {value!r}")
        for k in value:
            check(isinstance(k, str), key, f"keys must be strings, got {k!r}")
        return {k: _coerce(v, value_tp, f"{key}.{k}") for k, v in value.items()}
    if origin is tuple:
        check(isinstance(value, list), key, f"must be a list, got {value!r}")
        return tuple(_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value))
    raise ConfigError(f"{key}: unsupported type {tp}")


def _number(text: str) -> float | str:
    """A number written as text ("2e-3", "1E4"), or the text as it was."""
    try:
        return float(text)
    except ValueError:
        return text


def build(cls: type, raw: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{where}: unknown key; {hint}known keys here are {sorted(names)}")
    kwargs = {}
    for name in names & raw.keys():
        where = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(raw[name], hints[name], where)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - guarded by the checks above
        raise ConfigError(f"{prefix or 'config'}: {exc}") from exc
