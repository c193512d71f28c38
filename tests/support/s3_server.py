"""A real S3-compatible server on localhost for the object-storage tests: moto's
standalone server (a subprocess), behind a proxy that can break responses.

    with S3Server(tmp_path) as s3:
        s3.env()                      # AWS_* for this process and its children
        s3.put("bucket/key.tar", data)
        s3.break_next_gets = 1        # the next whole-object GET of a .tar is cut short
        s3.break_next_ranges = 1      # the next ranged GET of a .parquet is cut short
        s3.tar_bytes, s3.tar_fetches  # bytes of the .tar objects fetched whole; which

The proxy relays one HTTP request at a time to moto (each on its own upstream
connection). A broken GET answers 200 with the object's full Content-Length and
then closes after a few bytes: a broken pipe mid-body, as S3 and GCS give
(webdataset#473). Ranged GETs of tar shards (the index build's scan) are never
broken; those of Parquet files (the build's and the producers' reads) are when asked.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support.polling import wait_for
from tests.support.ports import free_port

HEAD_END = b"\r\n\r\n"


def _read_head(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
    while HEAD_END not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(HEAD_END)
    return head + HEAD_END, rest


class S3Server:
    def __init__(self, tmp_path: Path) -> None:
        self.moto_port, self.port = free_port(), free_port()
        self.log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115 - closed in __exit__
        self.break_next_gets = 0
        self.break_next_ranges = 0
        self.broken = 0
        self.gets = 0
        self.tar_bytes = 0  # the bodies of whole-object GETs of .tar files sent
        self.tar_fetches: list[str] = []  # their paths, in order
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stop = threading.Event()

    def __enter__(self) -> S3Server:
        argv = [sys.executable, "-m", "moto.server", "-p", str(self.moto_port)]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log)
        wait_for(self._up, 30, "moto's server")
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()

    def _up(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.moto_port), 0.2).close()
            return True
        except OSError:
            return False

    def env(self) -> dict[str, str]:
        """The environment a store client reads (never the config file)."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
        }

    def client(self) -> Any:
        import s3fs

        os.environ.update(self.env())
        return s3fs.S3FileSystem(skip_instance_cache=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                got = _read_head(conn, buf)
                if got is None:
                    return
                head, buf = got
                if b"expect: 100-continue" in head.lower():  # the client waits for this first
                    conn.sendall(b"HTTP/1.1 100 Continue" + HEAD_END)
                length = (
                    int(m.group(1)) if (m := re.search(rb"(?i)content-length: *(\d+)", head)) else 0
                )
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                try:
                    if not self._answer(conn, head, body):
                        return
                except OSError:  # the server is stopping, or the client left
                    return

    def _answer(self, conn: socket.socket, head: bytes, body: bytes) -> bool:
        """Relay one request; False when the client connection must close."""
        first = head.split(b"\r\n", 1)[0]
        whole_get = first.startswith(b"GET ") and b".tar" in first and b"range:" not in head.lower()
        ranged = first.startswith(b"GET ") and b".parquet" in first and b"range:" in head.lower()
        self.gets += whole_get
        with socket.create_connection(("127.0.0.1", self.moto_port)) as up:
            lines = [
                h
                for h in head[: -len(HEAD_END)].split(b"\r\n")
                if not h.lower().startswith((b"connection:", b"expect:"))
            ]
            up.sendall(b"\r\n".join(lines) + b"\r\nConnection: close" + HEAD_END + body)
            response = b""
            while chunk := up.recv(65536):
                response += chunk
        breaks = self.break_next_gets if whole_get else self.break_next_ranges if ranged else 0
        if breaks > 0 and len(response) > response.index(HEAD_END) + len(HEAD_END) + 200:
            if whole_get:
                self.break_next_gets -= 1
            else:
                self.break_next_ranges -= 1
            self.broken += 1
            cut = response.index(HEAD_END) + len(HEAD_END) + 100
            conn.sendall(response[:cut])  # the full Content-Length promised, 100 bytes sent
            return False
        conn.sendall(response)
        if whole_get:
            self.tar_bytes += len(response) - response.index(HEAD_END) - len(HEAD_END)
            self.tar_fetches.append(first.split(b" ")[1].decode())
        return b"connection: close" not in response.split(HEAD_END, 1)[0].lower()
