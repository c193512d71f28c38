"""Free tcp ports on 127.0.0.1, for a stager, a proxy or a training worker to bind."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A tcp port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct such ports (held together while chosen, so none repeats)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
