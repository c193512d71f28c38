"""An unexpected exception in any stage of a real sample's work is quarantined with
that stage and names the exception.

The real DatasetSource and SamplePipeline on a shipped LJSpeech clip, one stage's
function made to raise in this process; a real Worker welcomed over a real socket
onto a real local ring takes the grant through its own except path, and the SKIP
is read off the socket as the stager reads it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from ringfeed.consumer.stager.stager import open_rings
from ringfeed.producer.features import clip_features
from ringfeed.producer.process.watchdog import SampleTimeout
from ringfeed.producer.process.worker import Worker
from ringfeed.producer.sample import StageFailed, StageTimeout, run_stage
from ringfeed.producer.sources import DatasetSource
from ringfeed.producer.text.encoder import TextEncoder
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.feature_cache import FeatureCache
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.memory.ring import Ring
from ringfeed.shared.run.process import StopFlag
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.sockets import make_socket, recv, send
from tests.support.paths import MINI

ITEM = 1  # LJ001-0002, 1.9 s: "in being comparatively modern."
GENERATION = 7


class Injected(ArithmeticError):
    """What the patched stage raises: no code of ours expects it."""


def boom(*args: object, **kwargs: object) -> None:
    raise Injected("injected fault")


# stage -> (owner of the function that stage calls, its name)
STAGE_FUNCTIONS = {
    "text": (TextEncoder, "encode"),
    "audio": (clip_features, "load_clip"),
    "features": (clip_features, "log_mel"),
    "cache": (FeatureCache, "put"),  # the last stage: every other one ran first
}


@pytest.fixture
def stager_socket() -> Iterator[tuple[zmq.Socket, str]]:
    """The stager's end: a ROUTER on a free loopback port, and its endpoint."""
    with zmq.Context() as ctx, make_socket(ctx, zmq.ROUTER) as sock:
        sock.bind("tcp://127.0.0.1:*")
        yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def next_message(sock: zmq.Socket, kind: type) -> tuple[bytes, p.Message]:
    """The next message of `kind` from the worker (others, like REQUEST, are skipped)."""
    while sock.poll(5000):
        ident, msg, _ = recv(sock, routed=True)
        if isinstance(msg, kind):
            return ident, msg
    raise AssertionError(f"no {kind.__name__} from the worker within 5 s")


def make_cfg(tmp_path: Path) -> Config:
    """The shipped clips, their index prepared (a producer only maps it)."""
    cfg = replace(
        Config(),
        data={"path": str(MINI)},
        features={"cache_dir": str(tmp_path / "cache"), "on_too_long": "truncate"},
    )
    open_corpus(cfg, in_subprocess=False)
    return cfg


@pytest.fixture
def rings() -> Iterator[tuple[Ring, Ring]]:
    """The run's rings as the stager makes them, (spares, batches), unlinked after the
    test; spare place 0 is granted with GENERATION."""
    run_id = f"stage-{uuid.uuid4().hex[:6]}"
    with contextlib.ExitStack() as cleanup:
        spares, batches = open_rings(Config(), run_id, "", cleanup, StopFlag())
        spares.slots[0]["generation"] = GENERATION
        yield spares, batches


def fill_one(
    cfg: Config, stager: tuple[zmq.Socket, str], rings: tuple[Ring, Ring]
) -> tuple[p.Skip, Worker]:
    """Welcome a local worker onto the rings, grant it ITEM in spare place 0, return its
    SKIP."""
    sock, endpoint = stager
    spares, batches = rings
    worker = Worker(cfg, "w0", endpoint, remote=False, stop=StopFlag())
    try:
        worker.start()
        ident, _ = next_message(sock, p.Hello)
        welcome = p.Welcome(spares.run_id, batches.name, worker.source.n_items, {}, spares.name)
        send(sock, welcome, ident=ident)
        while not worker.session.welcomed:
            worker.poll(1.0)
        worker.fill(p.GrantEntry(0, GENERATION, ITEM, 0))
        _, skip = next_message(sock, p.Skip)
    finally:  # no BYE: nobody would acknowledge it
        worker.drop_writer()
        worker.sock.close()
        worker.ctx.term()
    return skip, worker


@pytest.mark.parametrize("stage", list(STAGE_FUNCTIONS))
def test_an_unexpected_exception_is_quarantined_with_its_stage(
    tmp_path: Path,
    stage: str,
    stager_socket: tuple[zmq.Socket, str],
    rings: tuple[Ring, Ring],
    monkeypatch,
) -> None:
    owner, name = STAGE_FUNCTIONS[stage]
    monkeypatch.setattr(owner, name, boom)
    skip, worker = fill_one(make_cfg(tmp_path), stager_socket, rings)
    assert int(rings[0].slots[0]["sealed_generation"]) != GENERATION  # nothing announced
    assert (skip.place, skip.generation, skip.item) == (0, GENERATION, ITEM)
    assert skip.stage == stage
    assert skip.reason.startswith(f"unexpected Injected in {stage} at test_failure_stage.py:")
    assert skip.reason.endswith("injected fault") and skip.path.endswith("LJ001-0002.wav")
    assert worker.session.done == 1


def test_a_sample_that_does_not_fit_its_place_is_quarantined_at_write(
    tmp_path: Path, stager_socket: tuple[zmq.Socket, str], rings: tuple[Ring, Ring], monkeypatch
) -> None:
    cfg = make_cfg(tmp_path)
    real_log_mel = clip_features.log_mel

    def one_band_too_many(wave: np.ndarray, c: Config) -> np.ndarray:
        mel = real_log_mel(wave, c)
        return np.concatenate([mel, mel[:, :1]], axis=1)

    monkeypatch.setattr(clip_features, "log_mel", one_band_too_many)
    skip, _ = fill_one(cfg, stager_socket, rings)
    assert int(rings[0].slots[0]["sealed_generation"]) != GENERATION
    assert skip.stage == "write" and skip.reason.startswith("unexpected ValueError in write")


def test_a_failure_before_the_first_stage_does_not_carry_the_last_items_stage(
    tmp_path: Path,
) -> None:
    """Each failure carries its own stage (producer/sample.py run_stage): after a whole
    sample, a failure reading the next item's entry is a metadata failure."""
    source = DatasetSource(make_cfg(tmp_path))
    source.prepare(ITEM)
    with pytest.raises(StageFailed) as failed:
        source.prepare(source.n_items)  # no such entry
    assert failed.value.stage == "metadata" and isinstance(failed.value.error, IndexError)


def test_a_timeout_names_the_stage_it_ran_out_in_and_no_stage_swallows_it() -> None:
    """The alarm's SampleTimeout in a stage is a StageTimeout of that stage, still a
    SampleTimeout (a BaseException): an ``except Exception`` of an outer stage (a
    reference candidate's) cannot swallow it."""

    def late() -> None:
        raise SampleTimeout("its work took more than ring.lease_s=1 s")

    def outer() -> None:
        try:
            run_stage("audio", late)
        except Exception:  # noqa: BLE001 - what a candidate's reader does
            raise AssertionError("swallowed") from None

    with pytest.raises(StageTimeout) as caught:
        run_stage("reference", outer)
    assert caught.value.stage == "audio" and isinstance(caught.value, SampleTimeout)
    assert str(caught.value) == "its work took more than ring.lease_s=1 s"
