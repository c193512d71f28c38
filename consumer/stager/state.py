"""The records of the stager's slot ledger (consumer/stager/ledger.py): producers, places,
open plan positions and the batches being filled, and how a finished position ended.

Plain records. A Place, a Position and a Batch are changed only by the ledger (and its
twins, consumer/stager/twins.py); a Producer by the producer book
(consumer/stager/producer_book.py) and the handlers of its messages. Other parts read
what the ledger's verbs return (a Finished, a Batch handed to the assembly), never the
ledger's own tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringfeed.consumer.stager.peers import PeerId
from ringfeed.shared.memory.ring import SlotState
from ringfeed.shared.wire import protocol as p

if TYPE_CHECKING:
    from ringfeed.consumer.stager.twins import Twin


@dataclass
class Producer:
    ident: bytes
    name: str
    pid: int
    host: str
    remote: bool
    last_seen: float
    index: int = -1  # written into the records of the places it holds
    # Drawn by the producer process once and never shown: a HELLO with the same name and
    # token is that process again; the same name with another token is someone else.
    token: str = ""
    place: str = ""  # where a cluster engine runs it (Ray actor and node), or ""
    peer: PeerId = PeerId("local", "local")  # who stands behind its socket (peers.py)
    credits: int = 0
    samples: int = 0  # READY and SKIP entries accepted from it
    # The producer's own per-sample counters, from its last heartbeat (for the inspector).
    work: dict[str, int] = field(default_factory=dict)
    # Its grants were taken back (lease expired, or the plan restarted) while it may
    # still hold them queued: it gets nothing until it says HELLO again.
    stalled: bool = False
    # Stage -> what decides that stage's verdict in this producer (its HELLO's causes):
    # the cause of each quarantine line its SKIPs make.
    causes: dict[str, str] = field(default_factory=dict)


@dataclass
class Place:
    """Where one sample is written: a row of a batch slot, or a slot of the spare ring.
    writes_memory: its holder maps the rings (a local producer), so a grant taken back
    from it while it lives may still be written (FENCED)."""

    state: SlotState = SlotState.FREE
    generation: int = 0  # of its current grant, or its last
    position: int = -1
    item: int = -1
    holder: bytes | None = None
    peer: PeerId | None = None
    t_granted: float = 0.0
    t_granted_wall: float = 0.0  # for the inspector, which has no access to our clock
    owner_index: int = -1  # its holder's index, as the record shows it
    t_fenced: float = 0.0
    writes_memory: bool = False


@dataclass(frozen=True)
class Finished:
    """How a plan position ended: kind 'sample' (at `place`, as its READY said: lengths,
    checksum, marks) or 'skip' (with the reason, the stage that gave up on it and, from a
    producer, the input's path and that stage's cause, producer/causes.py). ident and
    peer: who answered (None for a skip decided without a producer)."""

    kind: str
    position: int
    item: int
    place: int = -1
    entry: p.ReadyEntry | None = None
    reason: str = ""
    stage: str = ""
    path: str = ""
    cause: str = ""
    ident: bytes | None = None
    peer: PeerId | None = None


@dataclass
class Position:
    """An open plan position of a batch being filled: its item, its batch and row (where
    it is written in place, unless that row is not free), the places granted for it
    now (two for a twin), and how it finished."""

    position: int
    item: int
    batch: Batch
    row: int
    grants: list[int] = field(default_factory=list)
    done: Finished | None = None
    attempts: int = 0  # charged failed grants (ring.max_item_attempts)
    taken_from: str = ""  # the account its last grant came back from (a retry avoids it)
    twin: Twin | None = None
    retry: bool = False  # waiting in the retry queue


@dataclass
class Batch:
    """One plan batch in a batch slot: the global range [first, end) it is cut from, its
    shape (rows, frames, text), this worker's positions of it in plan order (row k is
    positions[k]'s place), how many are not finished. compacted: its rows were moved
    (a skip closed up, or a check failed after the move): a retry of it is written into
    a spare place, never into a row."""

    slot: int
    first: int
    end: int
    shape: tuple[int, int, int]
    positions: list[Position] = field(default_factory=list)
    unfinished: int = 0
    compacted: bool = False
