"""Trust boundaries without processes: key files are private, readable ones refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringfeed.shared.wire.keys import KeysError, generate, load_client, load_server

pytestmark = pytest.mark.slow


def test_key_files_are_private_and_readable_keys_are_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    bundle = generate(keys, "worker-a")
    for folder in (keys, keys / "authorized", bundle):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    for secret in (keys / "server.key_secret", bundle / "client.key_secret"):
        assert secret.stat().st_mode & 0o777 == 0o600, secret
    load_server(keys), load_client(bundle)  # as made, they load
    (bundle / "client.key_secret").chmod(0o644)
    with pytest.raises(KeysError, match="chmod 600"):
        load_client(bundle)
