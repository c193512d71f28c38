"""One producer process: ask for grants, fill slots, announce them.

Main loop (one screen): poll the stager, take one grant, prepare the sample
(producer/sources.py), write it into the granted slot, seal and announce it,
heartbeat, check the stop flag. TensorFlow is never imported here.

How a sample reaches the stager is the SlotWriter's business
(producer/slot_writer.py), chosen at WELCOME: a local producer writes straight
into the shared-memory slot; a remote one (``remote=True``, another host) sends
the used rows of each field as raw ZeroMQ frames and the stager copies them in.

An unexpected exception in a sample's work is that sample's SKIP, with the
stage the source was in (``Source.stage``: text, audio, features, cache, ...)
or "write" when the sample did not fit its slot.

Orphans and refusals. A producer that has heard nothing from the stager for
producers.orphan_s since a stager WELCOMEd it exits with EXIT_ORPHANED, whatever
it sends meanwhile: only a message from the stager resets that clock, never its
own HELLO. Only time it ran counts: a loop that did not turn for a lease (the
process was SIGSTOPped, its VM suspended, a sample took that long) says HELLO
again and starts the clock anew, for the stager may be fine and waiting. Before
its first WELCOME it waits for its stager as long as it takes (a stager
measuring a length manifest may take minutes to bind). A REFUSED from the stager
(another protocol version, another config: the reason says what to change), or
any message in another protocol version, ends it with EXIT_REFUSED. The pools
restart neither (producer/pool.py).

Goodbyes: on stop the worker sends BYE and waits up to SHUTDOWN_WAIT_S for
BYE_ACK, because ZeroMQ may drop the last messages of a process that exits
right after sending; correctness never depends on it (leases cover a lost
BYE), but an acknowledged exit frees its grants at once.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from ringfeed.producer.sample import Sample, SkipSample
from ringfeed.producer.slot_writer import LocalSlotWriter, RemoteSlotWriter, SlotWriter
from ringfeed.producer.sources import Source, base_source, make_source
from ringfeed.producer.watchdog import SampleTimeout, TimeLimit
from ringfeed.shared.config import Config
from ringfeed.shared.memory.ring import Ring
from ringfeed.shared.run.fingerprint import config_fingerprint, corpus_digest
from ringfeed.shared.run.process import POLL_S, POOL_ORPHANED, SHUTDOWN_WAIT_S, StopFlag
from ringfeed.shared.sample.content import content_error
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import ClientKeys, load_client
from ringfeed.shared.wire.sockets import make_socket, recv, send

EVENTS, POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum flags cost a call
log = logging.getLogger(__name__)

# A producer that hears nothing from the stager for ring.lease_s says HELLO again (the
# stager restarted); one that hears nothing for producers.orphan_s after a WELCOME
# exits (the stager is gone).
# Exit codes of a worker that must not be restarted: its run is over (SHUTDOWN, SIGTERM),
# its stager is gone, or the stager refused it. Any other code, 0 included (a library
# that called sys.exit(0)), is a death the pool restarts.
EXIT_FINISHED, EXIT_ORPHANED, EXIT_REFUSED = 3, 4, 5
ENDINGS = {
    EXIT_FINISHED: "finished",
    EXIT_ORPHANED: "lost its stager (no word for producers.orphan_s)",
    EXIT_REFUSED: "was refused by the stager (its log says why)",
}
# Longest quarantine reason for an unexpected exception, characters.
MAX_REASON_CHARS = 400


def describe(exc: BaseException, stage: str) -> str:
    """One line for the quarantine: the exception, where in our stages, where in code."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    text = f"unexpected {type(exc).__name__} in {stage}{where}: {exc}"
    return text[:MAX_REASON_CHARS]


class Worker:
    """State of one producer process between setup and teardown."""

    def __init__(self, cfg: Config, name: str, endpoint: str, remote: bool, stop: StopFlag):
        self.cfg, self.name, self.endpoint, self.remote = cfg, name, endpoint, remote
        self.stop = stop
        base = base_source(cfg)
        self.source: Source = make_source(cfg, base)
        self.fields = cfg.sample_fields()  # name -> (shape, dtype), in ring order
        self.ctx = zmq.Context()
        self.sock: zmq.Socket | None = None
        self.writer: SlotWriter | None = None  # from WELCOME on (connect drops it)
        self.grants: deque[p.GrantEntry] = deque()
        self.ready_batch = max(1, cfg.producers.credits // 4)
        self.done = 0
        self.last_sent = self.last_heard = self.last_heartbeat = time.monotonic()
        self.last_turn = time.monotonic()  # the loop's last turn: a longer gap is a pause
        self.welcomed = False  # by the stager, on the current socket
        self.ever_welcomed = False  # from then on, the orphan clock runs
        self.ending = EXIT_FINISHED  # or EXIT_ORPHANED, EXIT_REFUSED: what run_worker returns
        # In every HELLO: the config keys that shape a sample and the corpus's content.
        self.config_print = config_fingerprint(cfg, corpus_digest(cfg, base.index))
        self.hello_at = self.last_request = 0.0
        self.on_welcome: Callable[[], object] | None = None
        self.token = secrets.token_hex(16)  # this process, in every HELLO (shared.wire.protocol)
        self.n_taken_back = 0  # grants dropped unwritten: the stager had taken them back
        # Set by a cluster engine (producer/ray_pool.py): keys handed over, where it runs.
        self.keys: ClientKeys | None = None
        self.place = ""
        self.busy: Any = None  # shared with the pool: when the current sample began
        self.limit = TimeLimit(0)  # each sample's bound, from run() on (needs busy)

    # ------------------------------------------------------------ setup
    def connect(self) -> None:
        """(Re)open the control socket and say HELLO; the WELCOME arrives in the loop."""
        if self.sock is not None:
            self.sock.close()
        ident = f"{self.name}:{os.getpid()}:{time.monotonic_ns()}".encode()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=ident)
        if self.endpoint.startswith("tcp://") and self.cfg.transport.keys_dir:
            keys = self.keys or load_client(Path(self.cfg.transport.keys_dir))
            self.sock.curve_publickey, self.sock.curve_secretkey = keys.public, keys.secret
            self.sock.curve_serverkey = keys.server_public
        self.sock.connect(self.endpoint)
        self.n_taken_back += len(self.grants)  # void: the stager took them back (REHELLO)
        self.grants.clear()
        self.drop_writer()  # READY entries not yet sent belong to the old session
        hello = p.Hello(self.name, os.getpid(), socket.gethostname(), self.remote, self.token,
                        self.place, self.config_print)  # fmt: skip
        self._send(hello)
        self.hello_at = time.monotonic()  # not last_heard: our own HELLO proves nothing
        self.welcomed = False

    def drop_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _send(self, msg: p.Message, payload: list | None = None) -> None:
        assert self.sock is not None
        send(self.sock, msg, payload)
        self.last_sent = time.monotonic()

    # ------------------------------------------------------------ loop
    def run(self) -> None:
        self.limit = TimeLimit(self.cfg.ring.lease_s, self.busy)
        self.connect()
        self.last_turn = time.monotonic()
        while not self.stop.is_set():
            self.poll(POLL_S if not self.grants else 0)
            if self.grants and self.writer is not None:
                self.fill(self.grants.popleft())
            if self.writer is not None and (
                self.writer.pending() >= self.ready_batch or not self.grants
            ):
                self.writer.flush()
            self.keep_alive()

    def poll(self, timeout_s: float) -> None:
        assert self.sock is not None
        if timeout_s > 0:
            if not self.sock.poll(timeout_s * 1000):
                return
        elif not self.sock.getsockopt(EVENTS) & POLLIN:  # between samples: one cheap call
            return
        while True:
            try:
                _, msg, _ = recv(self.sock)
            except zmq.Again:
                return
            except p.VersionMismatch as exc:
                self.end(EXIT_REFUSED, f"the stager speaks ringfeed protocol version "
                         f"{exc.theirs}, this producer version {exc.ours}: run the same "
                         "ringfeed version on every host")  # fmt: skip
                return
            except p.ProtocolError as exc:
                log.warning("dropped a malformed message from the stager: %s", exc)
                continue
            self.last_heard = time.monotonic()
            self.handle(msg)

    def end(self, code: int, why: str) -> None:
        """Stop for good with this exit code (never restarted: producer/pool.py)."""
        log.error("%s: %s; exiting", self.name, why)
        self.ending = code
        self.stop.set()

    def handle(self, msg: p.Message) -> None:
        if isinstance(msg, p.Grant):
            self.grants.extend(msg.entries())
        elif isinstance(msg, p.Welcome):
            self.welcome(msg)
        elif isinstance(msg, p.Rehello):
            log.info("the stager restarted; saying HELLO again")
            self.connect()
        elif isinstance(msg, p.Shutdown):
            log.info("stager says stop (%s)", msg.reason)
            self.stop.set()
        elif isinstance(msg, p.Refused):
            self.end(EXIT_REFUSED, f"refused by the stager: {msg.reason}")

    def welcome(self, msg: p.Welcome) -> None:
        if msg.n_items != self.source.n_items:
            raise RuntimeError(
                f"the stager plans {msg.n_items} items but this producer reads "
                f"{self.source.n_items}: both must use the same data.path and config"
            )
        if self.writer is not None:  # welcomed twice on one socket: send what we wrote
            self.writer.flush()
        self.drop_writer()
        self.writer = self.make_writer(msg.ring_name)
        self.last_request = time.monotonic()
        self.welcomed = self.ever_welcomed = True
        if self.on_welcome is not None:
            self.on_welcome()
        self._send(p.Request(self.cfg.producers.credits))

    def make_writer(self, ring_name: str) -> SlotWriter:
        """The one place where local and remote producers differ."""
        if self.remote:
            return RemoteSlotWriter(self.fields, self._send)
        return LocalSlotWriter(Ring.attach(ring_name), self.fields, self._send)

    def keep_alive(self) -> None:
        """Heartbeats, and repairs of what a lossy link loses: a HELLO or WELCOME (say
        HELLO again), a REQUEST or the credit a READY carried (an idle producer asks
        again every heartbeat; the stager caps credits, so asking twice costs nothing)."""
        now = time.monotonic()
        paused, self.last_turn = now - self.last_turn, now
        if paused > self.cfg.ring.lease_s:  # its silence says nothing about the stager
            log.warning("this producer did not run for %.0f s (stopped, or a sample that "
                        "long); saying HELLO again", paused)  # fmt: skip
            self.last_heard = now
            self.connect()
            return
        silent = now - self.last_heard
        if self.ever_welcomed and silent > self.cfg.producers.orphan_s:
            self.end(EXIT_ORPHANED, f"no word from the stager for {silent:.0f} s (it is gone)")
            return
        if not self.welcomed and now - self.hello_at > self.cfg.ring.lease_s:
            log.warning("no WELCOME %.1f s after HELLO; saying HELLO again", now - self.hello_at)
            self.connect()
            return
        if (
            self.welcomed
            and not self.grants
            and now - self.last_request >= self.cfg.ring.heartbeat_s
        ):
            self._send(p.Request(self.cfg.producers.credits))
            self.last_request = now
        # Every heartbeat_s (not each time it runs out of grants: at full rate that was
        # two more messages a sample); the BYE carries the final counters.
        if now - self.last_heartbeat >= self.cfg.ring.heartbeat_s:
            self._send(p.Heartbeat(self.done, self.work()))
            self.last_heartbeat = now
        if self.welcomed and silent > self.cfg.ring.lease_s:
            log.warning("stager silent for %.1f s; saying HELLO again", silent)
            self.connect()

    # ------------------------------------------------------------ work
    def fill(self, grant: p.GrantEntry) -> None:
        """Prepare one item and hand it to the writer, or send its SKIP (after WELCOME)."""
        writer = self.writer
        assert writer is not None
        if not writer.claim(grant):
            self.dropped(grant)
            return
        sample = self.prepare(grant)
        if sample is not None and not self.write(writer, grant, sample):
            self.dropped(grant)
            return
        self.done += 1  # each READY or SKIP entry also asks for one more grant

    def prepare(self, grant: p.GrantEntry) -> Sample | None:
        """The item's sample, or None once its SKIP is sent."""
        try:
            with self.limit:
                sample = self.source.prepare(grant.item, grant.position // self.source.n_items)
            rows = {name: sample.array(name) for name in self.fields}
            why = content_error(rows, self.cfg.vocab_size)  # the stager checks it too
            if why:
                raise SkipSample(why, stage="check")
            return sample
        except SampleTimeout as late:  # producer/watchdog.py: a hang costs its sample
            self.skip(grant, f"{late}: raise it if samples take that long", "",
                      self.source.stage)  # fmt: skip
        except SkipSample as skip:
            self.skip(grant, skip.reason, skip.path, skip.stage or self.source.stage)
        except Exception as exc:  # one sample's failure, whatever it is, costs that sample
            self.fail(grant, exc, self.source.stage)
        return None

    def write(self, writer: SlotWriter, grant: p.GrantEntry, sample: Sample) -> bool:
        """Hand the sample to the writer; False if the grant was taken back meanwhile."""
        try:
            return writer.write(grant, sample)
        except Exception as exc:  # a sample that does not fit its slot costs that sample
            self.fail(grant, exc, "write")
            return True

    def dropped(self, grant: p.GrantEntry) -> None:
        """The stager took this grant back: it re-grants the item; we send nothing."""
        log.info("%s: grant of slot %d was taken back; dropped", self.name, grant.slot)
        self.n_taken_back += 1

    def work(self) -> dict[str, int]:
        """This process's counters for the stager: its source's stages, grants dropped."""
        counters = {**self.source.work(), "taken_back": self.n_taken_back}
        # Within the protocol's bounds, or the stager drops the whole HEARTBEAT and BYE.
        kept = [(k, v) for k, v in counters.items() if len(k) <= p.MAX_WORK_KEY]
        return dict(kept[: p.MAX_WORK_KEYS])

    def fail(self, grant: p.GrantEntry, exc: Exception, stage: str) -> None:
        """An unexpected exception in the item's work: log it and quarantine the item."""
        log.error("%s: item %d failed in %s", self.name, grant.item, stage, exc_info=exc)
        self.skip(grant, describe(exc, stage), "", stage)

    def skip(self, grant: p.GrantEntry, reason: str, path: str, stage: str) -> None:
        path = path or self.source.path(grant.item)
        cap = p.MAX_STR["reason"]  # the stager drops a SKIP over the protocol's limits
        skip = p.Skip(grant.slot, grant.generation, grant.item, reason[:cap], path[-cap:], stage)
        self._send(skip)

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Say BYE, wait briefly for BYE_ACK, and let go of everything (never unlinks)."""
        if self.sock is not None and self.welcomed and self.ending == EXIT_FINISHED:
            if self.writer is not None:
                self.writer.flush()
            self._send(p.Bye(self.done, self.work()))
            deadline = time.monotonic() + SHUTDOWN_WAIT_S
            while time.monotonic() < deadline and self.sock.poll(POLL_S * 1000):
                try:
                    _, msg, _ = recv(self.sock)
                except (zmq.Again, p.ProtocolError):
                    continue
                if isinstance(msg, p.ByeAck):
                    break
        if self.sock is not None:
            self.sock.close()
        self.drop_writer()
        self.ctx.term()

    def report_crash(self, text: str) -> None:
        if self.sock is not None:
            self._send(p.Crash(self.name, text[-p.MAX_STR["traceback"] :]))


def pool_exit_code(endings: list[int]) -> int:
    """A pool's exit code from the exit codes that ended its workers for good (0: one
    the pool stopped): 2 if the stager refused one (its log says what to change),
    POOL_ORPHANED if each lost its stager (shared/run/process.py), else 0."""
    ended = [code for code in endings if code]
    if EXIT_REFUSED in ended:
        return 2
    return POOL_ORPHANED if ended and all(code == EXIT_ORPHANED for code in ended) else 0


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
    """Process entry of one producer (spawned by producer/pool.py, or run in a Ray actor
    by producer/ray_pool.py with its keys, its place and its own stop flag); returns
    the exit code. busy: a shared double the worker sets while it works on a sample
    (producer/watchdog.py), for its pool's hard bound."""
    from ringfeed.producer.threads import pin_math_threads

    pin_math_threads(cfg.producers.math_threads)
    stop = stop or StopFlag().install()
    worker = Worker(cfg, name, endpoint, remote, stop)
    worker.on_welcome = on_welcome
    worker.keys, worker.place, worker.busy = keys, place, busy
    try:
        worker.source.warm_up()  # every stage once, before HELLO: none of it in a lease
        worker.run()
    except Exception:
        text = traceback.format_exc()
        log.error("%s crashed:\n%s", name, text)
        worker.report_crash(text)
        worker.close()
        return 1
    worker.close()
    return worker.ending
