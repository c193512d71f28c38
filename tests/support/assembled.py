"""The stager's first batch of a config, made without sockets: its real rings, slot ledger,
places and assembly, with samples written by the test as a local producer writes them
(tests of what a batch holds: the sample schema, stager mels).

    with first_batch(cfg, sample_of, tmp_path) as first:
        first.views, first.n_valid, first.items   # and its assembly, ledger, slot

sample_of(item) gives the item's Sample; each is written into the place the ledger
grants it (a row of the batch when producers compute the mels, else a spare: the
stager's mels), sealed and answered, then the finished batch is assembled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.devices import stager_mel_fn
from ringfeed.consumer.stager.assembly import Assembly
from ringfeed.consumer.stager.ledger.face import BatchOut, Grantee
from ringfeed.consumer.stager.ledger.table import Ledger
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.consumer.stager.stager import open_rings, slot_ledger
from ringfeed.producer.sample import Sample
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.memory.places import Places, write_sample
from ringfeed.shared.run.process import StopFlag
from ringfeed.shared.run.run_clock import RunClock
from tests.support.runs import rid

PRODUCER = b"producer"


@dataclass
class FirstBatch:
    """The plan's first batch as the assembly made it ready: its views, its real rows, the
    items of its positions in plan order, the assembly and ledger that made it, its slot
    and the batch as the ledger handed it on (to send it)."""

    views: dict[str, np.ndarray]
    n_valid: int
    items: list[int]
    assembly: Assembly
    ledger: Ledger
    slot: int
    batch: BatchOut


@contextlib.contextmanager
def first_batch(cfg: Config, sample_of: Callable[[int], Sample], tmp_dir) -> Iterator[FirstBatch]:
    """The plan's first batch (FirstBatch), its rings unlinked when the block ends."""
    run_id = rid()
    with contextlib.ExitStack() as cleanup:
        spares, batches = open_rings(cfg, run_id, "", cleanup, StopFlag())
        index = open_corpus(cfg)
        plan = make_plan(cfg, index)
        ledger = slot_ledger(cfg, plan, spares, batches, RunClock(cfg.ring.lease_s), cleanup)
        places = Places(batches, spares, cfg.schema)
        cleanup.callback(places.forget)
        assembly = Assembly(cfg=cfg, places=places, mel_fn=stager_mel_fn(cfg))
        in_place = cfg.features.device == "producer"
        who = Grantee(PRODUCER, 0, PeerId("local", "local", 1), in_place, local=True)
        run = ledger.grant(who, cfg.max_batch_rows)
        assert run is not None, "nothing was granted"
        n = len(run)
        lengths = np.zeros((n, len(places.names)), np.int32)
        checksums, marks = np.zeros(n, np.int64), np.zeros(n, np.int64)
        pairs = zip(run.places.tolist(), run.items.tolist(), strict=True)
        for row, (place, item) in enumerate(pairs):
            record = places.record(run.slot, place)
            record["writing_generation"] = run.generation
            sample = sample_of(item)
            arrays = [sample.array(name) for name in places.names]
            dst = places.fields(run.slot, run.shape, place)
            pads = places.pads if run.slot >= 0 else None
            written, checksums[row], why = write_sample(
                dst, arrays, pads, places.names, cfg.vocab_size
            )
            assert not why, why
            lengths[row], marks[row] = written, sample.marks
            record["lengths"][0, : len(written)] = written
            record["sealed_generation"] = run.generation
        answer = ledger.check(PRODUCER, run.generation, run.places.tolist(), run.items.tolist())
        ledger.accept(answer, answer.owned, lengths, checksums, marks)
        batch = ledger.next_batch()
        assert batch is not None, "the first batch did not finish"
        ready = assembly.assemble(batch)
        assert not ready.failed, f"the first batch failed its checks: {ready.failed}"
        views = places.batch(batch.slot, batch.shape)
        yield FirstBatch(
            views, ready.n_valid, batch.items.tolist(), assembly, ledger, batch.slot, batch
        )
