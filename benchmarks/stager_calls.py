"""Python function calls per row in the real stager parts: grant, answer and delivery.

    .venv/bin/python benchmarks/stager_calls.py [--batches 40] [--baseline DIR]

A stager is built as ``ringfeed stager`` builds it (consumer/stager/stager.py build: its
plan, slot ledger, producer book and desk, intake, assembly, delivery and consumer side,
on real rings), but its sockets are replaced by a fake that keeps what the stager sends,
so nothing waits. Two local producers are played by this process: each GRANT's rows are
written into their places as a producer writes them (shared/memory/places.py, the seal
last) and answered by one READY a run, handed to the producer desk as the socket would
hand it. The consumer frees each batch as it is announced.

``sys.setprofile`` counts the Python-level calls (``call`` events: functions,
methods, comprehensions, generator resumptions) made inside the stager's parts in each
phase, and the calls into C (``c_call``: numpy, msgpack, the builtins) beside them:

- grant: ProducerDesk.grant (the producer book's round, the ledger's runs, GRANT messages);
- answer: ProducerDesk.handle of each READY (the intake's checks, the ledger's accept);
- delivery: Delivery.deliver (the ledger's next batch, the assembly's checks and columns,
  BATCH_READY) and the consumer side's BATCH_FREE.

Each is divided by the rows delivered, at stager.batch_size 16 and 64 (producers.credits
twice the batch, so a run is a batch). The producers' own work is not counted. With
``--baseline DIR`` (a checkout of other code, e.g. ``git worktree add /tmp/base
554465e``) the same is counted in that checkout's stager, in a child process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT_TAG = "CALLS_RESULT "
PHASES = ("grant", "answer", "delivery")


class FakeNet:
    """What the stager's parts send, kept (ControlSockets' face: reply, publish)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []

    def reply(self, ident: bytes, msg: object) -> bool:
        self.sent.append((ident, msg))
        return True

    def publish(self, msg: object) -> None:
        pass

    def take(self) -> list[tuple[bytes, object]]:
        out, self.sent = self.sent, []
        return out


class Counter:
    """sys.setprofile's counts of Python calls and C calls while it is on."""

    def __init__(self) -> None:
        self.py = self.c = 0

    def __call__(self, frame, event, arg) -> None:
        if event == "call":
            self.py += 1
        elif event == "c_call":
            self.c += 1

    @contextlib.contextmanager
    def on(self):
        sys.setprofile(self)
        try:
            yield
        finally:
            sys.setprofile(None)


def count(batch_size: int, batches: int, tmp: Path) -> dict[str, list[float]]:
    """Calls per row of each phase (Python, C), in the checkout on sys.path."""
    from ringfeed.consumer.stager.peers import PeerId
    from ringfeed.consumer.stager.stager import build
    from ringfeed.shared.config import config_from_dict
    from ringfeed.shared.memory.places import write_sample
    from ringfeed.shared.run.fingerprint import config_fingerprint, corpus_digest
    from ringfeed.shared.run.process import StopFlag
    from ringfeed.shared.wire import protocol as p

    raw = {
        "data": {"format": "synthetic", "synthetic_items": 4096},
        "features": {"max_frames": 64, "n_mels": 8},
        "text": {"max_text_len": 16},
        "stager": {"batch_size": batch_size},
        "producers": {"workers": 2, "credits": 2 * batch_size},
        "run_root": str(tmp / "runs"),
    }
    cfg = config_from_dict(raw)
    run_id = f"calls-{uuid.uuid4().hex[:6]}"
    from ringfeed.producer.sources import SyntheticSource

    source = SyntheticSource(cfg)
    counters = {phase: Counter() for phase in PHASES}
    with contextlib.ExitStack() as cleanup:
        stager = build(cfg, run_id, StopFlag(), cleanup)
        net = FakeNet()
        for part in (stager.producers, stager.delivery, stager.consumer):
            part.net = net
        desk, delivery, consumer = stager.producers, stager.delivery, stager.consumer
        places = stager.assembly.places
        config = config_fingerprint(cfg, corpus_digest(cfg, stager.index))
        producers = {}
        for k in range(2):
            ident = f"Lproducer-{k}".encode()
            peer = PeerId("pool 1", f"uid 0 pid {os.getpid()}", os.getpid())
            hello = p.Hello(f"producer-{k}", os.getpid(), stager.book.hostname, False,
                            f"token-{k}", "", config, {})  # fmt: skip
            desk.hello(ident, hello, peer)
            producers[ident] = stager.book.producers[ident]
            desk.handle(producers[ident], p.Request(cfg.producers.credits), [])
        consumer_ident = b"Lconsumer"
        stager.book.reset(0)
        delivery.reset(0, 0)
        consumer.ident = consumer_ident
        net.take()
        rows = sent = 0
        while sent < batches:
            with counters["grant"].on():
                desk.grant()
            for ident, msg in net.take():
                if not isinstance(msg, p.Grant):
                    continue
                ready = write_run(msg, source, places, write_sample, cfg.vocab_size)
                with counters["answer"].on():
                    desk.handle(producers[ident], ready, [])
            with counters["delivery"].on():
                delivery.deliver(consumer_ident)
            for _, msg in net.take():
                if isinstance(msg, p.BatchReady):
                    rows += msg.n_valid
                    sent += 1
                    with counters["delivery"].on():
                        consumer.handle(p.BatchFree(msg.slot, msg.generation))
    return {phase: [c.py / rows, c.c / rows] for phase, c in counters.items()}


def write_run(grant, source, places, write_sample, vocab_size):
    """A local producer's work on one GRANT: each sample written into its place, sealed;
    the run's READY."""
    from ringfeed.shared.wire import protocol as p

    entries = []
    for g in grant.entries():
        record = places.record(g.batch, g.place)
        record["writing_generation"] = g.generation
        sample = source.prepare(g.item)
        arrays = [sample.array(name) for name in places.names]
        dst = places.fields(g.batch, g.shape, g.place)
        pads = places.pads if g.batch >= 0 else None
        try:
            written = write_sample(dst, arrays, pads, places.names, vocab_size)
        except TypeError:  # a checkout before row_pass.py: (dst, arrays, pads)
            written = write_sample(dst, arrays, pads)
        lengths, checksum = written[0], written[1]
        record["lengths"][0, : len(lengths)] = lengths
        record["sealed_generation"] = g.generation
        entries.append(p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, 0))
    return p.Ready.of(entries)


def child(repo: Path, batch_size: int, batches: int) -> None:
    sys.path[:0] = [str(repo), str(repo / "benchmarks")]
    with tempfile.TemporaryDirectory() as tmp:
        out = count(batch_size, batches, Path(tmp))
    print(RESULT_TAG + json.dumps(out), flush=True)


def in_child(repo: Path, batch_size: int, batches: int) -> dict[str, list[float]]:
    cmd = [sys.executable, __file__, "--child", str(repo), "--batch-size", str(batch_size)]
    cmd += ["--batches", str(batches)]
    # cwd=repo: a checkout's own ringfeed is the one imported (benchmarks/peers.py import_from).
    env = os.environ | {"PYTHONPATH": str(repo)}
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(f"{repo} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--baseline", help="a checkout whose stager to count alongside")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child), args.batch_size, args.batches)
        return
    checkouts = [("ringfeed", REPO)]
    if args.baseline:
        checkouts.append(("baseline", Path(args.baseline)))
    print("| stager | batch | grant | answer | delivery | Python calls a row | C calls a row |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, repo in checkouts:
        for batch_size in (16, 64):
            out = in_child(repo, batch_size, args.batches)
            py = [out[phase][0] for phase in PHASES]
            c = sum(out[phase][1] for phase in PHASES)
            cells = " | ".join(f"{v:.1f}" for v in py)
            print(f"| {name} | {batch_size} | {cells} | {sum(py):.1f} | {c:.1f} |", flush=True)


if __name__ == "__main__":
    main()
