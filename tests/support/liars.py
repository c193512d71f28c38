"""Producers that hold a way in (the ipc socket, or a valid CURVE key) and lie: each
strategy plays the protocol by hand against a live stager until `stop` is set or the
stager stops welcoming it, in a thread of the test (in_thread) or of a benchmark. Over
ipc every liar of one process is one peer to the stager; a liar with a key of its own
over tcp is another."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import zmq

from ringfeed.consumer.client.batch_client import BatchClient, StagerGone, StagerRefused
from ringfeed.producer.sources import SyntheticSource
from ringfeed.shared.config import Config
from ringfeed.shared.memory.places import Places, write_sample
from ringfeed.shared.memory.ring import Ring
from ringfeed.shared.memory.row_pass import rows_checksum
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import load_client

WELCOME_WAIT_S = 0.5


@dataclass
class Tally:
    """What a liar saw: WELCOMEs (joins), HELLOs left unanswered (refusals), lies told."""

    joins: int = 0
    refusals: int = 0
    lies: int = 0
    errors: list[str] = field(default_factory=list)


def connect(ctx: zmq.Context, endpoint: str, keys_dir: str = "") -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys_dir:
        keys = load_client(Path(keys_dir))
        sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
        sock.curve_serverkey = keys.server_public
    sock.connect(endpoint)
    return sock


def receive(sock: zmq.Socket, timeout_s: float) -> p.Message | None:
    if not sock.poll(timeout_s * 1000):
        return None
    return p.decode(sock.recv_multipart())[0]


def join(sock: zmq.Socket, cfg: Config, name: str, remote: bool, tally: Tally) -> p.Welcome | None:
    """HELLO (a new token each time, the run's config) until WELCOME; None if refused."""
    token, prints = os.urandom(8).hex(), config_fingerprint(cfg)
    hello = p.Hello(name, os.getpid(), socket.gethostname(), remote, token, "", prints)
    sock.send_multipart(p.encode(hello))
    deadline = time.monotonic() + WELCOME_WAIT_S
    while (left := deadline - time.monotonic()) > 0:
        if isinstance(welcome := receive(sock, left), p.Welcome):
            tally.joins += 1
            return welcome
    tally.refusals += 1
    return None


def grants_of(sock: zmq.Socket, timeout_s: float = 1.0) -> list[p.GrantEntry]:
    msg = receive(sock, timeout_s)
    return msg.entries() if isinstance(msg, p.Grant) else []


def bad_rows(cfg: Config, item: int) -> list[np.ndarray]:
    """The item's rows with a token id far past the vocabulary and a NaN mel value."""
    sample = SyntheticSource(cfg).prepare(item)
    tokens, mel = sample.tokens.copy(), sample.mel.copy()
    tokens[0], mel[0, 0] = 1_000_000, np.nan
    return [tokens, mel]


def places_of(cfg: Config, welcome: p.Welcome) -> Places:
    """The run's places, attached as a local producer attaches them (close with
    close_places)."""
    return Places(Ring.attach(welcome.ring_name), Ring.attach(welcome.spares), cfg.schema)


def close_places(places: Places) -> None:
    places.forget()
    if places.batches is not None:
        places.batches.close()
    places.spares.close()


def ready_of(g: p.GrantEntry, lengths: list[int], checksum: int) -> p.Ready:
    """A one-entry READY answering grant g."""
    return p.Ready.of([p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, 0)])


def bad_content(cfg: Config, places: Places, g: p.GrantEntry) -> p.Ready:
    """Fill the granted place with bad_rows, sealed and hashed as an honest producer
    would."""
    record = places.record(g.batch, g.place)
    record["writing_generation"] = g.generation
    dst = places.fields(g.batch, g.shape, g.place)
    pads = places.pads if g.batch >= 0 else None
    lengths, checksum, _ = write_sample(dst, bad_rows(cfg, g.item), pads, places.names, 0)
    record["sealed_generation"] = g.generation  # what an honest producer's check refuses
    return ready_of(g, lengths, checksum)


def bad_payload(cfg: Config, g: p.GrantEntry) -> tuple[p.Ready, list[bytes]]:
    """A remote producer's READY of bad_rows, hashed as an honest one would, and its
    payload frames."""
    rows = bad_rows(cfg, g.item)
    lengths, checksum = [len(r) for r in rows], rows_checksum(rows)
    return ready_of(g, lengths, checksum), [r.tobytes() for r in rows]


def mel_past_the_field(cfg: Config, g: p.GrantEntry) -> tuple[p.Ready, list[bytes]]:
    """A remote producer's READY of the item's tokens and a mel marked cached (MEL) of
    its batch's whole bucket, hashed as sent: whole frames of n_mels, within the bucket,
    but more values than the wave field holds when n_mels > hop_length (where no cached
    mel is ever sent: shared/sample/schema.py mels_fit_waves)."""
    from ringfeed.shared.sample.marks import MEL

    frames = g.shape[1] or cfg.features.max_frames
    rows = [
        SyntheticSource(cfg).prepare(g.item).tokens,
        np.zeros(frames * cfg.features.n_mels, np.float32),
    ]
    lengths, checksum = [len(r) for r in rows], rows_checksum(rows)
    entry = p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, MEL)
    return p.Ready.of([entry]), [r.tobytes() for r in rows]


def malformed(g: p.GrantEntry, lie: str = "malformed") -> p.Ready:
    """Lengths no place holds: none (`malformed`), or more than any (`huge-lengths`: the
    largest integer the wire carries, and 2**31, past an int32)."""
    return ready_of(g, [2**53 - 1, 2**31] if lie == "huge-lengths" else [0, 0], 0)


def bad_mel(cfg: Config, places: Places, g: p.GrantEntry, lie: str) -> p.Ready:
    """With stager mels: fill the granted spare with the item's tokens and a wave field
    marked as a cached mel (MEL) that cannot be one, sealed and hashed as an honest
    producer would: one frame more than its batch's bucket (`mel-too-long`), or not
    whole frames of n_mels (`mel-ragged`)."""
    from ringfeed.shared.sample.marks import MEL

    n_mels, frames = cfg.features.n_mels, g.shape[1] or cfg.features.max_frames
    size = (frames + 1) * n_mels if lie == "mel-too-long" else 3 * n_mels + 1
    record = places.record(g.batch, g.place)
    record["writing_generation"] = g.generation
    rows = [SyntheticSource(cfg).prepare(g.item).tokens, np.zeros(size, np.float32)]
    dst = places.fields(g.batch, g.shape, g.place)
    lengths, checksum, _ = write_sample(dst, rows, None, places.names, cfg.vocab_size)
    record["lengths"][0, : len(lengths)] = lengths
    record["sealed_generation"] = g.generation
    return p.Ready.of([p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, MEL)])


def lie_per_grant(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, lie: str, *, tally: Tally
) -> None:
    """Join (over ipc, or over tcp with the key in keys_dir), ask for one grant, answer
    it with the lie (`malformed`, `huge-lengths`: lengths no place holds; `content`:
    out-of-range rows, written into the ring over ipc, sent as payload frames over tcp;
    over ipc with stager mels, `mel-too-long` or `mel-ragged`: bad_mel; over tcp,
    `mel-past-the-field`), say HELLO again, repeat."""
    remote = endpoint.startswith("tcp://")
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        places = None
        try:
            while not stop.is_set():
                welcome = join(sock, cfg, f"liar-{lie}-{os.getpid()}", remote, tally)
                if welcome is None:
                    continue
                sock.send_multipart(p.encode(p.Request(1)))
                for g in grants_of(sock):
                    if lie == "content" and remote:
                        sock.send_multipart(p.encode(*bad_payload(cfg, g)))
                    elif lie == "mel-past-the-field":
                        sock.send_multipart(p.encode(*mel_past_the_field(cfg, g)))
                    elif lie == "content":
                        places = places or places_of(cfg, welcome)
                        sock.send_multipart(p.encode(bad_content(cfg, places, g)))
                    elif lie.startswith("mel-"):
                        places = places or places_of(cfg, welcome)
                        sock.send_multipart(p.encode(bad_mel(cfg, places, g, lie)))
                    else:
                        sock.send_multipart(p.encode(malformed(g, lie)))
                    tally.lies += 1
        finally:
            if places is not None:
                close_places(places)


def crash_flood(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, per_s: int, *, tally: Tally
) -> None:
    """Join, then send CRASH reports of 16 KiB (with terminal escapes) at per_s a
    second, saying HELLO again whenever told to."""
    trace = ("\x1b[2J\x1b]0;owned\x07Traceback (most recent call last):\n" * 400)[:16000]
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        while not stop.is_set():
            if join(sock, cfg, "liar-crash", True, tally) is None:
                continue
            while not stop.wait(0.01):
                for _ in range(max(1, per_s // 100)):
                    try:
                        sock.send_multipart(p.encode(p.Crash("liar-crash", trace)), zmq.NOBLOCK)
                    except zmq.Again:  # its queue is full: the stager reads no faster
                        break
                    tally.lies += 1
                if isinstance(receive(sock, 0), p.Rehello):
                    break


def bad_checksums(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, *, tally: Tally
) -> None:
    """A remote producer with a valid key (in keys_dir), fast: every GRANT answered at
    once with the right rows and a wrong checksum."""
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        while not stop.is_set():
            if join(sock, cfg, "liar-checksum", True, tally) is None:
                continue
            sock.send_multipart(p.encode(p.Request(16)))
            for g in grants_of(sock):
                sample = SyntheticSource(cfg).prepare(g.item)
                rows = [sample.tokens, sample.mel]
                wrong = rows_checksum(rows) ^ 1
                ready = ready_of(g, [len(r) for r in rows], wrong)
                sock.send_multipart(p.encode(ready, [r.tobytes() for r in rows]))
                tally.lies += 1


def silent_identities(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, n: int, *, tally: Tally
) -> None:
    """n sockets with one valid key (in keys_dir) that join, ask for grants and
    heartbeat, and never deliver; each says HELLO again when told to."""
    with zmq.Context() as ctx:
        socks = [connect(ctx, endpoint, keys_dir) for _ in range(n)]
        prints = config_fingerprint(cfg)
        try:
            for i, sock in enumerate(socks):
                hello = p.Hello(f"idle-{i}", 1, "far", True, f"t{i}", "", prints)
                sock.send_multipart(p.encode(hello))
            while not stop.wait(0.2):
                for i, sock in enumerate(socks):
                    while (msg := receive(sock, 0)) is not None:
                        if isinstance(msg, p.Rehello):
                            hello = p.Hello(f"idle-{i}", 1, "far", True, f"t{i}", "", prints)
                            sock.send_multipart(p.encode(hello))
                        elif isinstance(msg, p.Welcome):
                            tally.joins += 1
                        elif isinstance(msg, p.Grant):
                            tally.lies += len(msg.places)
                    sock.send_multipart(p.encode(p.Request(16)))
                    sock.send_multipart(p.encode(p.Heartbeat(0, {})))
        finally:
            for sock in socks:
                sock.close()


def three_bad_rows(cfg: Config, endpoint: str, stop: threading.Event, *, tally: Tally) -> None:
    """A local producer that asks for one run and answers it whole, in one READY, every
    row written in its place and sealed as an honest producer writes it, but three: row 1
    holds a NaN, row 2 a token id past the vocabulary (each hashed as written, as a liar
    that skips its own check would), row 3 changed after its checksum was taken (torn).
    Then it answers nothing more. tally.lies: the three rows."""
    with zmq.Context() as ctx, connect(ctx, endpoint) as sock:
        welcome = join(sock, cfg, "liar-rows", False, tally)
        if welcome is None:
            tally.errors.append("the liar was not welcomed")
            return
        places = places_of(cfg, welcome)
        try:
            sock.send_multipart(p.encode(p.Request(cfg.stager.batch_size)))
            run = grants_of(sock, 5.0)
            source, entries = SyntheticSource(cfg), []
            for k, g in enumerate(run):
                record = places.record(g.batch, g.place)
                record["writing_generation"] = g.generation
                sample = source.prepare(g.item)
                tokens, mel = sample.tokens.copy(), sample.mel.copy()
                if k == 1:
                    mel[0, 0] = np.nan
                elif k == 2:
                    tokens[0] = 1_000_000
                dst = places.fields(g.batch, g.shape, g.place)
                pads = places.pads if g.batch >= 0 else None
                lengths, checksum, _ = write_sample(dst, [tokens, mel], pads, places.names, 0)
                if k == 3:
                    dst[1][0, 0] += 1.0  # after the checksum: what the stager reads is torn
                record["lengths"][0, : len(lengths)] = lengths
                record["sealed_generation"] = g.generation
                entries.append(p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, 0))
            sock.send_multipart(p.encode(p.Ready.of(entries)))
            tally.lies += 3
            stop.wait()
        finally:
            close_places(places)


def in_thread(target: Callable[..., None], *args: object) -> tuple[threading.Thread, Tally]:
    """Run a strategy in a daemon thread; its Tally fills as it goes."""
    tally = Tally()

    def run() -> None:
        try:
            target(*args, tally=tally)
        except Exception as exc:  # the test asserts no liar failed
            tally.errors.append(repr(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, tally


def second_consumers(cfg: Config, run_id: str, stop: threading.Event, *, tally: Tally) -> None:
    """Another consumer of this process, in this thread, with the run's secret, that tries
    to take the run every 0.2 s (a user's second client; two once took the run from each
    other 20 times): each refusal is counted, a welcome is an error."""
    while not stop.wait(0.2):
        client = BatchClient(cfg, run_id, name="second")
        try:
            client.connect(timeout_s=2.0, stop=stop.is_set)
            tally.errors.append("a second consumer of the holder's process took the run")
            return
        except StagerRefused:
            tally.refusals += 1
        except StagerGone:  # stopped, or the stager ended: not a lie
            return
        finally:
            client.close(finished=False)


def name_squatter(
    cfg: Config,
    endpoint: str,
    keys_dir: str,
    stop: threading.Event,
    names: list[str],
    *,
    tally: Tally,
) -> None:
    """One socket per name with a valid key (in keys_dir): each joins under a name an
    honest pool will use, heartbeats, and never asks for a grant; each says HELLO again
    when told to. Before names were per key, this kept an honest pool out for good."""
    with zmq.Context() as ctx:
        socks = [connect(ctx, endpoint, keys_dir) for _ in names]
        prints = config_fingerprint(cfg)
        hellos = [
            p.Hello(name, 1, "far", True, f"sq{i}", "", prints) for i, name in enumerate(names)
        ]
        try:
            for sock, hello in zip(socks, hellos, strict=True):
                sock.send_multipart(p.encode(hello))
            while not stop.wait(0.1):
                for sock, hello in zip(socks, hellos, strict=True):
                    while (msg := receive(sock, 0)) is not None:
                        if isinstance(msg, p.Rehello):
                            sock.send_multipart(p.encode(hello))
                        elif isinstance(msg, p.Welcome):
                            tally.joins += 1
                    sock.send_multipart(p.encode(p.Heartbeat(0, {})))
        finally:
            for sock in socks:
                sock.close()


def undecodable_flood(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, *, tally: Tally
) -> None:
    """A valid key (in keys_dir) that sends undecodable messages as fast as its socket
    takes them (garbage, truncated msgpack, an unknown kind), never a HELLO."""
    garbage = [
        [b"\xc1\xc1 garbage"],
        [msgpack.packb([p.VERSION, 99])[:-1] + b"\xc1"],
        [msgpack.packb([p.VERSION, 99, "x" * 64])],
    ]
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        while not stop.is_set():
            for frames in garbage:
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK)
                    tally.lies += 1
                except zmq.Again:  # its queue is full: the stager reads no faster
                    stop.wait(0.001)


def silent_holders(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, n: int, *, tally: Tally
) -> None:
    """n sockets with one valid key (in keys_dir) that join, ask for grants, then fall
    silent past the lease with them and say HELLO again: each lease that runs out at a
    silent producer would charge its item, so an item quarantined by them would be an
    innocent one ('charge laundering')."""
    lease_s = cfg.ring.lease_s
    with zmq.Context() as ctx:
        socks = [connect(ctx, endpoint, keys_dir) for _ in range(n)]
        try:
            while not stop.is_set():
                for i, sock in enumerate(socks):
                    if join(sock, cfg, f"holder-{i}", True, tally) is None:
                        continue
                    sock.send_multipart(p.encode(p.Request(4)))
                for sock in socks:
                    tally.lies += len(grants_of(sock, 0.2))
                stop.wait(2.5 * lease_s)  # silent: its grants' leases run out
        finally:
            for sock in socks:
                sock.close()


def slow_walker(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, *, tally: Tally
) -> None:
    """A remote producer with a valid key (in keys_dir) that answers every GRANT with the
    right rows and checksum, but only at 85 % of the lease: it never lies and no lease
    expires at it, and each position it holds keeps a deterministic plan waiting."""
    wait_s, beat_s = 0.85 * cfg.ring.lease_s, cfg.ring.heartbeat_s
    source = SyntheticSource(cfg)
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        while not stop.is_set():
            if join(sock, cfg, "slow-walker", True, tally) is None:
                continue
            sock.send_multipart(p.encode(p.Request(16)))
            pending: list[tuple[float, p.GrantEntry]] = []
            beat = time.monotonic()
            while not stop.is_set() and not isinstance(msg := receive(sock, 0.02), p.Rehello):
                now = time.monotonic()
                if isinstance(msg, p.Grant):
                    pending += [(now + wait_s, g) for g in msg.entries()]
                for _, g in [x for x in pending if x[0] <= now]:
                    sample = source.prepare(g.item)
                    rows = [sample.tokens, sample.mel]
                    ready = ready_of(g, [len(r) for r in rows], rows_checksum(rows))
                    sock.send_multipart(p.encode(ready, [r.tobytes() for r in rows]))
                    sock.send_multipart(p.encode(p.Request(1)))
                    tally.lies += 1
                pending = [x for x in pending if x[0] > now]
                if now - beat > beat_s:
                    sock.send_multipart(p.encode(p.Heartbeat(0, {})))
                    beat = now


def made_up(
    cfg: Config,
    endpoint: str,
    keys_dir: str,
    stop: threading.Event,
    kind: str,
    *,
    tally: Tally,
) -> None:
    """A remote producer with a valid key (in keys_dir), fast, whose every READY passes
    every check the stager can make on its own (lengths, checksum, values in range) and
    is made up: `another` item's valid rows (the next item's), `zeros` of the item's
    lengths, its rows with 1 % of the mel at +-1e4 (`outliers`), or its rows repeated
    to the longest a slot holds (`too-long`: past a smaller bucket, as a local
    producer's would make the item a skip). Only computing the item again tells."""
    source = SyntheticSource(cfg)
    longest = (cfg.text.max_text_len, cfg.features.max_frames)
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        while not stop.is_set():
            if join(sock, cfg, f"made-up-{kind}", True, tally) is None:
                continue
            sock.send_multipart(p.encode(p.Request(16)))
            while not stop.is_set() and not isinstance(msg := receive(sock, 0.05), p.Rehello):
                for g in msg.entries() if isinstance(msg, p.Grant) else []:
                    sample = source.prepare(g.item + 1 if kind == "another" else g.item)
                    rows = [sample.tokens, sample.mel]
                    if kind == "zeros":
                        rows = [np.zeros_like(r) for r in rows]
                    elif kind == "outliers":
                        mel = rows[1].copy()
                        flat = mel.reshape(-1)[::100]  # a view: 1 % of the values
                        flat[:] = np.where(np.arange(flat.size) % 2, 1e4, -1e4)
                        rows = [rows[0], mel]
                    elif kind == "too-long":
                        rows = [
                            np.resize(r, (n, *r.shape[1:])).astype(r.dtype)
                            for r, n in zip(rows, longest, strict=True)
                        ]
                    ready = ready_of(g, [len(r) for r in rows], rows_checksum(rows))
                    sock.send_multipart(p.encode(ready, [r.tobytes() for r in rows]))
                    sock.send_multipart(p.encode(p.Request(1)))
                    tally.lies += 1


def skips_all(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, *, tally: Tally
) -> None:
    """A remote producer with a valid key (in keys_dir) that answers every GRANT at once
    with a SKIP ('unreadable audio'): believed, each would quarantine an innocent item."""
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        while not stop.is_set():
            if join(sock, cfg, "skips-all", True, tally) is None:
                continue
            sock.send_multipart(p.encode(p.Request(16)))
            while not stop.is_set() and not isinstance(msg := receive(sock, 0.05), p.Rehello):
                for g in msg.entries() if isinstance(msg, p.Grant) else []:
                    skip = p.Skip(
                        g.generation, g.place, g.item, "unreadable audio (a lie)", "", "audio"
                    )
                    sock.send_multipart(p.encode(skip))
                    tally.lies += 1


def wrong_mels(
    cfg: Config, endpoint: str, keys_dir: str, stop: threading.Event, *, tally: Tally
) -> None:
    """A remote producer with a valid key (in keys_dir), over a corpus of real clips with
    stager mels, whose every READY passes every check the stager can make on its own and
    is a made-up warm cache: its wave field holds a mel marked cached (MEL) of the clip's
    frames, hashed as sent, each value 0.5 off the clip's. Only its audits tell."""
    from ringfeed.producer.pipeline import SamplePipeline
    from ringfeed.shared.config import replace
    from ringfeed.shared.corpus.open import build_in_memory
    from ringfeed.shared.sample.marks import MEL

    index = build_in_memory(cfg)
    pipe = SamplePipeline(replace(cfg, features={"device": "producer", "cache": False}))
    with zmq.Context() as ctx, connect(ctx, endpoint, keys_dir) as sock:
        while not stop.is_set():
            if join(sock, cfg, "wrong-mels", True, tally) is None:
                continue
            sock.send_multipart(p.encode(p.Request(4)))
            while not stop.is_set() and not isinstance(msg := receive(sock, 0.05), p.Rehello):
                for g in msg.entries() if isinstance(msg, p.Grant) else []:
                    sample = pipe(index.entry(g.item), g.item)
                    rows = [sample.tokens, (sample.mel + 0.5).reshape(-1)]
                    lengths, checksum = [len(r) for r in rows], rows_checksum(rows)
                    entry = p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, MEL)
                    sock.send_multipart(p.encode(p.Ready.of([entry]), [r.tobytes() for r in rows]))
                    sock.send_multipart(p.encode(p.Request(1)))
                    tally.lies += 1
    pipe.close()
