"""The configuration's transport section: how producers on other hosts reach the stager.

Part of the one configuration (shared/config/config.py); validates its own keys.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from ringfeed.shared.config.loader import check


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TransportConfig:
    # "ipc" keeps everything on this host; "tcp" also binds host:port so producers
    # on other hosts can connect (local processes keep using ipc).
    kind: Literal["ipc", "tcp"] = "ipc"
    # With kind: tcp, the address the stager binds for remote producers.
    host: str = "127.0.0.1"
    # With kind: tcp, the port of that address.
    port: int = 5555
    # Directory of CURVE keys (shared/wire/keys.py; required for a non-loopback host).
    # When set, the stager accepts only producers whose public key it lists.
    keys_dir: str = ""

    def __post_init__(self) -> None:
        check(1 <= self.port <= 65535, "transport.port", "must be a TCP port number")
        check(
            self.kind != "tcp" or is_loopback(self.host) or self.keys_dir != "",
            "transport.keys_dir",
            f"binding {self.host} (not loopback) needs CURVE keys: run `ringfeed keys DIR "
            "--client NAME` and set transport.keys_dir, or bind transport.host: 127.0.0.1",
        )
        check(
            self.keys_dir == "" or self.kind == "tcp",
            "transport.keys_dir",
            "keys authenticate tcp peers only: set transport.kind: tcp (and host, port), or "
            "remove keys_dir (with kind: ipc no remote producer can reach the stager)",
        )
