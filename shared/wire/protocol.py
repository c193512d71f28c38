"""The wire protocol between producers, the stager and the trainer.

A message is one msgpack header frame ``[VERSION, kind, *fields]`` followed,
for a remote producer's READY only, by raw payload frames (one per sample
field: the used rows of each entry, one after another). Arrays never travel
inside msgpack and nothing is ever pickled. :func:`encode` and :func:`decode`
are pure functions, tested without sockets; :func:`decode` raises
:class:`ProtocolError` on anything it does not fully understand, and the
receiver counts and drops that message.
Every field is range-checked at decode (shared/wire/bounds.py).

Versions. Every header starts with VERSION, forever. A peer of another version is
answered with REFUSED, whose layout ``[version, 19, reason]`` never changes, so a
producer of any version since 4 decodes it and exits with the reason, which names
both versions (consumer/stager/control.py). A message of another version that is
not a REFUSED raises :class:`VersionMismatch`, which says both versions too.

Who sends what::

    producer -> stager   HELLO, REQUEST, READY, SKIP, HEARTBEAT, CRASH, BYE
    stager -> producer   WELCOME, GRANT, SHUTDOWN, BYE_ACK, REHELLO, REFUSED
    trainer -> stager    CONSUMER_HELLO, BATCH_FREE, STEP_STATS, HEARTBEAT (while waiting)
    stager -> trainer    BATCH_READY, END_OF_DATA, SHUTDOWN, REHELLO, REFUSED
    stager -> anyone     STATS (on the PUB socket)
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

from ringfeed.shared.sample.schema import MAX_SAMPLE_FIELDS
from ringfeed.shared.sample.schema import SPARE_SHAPE as SPARE_SHAPE

# The limits decode enforces are part of the protocol: shared/wire/bounds.py holds them.
from ringfeed.shared.wire.bounds import MAX_HEADER_BYTES as MAX_HEADER_BYTES
from ringfeed.shared.wire.bounds import MAX_NAME as MAX_NAME
from ringfeed.shared.wire.bounds import MAX_STR as MAX_STR
from ringfeed.shared.wire.bounds import MAX_WORK_KEY as MAX_WORK_KEY
from ringfeed.shared.wire.bounds import MAX_WORK_KEYS as MAX_WORK_KEYS
from ringfeed.shared.wire.bounds import clean_fields, field_check
from ringfeed.shared.wire.grants import NO_KEY as NO_KEY
from ringfeed.shared.wire.grants import Grant as Grant
from ringfeed.shared.wire.grants import GrantEntry as GrantEntry
from ringfeed.shared.wire.grants import Ready as Ready
from ringfeed.shared.wire.grants import ReadyEntry as ReadyEntry

# 4: HELLO carries the config fingerprint, WELCOME and CONSUMER_HELLO the plan's; REFUSED.
# 5: HELLO carries the causes of the producer's stages (its quarantine verdicts).
# 6: CONSUMER_HELLO says whether it takes the run over from its own process (rejoin).
# 7: grants and answers by the run (shared/wire/grants.py): a GRANT names a run of places
#    (rows of one batch slot, or spare-ring slots) under one generation, a READY answers
#    places of one run, a SKIP names its place; WELCOME names the spare ring too.
# 8: a READY's checksum is row_pass.py's (64 lanes of FNV-1a, one pass with the copy and
#    the value check), not xxh3.
# 9: a READY carries its clips' feature-cache keys and marks (cache_keys, clip_marks),
#    for the stager to keep the mels it computes; marks MEL: a wave field holds a mel.
VERSION = 9
# Raw payload frames of a remote READY, one per sample field (the declared schema's, at
# most MAX_SAMPLE_FIELDS); the stager checks exact sizes anyway. Was 8, which the soak
# with every optional field (--fields: 10 fields) found refusing every remote READY.
MAX_PAYLOAD_FRAMES = MAX_SAMPLE_FIELDS


class ProtocolError(ValueError):
    """A message that is not ours, of another version, or malformed. peer: the sender's
    identity, when it came on a ROUTER socket (shared/wire/sockets.py recv sets it)."""

    peer: bytes | None = None


class VersionMismatch(ProtocolError):
    """A message of another protocol version: `theirs` and `ours`."""

    def __init__(self, theirs: object, ours: int) -> None:
        super().__init__(f"protocol version {theirs!r}, expected {ours}")
        self.theirs, self.ours = theirs, ours


class Kind(IntEnum):
    HELLO = 1
    WELCOME = 2
    REQUEST = 3
    GRANT = 4
    READY = 5
    SKIP = 6
    HEARTBEAT = 7
    CRASH = 8
    BYE = 9
    BYE_ACK = 10
    SHUTDOWN = 11
    CONSUMER_HELLO = 12
    BATCH_READY = 13
    BATCH_FREE = 14
    STEP_STATS = 15
    END_OF_DATA = 16
    STATS = 17
    REHELLO = 18
    # Its layout [version, 19, reason] is frozen: decoded whatever the version.
    REFUSED = 19


@dataclass(frozen=True)
class Hello:
    """A producer introduces itself. token: random, drawn once per process and never
    shown, so a HELLO again from the same process (a new socket) is told apart from
    another peer that uses its name. remote is a claim; the stager believes only the
    socket it came on."""

    name: str
    pid: int
    host: str
    remote: bool
    token: str
    # Where a cluster engine placed it ("ray actor ID on node ID"), or "".
    place: str
    # "section.key" -> hash of each config key that shapes a sample (shared/run/fingerprint.py).
    config: dict[str, Any]
    # Stage -> what decides its verdict on an item, "<hash> <label>" (producer/causes.py):
    # each quarantine line records its stage's, and a start retries the stale ones.
    causes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Welcome:
    """ring_name: the batch ring; spares: the spare ring ("" for the consumer); plan: the
    plan's fingerprint per part (shared/run/fingerprint.py), which the trainer keeps in
    its checkpoints' cursor."""

    run_id: str
    ring_name: str
    n_items: int
    plan: dict[str, Any]
    spares: str = ""


@dataclass(frozen=True)
class Request:
    """Ask for up to `credits` more grants."""

    credits: int


@dataclass(frozen=True)
class Skip:
    """The producer cannot use this input, granted at `place` in the run of `generation`;
    stage is where it gave up (text, audio, ...)."""

    generation: int
    place: int
    item: int
    reason: str
    path: str
    stage: str


@dataclass(frozen=True)
class Heartbeat:
    """Sent every ring.heartbeat_s; work: how often each stage of the producer's
    per-sample work ran (decoded, mels, cache_hits, skipped), for the inspector."""

    samples_done: int
    work: dict[str, Any]


@dataclass(frozen=True)
class Crash:
    """A worker's exception, with its name and traceback, sent before it exits."""

    name: str
    traceback: str


@dataclass(frozen=True)
class Bye:
    """A producer leaves; work: its final counters (as in Heartbeat). {} from a consumer."""

    samples_done: int
    work: dict[str, Any]


@dataclass(frozen=True)
class ByeAck:
    pass


@dataclass(frozen=True)
class Shutdown:
    reason: str


@dataclass(frozen=True)
class ConsumerHello:
    """The trainer (or any batch consumer) starts reading at plan position `position`.
    secret: the run's consumer secret (the 0600 file the stager writes in its run
    directory); without it no peer becomes the consumer. plan: the plan fingerprint of
    the checkpoint it resumes ({} for a fresh start); a plan that differs is refused,
    unless new_plan_at > 0: then a new plan starts at that epoch (the trainer's
    --new-plan). rejoin: take the run over from a live consumer of this same process
    (a client made anew in the process that holds the run); without it that consumer
    keeps the run and this one is refused (consumer/stager/consumer_side.py)."""

    name: str
    position: int
    batch_index: int
    secret: str
    plan: dict[str, Any]
    new_plan_at: int
    rejoin: bool = False


@dataclass(frozen=True)
class BatchReady:
    slot: int
    generation: int
    batch_index: int
    # Plan position just after this batch's last item: the resume cursor.
    next_position: int
    epoch: int  # of the batch's last row
    n_valid: int
    # Of its first row: a batch across an epoch boundary has first_epoch < epoch.
    first_epoch: int
    # Its shape (its length bucket's): tokens [rows, text_len], mel [rows, frames, n_mels].
    rows: int
    frames: int
    text_len: int


@dataclass(frozen=True)
class BatchFree:
    slot: int
    generation: int


@dataclass(frozen=True)
class StepStats:
    """One train step: step_s computing (the wait excluded), wait_s waiting for its batch,
    rows the real rows of its batch, frames their true mel frames."""

    step: int
    step_s: float
    wait_s: float
    loss: float
    rows: int
    frames: int


@dataclass(frozen=True)
class EndOfData:
    batches: int


@dataclass(frozen=True)
class Rehello:
    """The stager does not know this peer (it restarted): say HELLO again."""


@dataclass(frozen=True)
class Refused:
    """The stager will not take this peer, for good (another protocol version, another
    config, a plan that changed): the peer exits with the reason, which says what to
    change."""

    reason: str


@dataclass(frozen=True)
class Stats:
    data: dict[str, Any] = field(default_factory=dict)


MESSAGE_TYPES: dict[Kind, type] = {
    Kind.HELLO: Hello,
    Kind.WELCOME: Welcome,
    Kind.REQUEST: Request,
    Kind.GRANT: Grant,
    Kind.READY: Ready,
    Kind.SKIP: Skip,
    Kind.HEARTBEAT: Heartbeat,
    Kind.CRASH: Crash,
    Kind.BYE: Bye,
    Kind.BYE_ACK: ByeAck,
    Kind.SHUTDOWN: Shutdown,
    Kind.CONSUMER_HELLO: ConsumerHello,
    Kind.BATCH_READY: BatchReady,
    Kind.BATCH_FREE: BatchFree,
    Kind.STEP_STATS: StepStats,
    Kind.END_OF_DATA: EndOfData,
    Kind.STATS: Stats,
    Kind.REHELLO: Rehello,
    Kind.REFUSED: Refused,
}
KIND_OF: dict[type, Kind] = {cls: kind for kind, cls in MESSAGE_TYPES.items()}
_FIELDS: dict[type, list[tuple[str, Any]]] = {
    cls: [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
    for cls in MESSAGE_TYPES.values()
    for hints in [typing.get_type_hints(cls)]  # once a class: once a field cost 16 ms a start
}

Message = Any  # one of the dataclasses above


def encode(msg: Message, payload: list[memoryview] | None = None) -> list[bytes | memoryview]:
    """Frames for `msg`: the msgpack header, then any raw payload buffers (zero-copy)."""
    kind = KIND_OF[type(msg)]
    values = [getattr(msg, name) for name, _ in _FIELDS[type(msg)]]
    header = msgpack.packb([VERSION, int(kind), *values], use_bin_type=True)
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"{kind.name} header is {len(header)} bytes > {MAX_HEADER_BYTES}")
    return [header, *(payload or [])]


# Per message class: (field name, type, check) -- built once, as decode runs per message.
_VALIDATORS: dict[type, list[tuple[str, Any, Any]]] = {
    cls: [(name, tp, field_check(name, tp)) for name, tp in fields]
    for cls, fields in _FIELDS.items()
}
_BY_VALUE: dict[int, tuple[Kind, type]] = {int(k): (k, c) for k, c in MESSAGE_TYPES.items()}


def _shown(value: Any) -> str:
    """A short description of a rejected value for the log (never the value in full)."""
    if type(value) in (str, list, dict, bytes):
        return f"{type(value).__name__} of length {len(value)}"
    return repr(value)[:40]


def decode(frames: list[bytes]) -> tuple[Message, list[bytes]]:
    """Parse frames into (message, payload frames); raises ProtocolError."""
    if not frames:
        raise ProtocolError("empty message")
    header = frames[0]
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(header)} bytes > {MAX_HEADER_BYTES}")
    if len(frames) - 1 > MAX_PAYLOAD_FRAMES:
        raise ProtocolError(f"{len(frames) - 1} payload frames > {MAX_PAYLOAD_FRAMES}")
    try:
        obj = msgpack.unpackb(
            header,
            raw=False,
            strict_map_key=True,
            max_array_len=4096,
            max_map_len=4096,
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"not msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, list) or len(obj) < 2:
        raise ProtocolError("header is not [version, kind, ...]")
    version, kind_value, *values = obj
    if version != VERSION:
        if kind_value == Kind.REFUSED and len(values) == 1 and type(values[0]) is str:
            return Refused(values[0][: MAX_STR["reason"]]), []
        raise VersionMismatch(version, VERSION)
    found = _BY_VALUE.get(kind_value) if type(kind_value) is int else None
    if found is None:
        raise ProtocolError(f"unknown message kind {kind_value!r}")
    kind, cls = found
    fields = _VALIDATORS[cls]
    if len(values) != len(fields):
        raise ProtocolError(f"{kind.name}: {len(values)} fields, expected {len(fields)}")
    for (name, tp, check), value in zip(fields, values, strict=True):
        if not check(value):
            what = getattr(tp, "__name__", str(tp))
            raise ProtocolError(f"{kind.name}.{name}: not a valid {what} ({_shown(value)})")
    if cls is Grant and len({len(column) for column in values[-3:]}) != 1:
        raise ProtocolError("GRANT: its lists differ in length")
    payload = list(frames[1:])
    if payload and kind is not Kind.READY:
        raise ProtocolError(f"{kind.name} carries {len(payload)} unexpected payload frames")
    return cls(*clean_fields(fields, values)), payload  # no peer's control characters
