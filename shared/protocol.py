"""The wire protocol between producers, the stager and the trainer.

A message is one msgpack header frame ``[VERSION, kind, *fields]`` followed,
for a remote producer's READY only, by raw payload frames (one per ring
field, the used rows only). Arrays never travel inside msgpack and nothing is
ever pickled. :func:`encode` and :func:`decode` are pure functions, tested
without sockets; :func:`decode` raises :class:`ProtocolError` on anything it
does not fully understand, and the receiver counts and drops that message.
Every field is range-checked at decode (shared/field_checks.py).

Who sends what::

    producer -> stager   HELLO, REQUEST, READY, SKIP, HEARTBEAT, CRASH, BYE
    stager -> producer   WELCOME, GRANT, SHUTDOWN, BYE_ACK, REHELLO
    trainer -> stager    CONSUMER_HELLO, BATCH_FREE, STEP_STATS, HEARTBEAT (while waiting)
    stager -> trainer    BATCH_READY, END_OF_DATA, SHUTDOWN, REHELLO
    stager -> anyone     STATS (on the PUB socket)
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

import msgpack

# The limits decode enforces are part of the protocol: shared/field_checks.py holds them.
from shared.field_checks import MAX_HEADER_BYTES as MAX_HEADER_BYTES
from shared.field_checks import MAX_NAME as MAX_NAME
from shared.field_checks import MAX_STR as MAX_STR
from shared.field_checks import MAX_WORK_KEY as MAX_WORK_KEY
from shared.field_checks import MAX_WORK_KEYS as MAX_WORK_KEYS
from shared.field_checks import clean_fields, field_check

VERSION = 3
# Raw payload frames of a remote READY; the stager checks exact sizes anyway.
MAX_PAYLOAD_FRAMES = 8


class ProtocolError(ValueError):
    """A message that is not ours, of another version, or malformed."""


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


@dataclass(frozen=True)
class Welcome:
    run_id: str
    ring_name: str
    n_items: int


@dataclass(frozen=True)
class Request:
    """Ask for up to `credits` more grants."""

    credits: int


class GrantEntry(NamedTuple):
    """One grant: fill `slot` (stamped with `generation`) with `item`, the plan's
    `position`."""

    slot: int
    generation: int
    item: int
    position: int


class ReadyEntry(NamedTuple):
    """One filled slot: `lengths` holds the true rows of each ring field in ring order,
    `checksum` the rows_checksum (shared/ring.py) of those rows as written."""

    slot: int
    generation: int
    item: int
    lengths: list[int]
    checksum: int
    truncated: bool


@dataclass(frozen=True)
class Grant:
    """One or more grants (:class:`GrantEntry`), as parallel lists on the wire: build
    with :meth:`of`, read with :meth:`entries`.

    Grants travel in batches because per-message cost, not bytes, limits the
    ring with small work per sample (README, ring benchmark)."""

    slots: list[int]
    generations: list[int]
    items: list[int]
    positions: list[int]

    @classmethod
    def of(cls, entries: list[GrantEntry]) -> Grant:
        return cls(*(list(column) for column in zip(*entries, strict=True)))

    def entries(self) -> list[GrantEntry]:
        """The grants; a GRANT whose lists differ in length is refused at decode."""
        columns = (self.slots, self.generations, self.items, self.positions)
        return [GrantEntry(*g) for g in zip(*columns, strict=True)]


@dataclass(frozen=True)
class Ready:
    """One or more filled slots (:class:`ReadyEntry`), as parallel lists on the wire:
    lengths holds n_fields true sizes per entry, flattened; truncated is 0/1 per entry.
    Build with :meth:`of`, read with :meth:`entries`. A remote producer sends one entry
    and its rows as raw payload frames, one per field."""

    slots: list[int]
    generations: list[int]
    items: list[int]
    lengths: list[int]
    checksums: list[int]
    truncated: list[int]

    @classmethod
    def of(cls, entries: list[ReadyEntry]) -> Ready:
        return cls(
            [e.slot for e in entries],
            [e.generation for e in entries],
            [e.item for e in entries],
            [n for e in entries for n in e.lengths],
            [e.checksum for e in entries],
            [int(e.truncated) for e in entries],
        )

    def entries(self, n_fields: int) -> list[ReadyEntry] | str:
        """The entries, or why the lists do not line up (the stager rejects the READY:
        n_fields depends on the run, so decode cannot check it)."""
        n = len(self.slots)
        if not (len(self.generations) == len(self.items) == len(self.checksums) == n) or (
            len(self.truncated) != n or len(self.lengths) != n * n_fields
        ):
            return f"READY with inconsistent list sizes ({n} slots)"
        return [
            ReadyEntry(
                self.slots[i],
                self.generations[i],
                self.items[i],
                self.lengths[i * n_fields : (i + 1) * n_fields],
                self.checksums[i],
                bool(self.truncated[i]),
            )
            for i in range(n)
        ]


@dataclass(frozen=True)
class Skip:
    """The producer cannot use this input; stage is where it gave up (text, audio, ...)."""

    slot: int
    generation: int
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
    directory); without it no peer becomes the consumer."""

    name: str
    position: int
    batch_index: int
    secret: str


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
}
KIND_OF: dict[type, Kind] = {cls: kind for kind, cls in MESSAGE_TYPES.items()}
_FIELDS: dict[type, list[tuple[str, Any]]] = {
    cls: [(f.name, typing.get_type_hints(cls)[f.name]) for f in dataclasses.fields(cls)]
    for cls in MESSAGE_TYPES.values()
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
        raise ProtocolError(f"protocol version {version!r}, expected {VERSION}")
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
    if cls is Grant and len({len(column) for column in values}) != 1:
        raise ProtocolError("GRANT: its lists differ in length")
    payload = list(frames[1:])
    if payload and kind is not Kind.READY:
        raise ProtocolError(f"{kind.name} carries {len(payload)} unexpected payload frames")
    return cls(*clean_fields(fields, values)), payload  # no peer's control characters
