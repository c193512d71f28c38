"""The DataLoader's habits, held by ringfeed.torch's loader against the real stager in
this process: one epoch per pass and `len` its batches (a plain plan whose batches
cross epochs, and one of length buckets), the epoch in each batch, `set_epoch`,
`max_steps` and `epochs`, a cursor that follows the batches used when the client reads
ahead (Lightning's fetcher), a reload at the next iteration, a pickled loader, and the
progress line. Every row of every batch is checked against its item."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.sources import check_synthetic_rows
from tests.support.configs import small
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

torch = pytest.importorskip("torch")

from ringfeed.torch import RingLoader  # noqa: E402

torch.set_num_threads(1)

# 20 items in batches of 8: batch 2 holds positions 16-23, epochs 0 and 1.
PLAIN = {"data": {"synthetic_items": 20}, "stager": {"batch_size": 8, "epochs": 3}}
# 48 LJSpeech-shaped items in three length buckets: an epoch's batches are its own.
BUCKETED = {
    "data": {"synthetic_items": 48, "synthetic_lengths": "ljspeech"},
    "features": {"max_frames": 32},
    "stager": {"batch_size": 4, "buckets": [16, 24, 32], "epochs": 3},
}


def config(tmp_path: Path, raw: dict, **stager: object) -> Path:
    sections = {k: v for k, v in raw.items() if k != "stager"}
    items = raw["data"]["synthetic_items"]
    return small(tmp_path, items, 0.0, **sections, stager=raw["stager"] | stager)


def rows(batch: dict, loader: RingLoader) -> list[tuple[int, int, int]]:
    """(epoch, position, item) of each real row, each row checked against its item."""
    arrays = {name: t.numpy().copy() for name, t in batch.items()}
    valid = arrays["valid"]
    check_synthetic_rows(arrays, int(valid.sum()), loader.cfg)
    assert (arrays["epoch"] == np.where(valid, arrays["position"] // loader.n_items, -1)).all()
    return list(
        zip(
            arrays["epoch"][valid].tolist(),
            arrays["position"][valid].tolist(),
            arrays["items"][valid].tolist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("raw", [PLAIN, BUCKETED], ids=["plain", "bucketed"])
def test_each_pass_is_one_epoch_of_len_batches(tmp_path: Path, raw: dict) -> None:
    n = raw["data"]["synthetic_items"]
    with stager_thread(config(tmp_path, raw)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id)
            passes = []
            for epoch in range(4):  # the plan has 3: the fourth pass is empty
                expected = len(loader)
                assert loader.epoch == epoch
                loader.set_epoch(epoch)  # where the loader is anyway: nothing moves
                got = [rows(batch, loader) for batch in loader]
                assert len(got) == expected, f"epoch {epoch}: len said {expected}"
                passes.append(got)
        assert stager.ended() == 0 and loader.finished and passes[3] == []
    for epoch, got in enumerate(passes[:3]):
        firsts = {b[0][0] for b in got}
        assert firsts == {epoch}, "each batch's first row is of the pass's epoch"
        items = [item for b in got for e, _, item in b if e == epoch]
        if raw is BUCKETED:  # an epoch's batches hold it whole
            assert sorted(items) == list(range(n))
    every = [position for got in passes for b in got for _, position, _ in b]
    assert every == sorted(every) == list(range(3 * n)), "every position once, in order"


def test_epochs_and_max_steps_end_an_endless_plan_and_its_run(tmp_path: Path) -> None:
    with stager_thread(config(tmp_path, PLAIN, epochs=0)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, epochs=2)
            passes = [[rows(b, loader) for b in loader] for _ in range(3)]
        assert stager.ended() == 0, "the loader's end said BYE: the run ended"
    assert [len(p) for p in passes] == [3, 2, 0] and loader.finished
    assert {b[0][0] for b in passes[1]} == {1}
    with stager_thread(config(tmp_path, PLAIN, epochs=0)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, max_steps=4)
            got = [rows(b, loader) for _ in range(3) for b in loader]
        assert stager.ended() == 0
    assert len(got) == 4 and loader.state_dict()["batch_index"] == 4


def test_set_epoch_moves_the_next_pass_to_that_epochs_start(tmp_path: Path) -> None:
    with stager_thread(config(tmp_path, BUCKETED)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id)
            next(iter(loader))["mel"]  # one batch of epoch 0 used
            loader.set_epoch(2)
            expected = len(loader)
            got = [rows(b, loader) for b in loader]
    assert {e for b in got for e, _, _ in b} == {2} and len(got) == expected
    assert sorted(i for b in got for _, _, i in b) == list(range(48))


def lightning_fetch(loader: RingLoader):
    """Lightning's _PrefetchDataFetcher: batch k + 1 is fetched before step k runs."""
    it = iter(loader)
    ahead = next(it)
    for batch in it:
        yield ahead
        ahead = batch
    yield ahead


def test_a_client_that_reads_ahead_resumes_after_the_batch_it_trained(tmp_path: Path) -> None:
    """The checkpoint after step k holds the cursor after batch k, though batch k + 1
    was fetched: resumed, the batches are those of an uninterrupted pass, none skipped
    or repeated; the reload waits for the next iteration."""
    with stager_thread(config(tmp_path, BUCKETED, epochs=1)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            first = RingLoader(stager.cfg, stager.run_id)
            whole = [rows(b, first) for b in first]
    with stager_thread(config(tmp_path, BUCKETED, epochs=1)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id)
            head = []
            for step, batch in enumerate(lightning_fetch(loader)):
                head.append(rows(batch, loader))  # the step reads its batch
                if step == 3:
                    saved = loader.state_dict()  # batch 4 is fetched already
                    break
            assert saved["batch_index"] == 4 and loader._fetched.batch_index == 5
            loader.load_state_dict(saved)  # the same loader: at the next iteration
            assert loader.stream is not None, "a reload connects nothing at once"
            tail = [rows(b, loader) for b in lightning_fetch(loader)]
    assert head + tail == whole


def test_a_pickled_loader_goes_on_from_its_cursor(tmp_path: Path) -> None:
    with stager_thread(config(tmp_path, BUCKETED, epochs=1)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id)
            it = iter(loader)
            head = [rows(next(it), loader) for _ in range(2)]
            copy = pickle.loads(pickle.dumps(loader))
            loader.close()
            tail = [rows(b, copy) for b in copy]
    positions = [p for b in head + tail for _, p, _ in b]
    assert positions == list(range(48)) and copy.finished


def test_the_progress_line_says_steps_epoch_and_data_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loader of an earlier test in this worker that met no logging set-up gave the
    # progress logger a stderr handler of its own, which stops propagation to caplog's.
    progress_log = logging.getLogger("ringfeed.progress")
    monkeypatch.setattr(progress_log, "handlers", [])
    monkeypatch.setattr(progress_log, "propagate", True)
    with stager_thread(config(tmp_path, PLAIN, epochs=1)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            with caplog.at_level(logging.INFO, logger="ringfeed.progress"):
                for batch in RingLoader(stager.cfg, stager.run_id, progress_every=1):
                    batch["mel"]
                quiet = RingLoader(stager.cfg, stager.run_id, progress_every=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "ringfeed.progress"]
    assert len(lines) == 2 and "ringfeed: step 3, epoch 0 (batch 3)" in lines[1], lines
    assert "steps/s, data wait" in lines[1] and quiet.progress.every == 0
