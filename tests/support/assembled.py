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
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.ledger import Grantee, Ledger
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.consumer.stager.stager import open_rings, slot_ledger
from ringfeed.producer.sample import Sample
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.memory.places import Places, write_sample
from ringfeed.shared.wire import protocol as p
from tests.support.runs import rid

PRODUCER = b"producer"


@dataclass
class FirstBatch:
    """The plan's first batch as the assembly made it ready: its views, its real rows, the
    items of its positions in plan order, the assembly and ledger that made it, its slot
    and (once sent) the generation the consumer frees it with."""

    views: dict[str, np.ndarray]
    n_valid: int
    items: list[int]
    assembly: Assembly
    ledger: Ledger
    slot: int


@contextlib.contextmanager
def first_batch(cfg: Config, sample_of: Callable[[int], Sample], tmp_dir) -> Iterator[FirstBatch]:
    """The plan's first batch (FirstBatch), its rings unlinked when the block ends."""
    run_id = rid()
    with contextlib.ExitStack() as cleanup:
        spares, batches = open_rings(cfg, run_id, "", cleanup)
        index = open_corpus(cfg)
        plan = make_plan(cfg, index)
        ledger = slot_ledger(cfg, plan, spares, batches, cleanup)
        places = Places(batches, spares, cfg.schema)
        cleanup.callback(places.forget)
        assembly = Assembly(cfg, places, ledger, Drops(), stager_mel_fn(cfg))
        in_place = cfg.features.device == "producer"
        who = Grantee(PRODUCER, 0, PeerId("local", "local", 1), in_place, local=True)
        run = ledger.grant(who, cfg.max_batch_rows)
        for g in run:
            record = places.record(g.batch, g.place)
            record["writing_generation"] = g.generation
            sample = sample_of(g.item)
            arrays = [sample.array(name) for name in places.names]
            dst = places.fields(g.batch, g.shape, g.place)
            lengths, checksum = write_sample(dst, arrays, places.pads if g.batch >= 0 else None)
            record["sealed_generation"] = g.generation
            answer = ledger.answer(PRODUCER, g.generation, [g.place], [g.item])
            (k,) = answer.owned
            ledger.answered(k)
            entry = p.ReadyEntry(g.place, g.generation, g.item, lengths, checksum, sample.marks)
            ledger.ready(k, entry, PRODUCER, who.peer)
        batch = ledger.complete()
        assert batch is not None, "the first batch did not finish"
        ready = assembly.assemble(batch)
        assert ready is not None, "the first batch failed its checks"
        items = [pos.item for pos in batch.positions]
        views = places.batch(batch.slot, batch.shape)
        yield FirstBatch(views, ready.n_valid, items, assembly, ledger, batch.slot)
