"""What the stager's slot manager remembers of each producer and each sample slot, and
the finished plan positions it hands on.

Plain records: a Slot is changed only by consumer/stager/slot_manager.py (which
also keeps the slots each producer holds), a Producer by the producer book
(consumer/stager/producer_book.py) and the handlers of its messages, which report
them in the stats; an Event leaves the plan order (consumer/stager/order.py) for
delivery and the intake.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringfeed.consumer.stager.peers import PeerId
from ringfeed.shared.memory.ring import SlotState


@dataclass
class Producer:
    ident: bytes
    name: str
    pid: int
    host: str
    remote: bool
    last_seen: float
    index: int = -1  # written into the headers of the slots it holds
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
class Slot:
    state: SlotState = SlotState.FREE
    generation: int = 0
    position: int = -1
    item: int = -1
    producer: bytes | None = None
    peer: PeerId | None = None  # who stands behind its producer (consumer/stager/peers.py)
    t_granted: float = 0.0
    t_granted_wall: float = 0.0  # for the inspector, which has no access to our clock
    owner_index: int = -1  # its producer's index, as the header shows it
    t_fenced: float = 0.0


@dataclass(frozen=True)
class Event:
    """A finished plan position: kind is 'sample' (slot holds it) or 'skip' (with the
    reason, the stage that gave up on it and, from a producer, the input's path and
    that stage's cause in the producer, producer/causes.py)."""

    kind: str
    position: int
    item: int
    slot: int = -1
    reason: str = ""
    stage: str = ""
    path: str = ""
    cause: str = ""
