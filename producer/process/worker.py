"""One producer process: ask for grants, fill slots, announce them.

Main loop (one screen): poll the stager and feed what it says to the session,
tick the session, fill one grant (prepare the sample, producer/sources.py, and
write it into the granted place), tick again, answer the run once its last grant is
filled, check the stop flag.
TensorFlow is never imported here.

The protocol's rules (HELLO and WELCOME, heartbeats, the orphan rule, REFUSED,
goodbyes) are the session's (producer/process/session.py), a state machine that owns no
socket and reads no clock; this module owns the socket, the slot writer and the
sample work, and does what the session says.

How a sample reaches the stager is the SlotWriter's business
(producer/process/slot_writer.py), chosen at WELCOME: a local producer writes straight
into its granted place (a row of the batch the sample is delivered in, or a spare);
a remote one (``remote=True``, another host) sends the used rows of each field as
raw ZeroMQ frames and the stager copies them in.

An unexpected exception in a sample's work is that sample's SKIP, with the
stage it failed in (producer/sample.py ``stage_of``: text, audio, features, cache, ...)
or "write" when writing it failed; a sample longer than its batch's length bucket
is skipped with stage "bucket".
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from ringfeed.producer.causes import stage_causes
from ringfeed.producer.process.session import EXIT_REFUSED, Action, Join, NewSocket, Rules, Session
from ringfeed.producer.process.slot_writer import (
    BadValues,
    LocalSlotWriter,
    Misfit,
    RemoteSlotWriter,
    SlotWriter,
)
from ringfeed.producer.process.watchdog import SampleTimeout, TimeLimit
from ringfeed.producer.sample import Sample, SkipSample, error_of, stage_of
from ringfeed.producer.sources import Source, base_source, make_source
from ringfeed.producer.start_check import FieldsRefused
from ringfeed.shared.config import Config
from ringfeed.shared.memory.places import Places
from ringfeed.shared.memory.ring import Ring
from ringfeed.shared.run.fingerprint import config_fingerprint, corpus_digest
from ringfeed.shared.run.process import POLL_S, StopFlag
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import ClientKeys, load_client
from ringfeed.shared.wire.sockets import connect, make_socket, recv, send

EVENTS, POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum flags cost a call
log = logging.getLogger(__name__)

# Longest quarantine reason for an unexpected exception, characters.
MAX_REASON_CHARS = 400


def describe(exc: BaseException, stage: str) -> str:
    """One line for the quarantine: the exception, where in our stages, where in code."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    text = f"unexpected {type(exc).__name__} in {stage}{where}: {exc}"
    return text[:MAX_REASON_CHARS]


class Worker:
    """One producer process between setup and teardown: its socket, its slot writer and
    its sample work. on_welcome: called at each WELCOME (the pool's "joined"); keys and
    place: set by a cluster engine (producer/process/ray_pool.py), the keys handed over and
    where it runs; busy: a shared double the worker sets while it works on a sample
    (producer/process/watchdog.py), for its pool's hard bound."""

    def __init__(
        self,
        cfg: Config,
        name: str,
        endpoint: str,
        remote: bool,
        stop: StopFlag,
        on_welcome: Callable[[], object] | None = None,
        keys: ClientKeys | None = None,
        place: str = "",
        busy: Any = None,
    ) -> None:
        self.cfg, self.name, self.endpoint, self.remote = cfg, name, endpoint, remote
        self.stop, self.on_welcome, self.keys = stop, on_welcome, keys
        base = base_source(cfg)
        self.source: Source = make_source(cfg, base)
        self.fields = cfg.sample_fields()  # name -> (shape, dtype), in ring order
        self.limit = TimeLimit(cfg.ring.lease_s, busy)  # each sample's bound
        # token: this process, in every HELLO (shared.wire.protocol); config: the keys that
        # shape a sample and the corpus's content; causes: what decides each stage's verdict.
        config_print = config_fingerprint(cfg, corpus_digest(cfg, base.index))
        hello = p.Hello(
            name,
            os.getpid(),
            socket.gethostname(),
            remote,
            secrets.token_hex(16),
            place,
            config_print,
            stage_causes(cfg),
        )
        self.session = Session(hello, self.source.n_items, Rules.of(cfg), self.source.work)
        self.ctx = zmq.Context()
        self.sock: zmq.Socket | None = None  # from start() on, a new one at each HELLO
        self.writer: SlotWriter | None = None  # from WELCOME on (a new socket drops it)

    # ------------------------------------------------------------ loop
    def run(self) -> None:
        """Until stopped or the session ends: poll, fill one run, flush, tick."""
        self.start()
        while not self.stop.is_set() and self.session.ending is None:
            self.poll(POLL_S if not self.session.grants else 0)
            # Ticks before a run is taken and before READYs go out: a process that was
            # stopped (SIGSTOP, a suspended VM) meanwhile says HELLO again first, and
            # nothing it prepared for the old session reaches the stager.
            self.act(self.session.tick(time.monotonic()))
            run = self.session.take_run()
            if run:
                self.fill_run(run)
                self.act(self.session.tick(time.monotonic()))
                if self.writer is not None:
                    self.writer.flush()

    def start(self) -> None:
        """Open the control socket and say HELLO; the WELCOME arrives in poll()."""
        self.act(self.session.start(time.monotonic()))

    def poll(self, timeout_s: float) -> None:
        """Feed the session every message waiting, after up to timeout_s for the first."""
        assert self.sock is not None
        if timeout_s > 0:
            if not self.sock.poll(timeout_s * 1000):
                return
        elif not self.sock.getsockopt(EVENTS) & POLLIN:  # between samples: one cheap call
            return
        while self.session.ending is None:
            try:
                _, msg, _ = recv(self.sock)
            except zmq.Again:
                return
            except p.VersionMismatch as exc:
                self.session.heard_other_version(exc)
                return
            except p.ProtocolError as exc:
                log.warning("dropped a malformed message from the stager: %s", exc)
                continue
            self.act(self.session.heard(msg, time.monotonic()))

    def act(self, actions: list[Action]) -> None:
        """Do what the session says, in order."""
        for action in actions:
            if isinstance(action, NewSocket):
                self.new_socket()
            elif isinstance(action, Join):
                self.join(action.ring_name, action.spares)
            else:
                self._send(action)

    def new_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
        ident = f"{self.name}:{os.getpid()}:{time.monotonic_ns()}".encode()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=ident)
        if self.endpoint.startswith("tcp://") and self.cfg.transport.keys_dir:
            keys = self.keys or load_client(Path(self.cfg.transport.keys_dir))
            self.sock.curve_publickey, self.sock.curve_secretkey = keys.public, keys.secret
            self.sock.curve_serverkey = keys.server_public
        connect(self.sock, self.endpoint)
        self.drop_writer()  # READY entries not yet sent belong to the old session

    def join(self, ring_name: str, spares: str) -> None:
        if self.writer is not None:  # welcomed twice on one socket: send what we wrote
            self.writer.flush()
        self.drop_writer()
        self.writer = self.make_writer(ring_name, spares)
        if self.on_welcome is not None:
            self.on_welcome()

    def make_writer(self, ring_name: str, spares: str) -> SlotWriter:
        """The one place where local and remote producers differ."""
        if self.remote:
            return RemoteSlotWriter(self.fields, self._send, self.cfg.schema, self.cfg.vocab_size)
        batches = Ring.attach(ring_name)
        try:
            spare_ring = Ring.attach(spares)
        except BaseException:
            batches.close()
            raise
        return LocalSlotWriter(
            Places(batches, spare_ring, self.cfg.schema),
            self.fields,
            self._send,
            self.cfg.vocab_size,
        )

    def drop_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _send(self, msg: p.Message, payload: list | None = None) -> None:
        assert self.sock is not None
        send(self.sock, msg, payload)

    # ------------------------------------------------------------ work
    def fill_run(self, run: list[p.GrantEntry]) -> None:
        """One GRANT's places, in order, answered with one READY (flushed by run()). A
        remote producer answers each sample as it is written: the stager cannot read how
        far a remote producer got, so the oldest grant it still holds must be the one it
        was working on when it dies (that item is charged, no other:
        docs/design.md#contract-10)."""
        self.limit.guard()  # once a run, not a sample: a library may have replaced it
        for grant in run:
            if self.stop.is_set() or self.writer is None:
                return  # what is left is taken back by the stager: a lease, or our BYE
            self.fill(grant)
            if self.remote:
                self.writer.flush()

    def fill(self, grant: p.GrantEntry) -> None:
        """Prepare one item and hand it to the writer, or send its SKIP (after WELCOME)."""
        writer = self.writer
        assert writer is not None
        if not writer.claim(grant):
            self.session.dropped(grant)
            return
        sample = self.prepare(grant)
        if sample is not None and not self.write(writer, grant, sample):
            self.session.dropped(grant)
            return
        self.session.filled(grant)

    def prepare(self, grant: p.GrantEntry) -> Sample | None:
        """The item's sample, or None once its SKIP is sent."""
        try:
            with self.limit:
                return self.source.prepare(grant.item, grant.position // self.source.n_items)
        except SampleTimeout as late:  # producer/process/watchdog.py: a hang costs its sample
            self.skip(grant, f"{late}: raise it if samples take that long", "", stage_of(late))
        except SkipSample as skip:
            self.skip(grant, skip.reason, skip.path, stage_of(skip))
        except Exception as exc:  # one sample's failure, whatever it is, costs that sample
            self.fail(grant, error_of(exc), stage_of(exc))
        return None

    def write(self, writer: SlotWriter, grant: p.GrantEntry, sample: Sample) -> bool:
        """Hand the sample to the writer; False if the grant was taken back meanwhile."""
        try:
            return writer.write(grant, sample)
        except Misfit as exc:  # the length table said otherwise: a changed file
            self.skip(grant, str(exc), "", "bucket")
            return True
        except BadValues as exc:  # found as it was copied: the stager checks it too
            self.skip(grant, str(exc), "", "check")
            return True
        except Exception as exc:  # a sample that does not fit its place costs that sample
            self.fail(grant, exc, "write")
            return True

    def fail(self, grant: p.GrantEntry, exc: Exception, stage: str) -> None:
        """An unexpected exception in the item's work: log it and quarantine the item."""
        log.error("%s: item %d failed in %s", self.name, grant.item, stage, exc_info=exc)
        self.skip(grant, describe(exc, stage), "", stage)

    def skip(self, grant: p.GrantEntry, reason: str, path: str, stage: str) -> None:
        path = path or self.source.path(grant.item)
        cap = p.MAX_STR["reason"]  # the stager drops a SKIP over the protocol's limits
        skip = p.Skip(grant.generation, grant.place, grant.item, reason[:cap], path[-cap:], stage)
        self._send(skip)

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Say BYE if the session says so, wait for BYE_ACK up to SHUTDOWN_WAIT_S, and let
        go of everything (never unlinks)."""
        if self.sock is not None:
            bye = self.session.leave(time.monotonic())
            if bye and self.writer is not None:
                self.writer.flush()  # before BYE, which frees this producer's grants
            self.act(bye)
            self.await_bye_ack()
            self.sock.close()
        self.drop_writer()
        self.ctx.term()

    def await_bye_ack(self) -> None:
        """Read until the session has left: BYE_ACK, or its wait is over (saying BYE
        again as the session says)."""
        assert self.sock is not None
        while not self.session.left(time.monotonic()):
            self.act(self.session.tick(time.monotonic()))
            if not self.sock.poll(POLL_S * 1000):
                continue
            try:
                _, msg, _ = recv(self.sock)
            except (zmq.Again, p.ProtocolError):
                continue
            self.session.heard(msg, time.monotonic())

    def report_crash(self, text: str) -> None:
        if self.sock is not None:
            self._send(p.Crash(self.name, text[-p.MAX_STR["traceback"] :]))


def run_worker(
    cfg: Config,
    name: str,
    endpoint: str,
    remote: bool = False,
    on_welcome: Callable[[], object] | None = None,
    keys: ClientKeys | None = None,
    place: str = "",
    stop: StopFlag | None = None,
    busy: Any = None,
) -> int:
    """Process entry of one producer (spawned by producer/process/pool.py, or run in a Ray actor
    by producer/process/ray_pool.py with its keys, its place and its own stop flag); returns
    the exit code (producer/process/session.py ENDINGS, or 1 after a crash): EXIT_REFUSED too
    when its warm-up finds a configured field that would fail every clip
    (producer/start_check.py). on_welcome, keys, place, busy: as in :class:`Worker`."""
    from ringfeed.producer.process.threads import pin_math_threads

    pin_math_threads(cfg.producers.math_threads)
    stop = stop or StopFlag().install()
    worker = Worker(cfg, name, endpoint, remote, stop, on_welcome, keys, place, busy)
    try:
        worker.source.warm_up()  # every stage once, before HELLO: none of it in a lease
        worker.run()
    except FieldsRefused as exc:  # every clip would fail: no restart and no HELLO can help
        log.error("%s refused to start: %s", name, exc)
        worker.close()
        return EXIT_REFUSED
    except Exception:
        text = traceback.format_exc()
        log.error("%s crashed:\n%s", name, text)
        worker.report_crash(text)
        worker.close()
        return 1
    worker.close()
    return worker.session.exit_code
