"""A producer that heartbeats but never answers its grants, played by hand against the real
stager in this process (tests/support/stager_thread.py) beside honest producer threads:
its grants come back with the lease, and every row of the epoch arrives in plan order.
The other faults, with real processes: tests/process/test_faults.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.stager.gpu_mel import MEL_ATOL
from ringfeed.consumer.stager.numpy_mel import NumpyLogMel
from ringfeed.producer.sources import SyntheticSource
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import load_client
from tests.support.checks import consume, plan_items
from tests.support.configs import keyed, small
from tests.support.peers import peer_socket
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread


class MuteProducer(threading.Thread):
    """Says HELLO, asks for grants, then only heartbeats: never READY, never SKIP; until
    its stop event is set."""

    def __init__(self, endpoint: str, config: dict[str, str]) -> None:
        """config: the run's config fingerprint, which its HELLO must carry."""
        super().__init__(daemon=True)
        self.endpoint, self.config, self.grants, self.rehellos = endpoint, config, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        with peer_socket(self.endpoint) as sock:
            hello = p.Hello("mute", os.getpid(), socket.gethostname(), False, "t", "", self.config)
            sock.send_multipart(p.encode(hello))
            beat = 0.0
            while not self.stop.is_set():
                if sock.poll(50):
                    msg, _ = p.decode(sock.recv_multipart())
                    if isinstance(msg, p.Welcome):
                        sock.send_multipart(p.encode(p.Request(4)))
                    self.grants += isinstance(msg, p.Grant)
                    self.rehellos += isinstance(msg, p.Rehello)
                if time.monotonic() > beat:  # alive and well, as far as heartbeats go
                    sock.send_multipart(p.encode(p.Heartbeat(0, {})))
                    beat = time.monotonic() + 0.2


def test_grants_of_a_producer_that_heartbeats_but_never_answers_come_back(
    tmp_path: Path,
) -> None:
    """The mute producer is this process on the ipc socket; the honest producers hold a
    key of their own, so its expired grants cut its own share, not theirs."""
    n = 200
    cfg_path, keys = keyed(tmp_path, ("honest",), items=n, delay_s=0.003, ring={"lease_s": 0.5})
    with stager_thread(cfg_path) as stager:
        cfg = stager.cfg
        mute = MuteProducer(stager.control, config_fingerprint(cfg))
        mute.start()
        try:
            client = stager.client()
            with producer_threads(cfg, stager.tcp, n=2, keys=load_client(keys["honest"])):
                t0 = time.monotonic()
                items = consume(client, timeout_s=30)
                took_s = time.monotonic() - t0
                client.close()
            stager.summary()
        finally:
            mute.stop.set()
            mute.join(5)
    assert mute.grants >= 1 and mute.rehellos >= 1, "the mute producer was never caught"
    assert items == plan_items(cfg, n)  # exactly once, in plan order
    assert took_s < 25


def test_the_stagers_device_failing_mid_run_moves_its_mels_to_the_cpu(
    tmp_path: Path, monkeypatch
) -> None:
    """features.device: stager, and the device's mel call raises at the third batch (a GPU
    out of memory, lost): the stager says so, computes that batch's mels and every later
    one on the CPU (consumer/stager/numpy_mel.py), and the epoch arrives whole, once, in
    plan order, each row checked against its item."""
    pytest.importorskip("torch")
    from ringfeed.consumer import devices
    from ringfeed.consumer.stager import stager as stager_module

    calls = []

    def failing_mels(cfg):
        real = devices.stager_mel_fn(cfg)

        def mel_fn(waves, wave_lens):
            calls.append(len(waves))
            if len(calls) == 3:
                raise RuntimeError("CUDA error: out of memory (injected)")
            return real(waves, wave_lens)

        mel_fn.framework = real.framework
        return mel_fn

    monkeypatch.setattr(stager_module, "stager_mel_fn", failing_mels)
    n = 40
    cfg_path = small(
        tmp_path,
        items=n,
        features={"device": "stager", "max_frames": 16, "n_mels": 8},
        devices={"stager_framework": "torch"},
    )
    with stager_thread(cfg_path) as stager:
        cfg, client = stager.cfg, stager.client()
        source, cpu = SyntheticSource(cfg), NumpyLogMel(cfg)
        items = []
        with producer_threads(cfg, stager.control, n=2):
            while (batch := client.next(timeout_s=60)) is not None:
                arrays, n_valid = batch.arrays, batch.meta.n_valid
                for row in range(n_valid):  # each row's mel is its item's wave's
                    item = int(arrays["items"][row])
                    wave = np.zeros((1, arrays["mel"].shape[1] * cfg.features.hop_length))
                    clip = source.prepare(item).array("wave")
                    wave[0, : len(clip)] = clip
                    mel, lens = cpu(wave.astype(np.float32), np.array([len(clip)]))
                    assert arrays["mel_lens"][row] == lens[0]
                    got = arrays["mel"][row][: lens[0]]
                    assert np.abs(got - mel[0][: lens[0]]).max() <= MEL_ATOL, (item, row)
                    items.append(item)
                client.free(batch)
            client.close()
        summary = stager.summary()
        text = stager.log.text()
    assert items == plan_items(cfg, n)  # once each, in plan order
    assert len(calls) == 3  # the device's mels are not tried again
    assert summary["counters"]["mel_fallbacks"] == 1  # stager.json and the inspector count it
    assert "the stager's mels in torch failed (RuntimeError" in text
