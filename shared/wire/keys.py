"""CURVE keys for producers on other hosts: layout, generation, loading.

A keys directory (``transport.keys_dir``) holds, on the head host::

    server.key            the stager's public key (copy it to producer hosts)
    server.key_secret     the stager's secret key (never leaves the head)
    authorized/NAME.key   public keys of producers the stager accepts

and on a producer host::

    server.key            the head's public key
    client.key_secret     this host's key pair (generated for it on the head)

``ringfeed keys DIR --client NAME`` makes the server pair once and a client
pair per producer host, already authorized. Files are ZeroMQ's certificate
format (zmq.auth), so zmq tools can read them. Directories are made 0700 and
secret keys 0600 (under umask 077, so no moment exists when they are not), and
a secret key that others can read is refused with the chmod that fixes it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq.auth
from zmq.utils import z85


class KeysError(ValueError):
    """A keys directory is missing a file it needs; the message says which and how."""


@dataclass(frozen=True)
class ServerKeys:
    """public and secret in Z85 text (socket options take it); authorized raw."""

    public: bytes
    secret: bytes
    authorized: frozenset[bytes]


@dataclass(frozen=True)
class ClientKeys:
    public: bytes
    secret: bytes
    server_public: bytes


def generate(keys_dir: Path, client: str) -> Path:
    """Create the server pair (if missing) and an authorized pair for `client`.

    Returns the folder to copy to the producer host (server.key + client.key_secret).
    """
    old_umask = os.umask(0o077)
    try:
        bundle = keys_dir / f"for-{client}"
        for folder in (keys_dir, keys_dir / "authorized", bundle):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.chmod(0o700)
        if not (keys_dir / "server.key_secret").exists():
            zmq.auth.create_certificates(keys_dir, "server")
        zmq.auth.create_certificates(keys_dir / "authorized", client)
        shutil.copy(keys_dir / "server.key", bundle / "server.key")
        secret = keys_dir / "authorized" / f"{client}.key_secret"
        shutil.move(secret, bundle / "client.key_secret")
    finally:
        os.umask(old_umask)
    for path in (keys_dir / "server.key_secret", bundle / "client.key_secret"):
        path.chmod(0o600)
    return bundle


def _load(path: Path, what: str) -> tuple[bytes, bytes | None]:
    if not path.exists():
        hint = "make keys with `ringfeed keys DIR --client NAME`"
        raise KeysError(f"{path} is missing ({what}); {hint}")
    mode = path.stat().st_mode & 0o777
    if path.name.endswith("_secret") and mode & 0o077:
        raise KeysError(
            f"{path} ({what}) can be read by other users (mode {mode:o}): run chmod 600 {path}"
        )
    return zmq.auth.load_certificate(path)


def load_server(keys_dir: Path) -> ServerKeys:
    """The stager's pair and the producers it accepts."""
    public, secret = _load(keys_dir / "server.key_secret", "the stager's secret key")
    # Raw 32-byte keys: what ZeroMQ's ZAP requests carry (the files hold Z85 text).
    authorized = frozenset(
        z85.decode(zmq.auth.load_certificate(p)[0])
        for p in sorted((keys_dir / "authorized").glob("*.key"))
    )
    if not authorized:
        raise KeysError(f"{keys_dir}/authorized holds no producer keys: no producer could join")
    return ServerKeys(public, secret or b"", authorized)


def load_client(keys_dir: Path) -> ClientKeys:
    """A producer host's pair and the head's public key."""
    public, secret = _load(keys_dir / "client.key_secret", "this host's key pair")
    server_public, _ = _load(keys_dir / "server.key", "the head's public key")
    return ClientKeys(public, secret or b"", server_public)
