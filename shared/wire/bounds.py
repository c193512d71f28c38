"""What shared/wire/protocol.py's decode accepts in each field: one range check per type.

Every field of every message is checked at decode, before any handler sees it:
integers are 0..MAX_INT, strings are capped by field name (MAX_STR, else
MAX_NAME), work counters are few and short, lists and maps hold at most 4096
entries (msgpack's limits, set in decode), a READY's cache keys are whole keys and
at most MAX_CACHE_KEYS, a header is at most MAX_HEADER_BYTES. What depends on
the run (a slot index, a plan position) is checked by the stager against its ring
and plan.

Every string a peer sends is also cleaned at decode (:func:`clean_fields`), so
no handler, log line, stager.json, quarantine line or inspector screen sees a
control character from a peer: C0 and C1 controls (ESC starts a terminal escape
sequence that can rewrite a screen or a log viewer), DEL, the Unicode line
separators and the bidi embeddings, overrides and isolates that reorder what a
reader sees ("Trojan Source", CVE-2021-42574) are removed. Printable text of any
script stays, with ZWNJ and ZWJ (Persian words need them) and the LRM/RLM marks;
a traceback keeps its newlines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# Control frames are small (place indices, lengths, a traceback at most).
MAX_HEADER_BYTES = 65536
# A remote producer's READY carries its entries' rows as payload frames, one per field:
# at most this many bytes in all (producer/process/slot_writer.py sends them so; the stager's
# frame limit follows, consumer/stager/control.py).
MAX_READY_PAYLOAD_BYTES = 4 << 20
# Every integer on the wire is a count, index, position, pid, generation or checksum:
# none is negative, and none needs more than a double's exact range (what msgpack
# peers in other languages can hold).
MAX_INT = 2**53
# Longest string per field name; any other string field holds a name or a host.
MAX_STR = {"traceback": 16384, "reason": 4096, "path": 4096, "secret": 128, "token": 64}
MAX_NAME = 128
# A producer's work counters (Heartbeat.work, Bye.work): a few named counts, kept by the
# stager as they are and listed in its stats (tests/unit/test_peer_output.py: the stats'
# worst case).
# 24: room for the 17 a producer has at most today (the pipeline's 10 counters, its 2 of
# text work, the shard cache's 4, taken-back grants; tests/unit/test_session.py checks
# the sum; at 16 a producer reading remote shards silently lost taken_back), and the
# stats message of the most listed producers still under MAX_HEADER_BYTES at 24 (at 32
# it is not: tests/unit/test_peer_output.py).
MAX_WORK_KEYS, MAX_WORK_KEY = 24, 32
# A clip's feature-cache key (shared/corpus/feature_cache.py FeatureCache.key), as a
# READY's cache_keys carries one per entry (shared/wire/grants.py): at most as many as a
# list holds.
CACHE_KEY_BYTES, MAX_CACHE_KEYS = 16, 4096
# Fingerprints (Hello.config, Welcome.plan, ConsumerHello.plan; shared/run/fingerprint.py)
# and a producer's stage causes (Hello.causes): name -> short string, a few dozen entries.
MAX_DIGESTS, MAX_DIGEST_KEY = 64, 64


# What clean() removes: C0 but "\n" (added back for one-line fields), DEL and C1, the
# line and paragraph separators, the bidi embeddings, overrides and isolates.
_CONTROLS = "\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE, _UNSAFE_BUT_LINES = re.compile(f"[\n{_CONTROLS}]"), re.compile(f"[{_CONTROLS}]")
# Fields that hold several lines; fields compared, never shown, are left as sent.
MULTILINE = frozenset({"traceback"})
NEVER_SHOWN = frozenset({"secret", "token"})


def clean(text: str, lines: bool = False) -> str:
    """text without control characters (module docstring); lines: keep "\n"."""
    if text.isascii() and text.isprintable():
        return text  # the common case, at C speed
    return (_UNSAFE_BUT_LINES if lines else _UNSAFE).sub("", text)


def _cleaned(name: str, value: Any) -> Any:
    if type(value) is str and name not in NEVER_SHOWN:
        return clean(value, name in MULTILINE)
    if name == "work":
        return {clean(key): count for key, count in value.items()}
    if name == "causes":  # written into quarantine lines and shown by `ringfeed quarantine`
        return {clean(key): clean(cause) for key, cause in value.items()}
    return value


def clean_fields(fields: Sequence[tuple[Any, ...]], values: list[Any]) -> list[Any]:
    """values of a decoded message, checked already, with every string a peer wrote
    cleaned: string fields and work counters' names. fields: (name, ...) per value."""
    return [_cleaned(field[0], value) for field, value in zip(fields, values, strict=True)]


def _is_int(v: Any) -> bool:
    return type(v) is int and 0 <= v < MAX_INT


def _is_float(v: Any) -> bool:
    return type(v) in (int, float)


def _is_int_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is int and 0 <= x < MAX_INT for x in v)


def _is_str_dict(v: Any) -> bool:
    return type(v) is dict and all(type(k) is str for k in v)


def _is_work(v: Any) -> bool:
    return (
        type(v) is dict
        and len(v) <= MAX_WORK_KEYS
        and all(type(k) is str and len(k) <= MAX_WORK_KEY for k in v)
    )


def _is_digests(v: Any) -> bool:
    return (
        type(v) is dict
        and len(v) <= MAX_DIGESTS
        and all(type(k) is str and len(k) <= MAX_DIGEST_KEY for k in v)
        and all(type(x) is str and len(x) <= MAX_DIGEST_KEY for x in v.values())
    )


def _is_cache_keys(v: Any) -> bool:
    return (
        type(v) is bytes
        and len(v) % CACHE_KEY_BYTES == 0
        and len(v) <= MAX_CACHE_KEYS * CACHE_KEY_BYTES
    )


def _str_check(limit: int) -> Any:
    return lambda v: type(v) is str and len(v) <= limit


_CHECKS: dict[Any, Any] = {
    bool: lambda v: type(v) is bool,
    int: _is_int,
    float: _is_float,
    list[int]: _is_int_list,
    bytes: _is_cache_keys,  # the one bytes field (Ready.cache_keys)
    dict[str, Any]: _is_str_dict,
}


def field_check(name: str, tp: Any) -> Any:
    """The check of one message field, from its name and annotated type."""
    if tp is str:
        return _str_check(MAX_STR.get(name, MAX_NAME))
    if name in ("config", "plan", "causes"):
        return _is_digests
    return _is_work if name == "work" else _CHECKS[tp]
