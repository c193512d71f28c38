"""With stager mels (features.device: stager) the feature cache keeps its meaning: the
stager keeps the mels it computes, and a warm cache skips the FFT (issue 48). Against the
real stager in this process (tests/support/stager_thread.py) with producer threads, over
the 16 shipped clips at 8 kHz: every row delivered is checked against its item's mel as
a producer computes it (within gpu_mel.MEL_ATOL), once each, in plan order; the stager's
mel function is counted as tests/unit/test_faults.py counts it."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringfeed.consumer.stager import cache_writer as writer_module
from ringfeed.consumer.stager import stager as stager_module
from ringfeed.consumer.stager.gpu_mel import MEL_ATOL
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.producer.prepare.prepare import prepare
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.corpus import feature_cache
from ringfeed.shared.corpus.open import build_in_memory
from ringfeed.shared.wire.keys import generate, load_client
from tests.support.checks import expected_rows, plan_items
from tests.support.configs import EIGHT_KHZ_FEATURES, tcp, write_config
from tests.support.full_disk import no_space
from tests.support.liars import in_thread, wrong_mels
from tests.support.paths import MINI
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

pytest.importorskip("torch")  # the stager's mels in torch, on the CPU

N_CLIPS = 16


def clips_config(tmp_path: Path, name: str = "config.yaml", **sections: dict[str, Any]) -> Path:
    """The shipped clips at 8 kHz with stager mels in torch, one epoch, the feature cache
    in tmp_path/cache (prepared); sections: keys over these, by section."""
    raw: dict[str, dict[str, Any]] = {
        "data": {"path": str(MINI)},
        "audio": {"sample_rate": 8000},
        "features": {
            **EIGHT_KHZ_FEATURES,
            "max_frames": 320,  # the longest clip (10.1 s) has 316 frames
            "device": "stager",
            "cache_dir": str(tmp_path / "cache"),
        },
        "text": {"max_text_len": 256},
        "ring": {"lease_s": 10.0, "heartbeat_s": 0.2},
        "stager": {"batch_size": 4, "epochs": 1},
        "producers": {"workers": 2},
        "devices": {"stager_framework": "torch"},
    }
    for section, values in sections.items():
        raw[section] = {**raw.get(section, {}), **values}
    path = write_config(tmp_path, raw, name)
    prepare(load_config(path), workers=1, in_subprocess=False)
    return path


def counted_mels(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stager's mel function, counted: one entry (its rows) a call."""
    from ringfeed.consumer import devices

    calls: list[int] = []

    def counting(cfg: Config) -> Any:
        real = devices.stager_mel_fn(cfg)
        if real is None:
            return None

        def mel_fn(waves: np.ndarray, wave_lens: np.ndarray) -> Any:
            calls.append(len(waves))
            return real(waves, wave_lens)

        mel_fn.framework = real.framework  # type: ignore[attr-defined]
        return mel_fn

    monkeypatch.setattr(stager_module, "stager_mel_fn", counting)
    return calls


class Expected:
    """Each item's tokens and log-mel as a producer computes them (no cache)."""

    def __init__(self, cfg: Config) -> None:
        self.index = build_in_memory(cfg)
        self.rows = expected_rows(replace(cfg, features={"device": "producer"}))

    def check(self, batch: Any) -> list[int]:
        """Every real row of a batch against its item; -> the items, in row order."""
        a, items = batch.arrays, []
        for row in range(batch.meta.n_valid):
            item = int(a["items"][row])
            tokens, mel = self.rows[self.index.item_id(item)]
            t, f = int(a["text_lens"][row]), int(a["mel_lens"][row])
            assert np.array_equal(a["tokens"][row, :t], tokens), item
            assert f == len(mel), (item, f, len(mel))
            assert np.abs(a["mel"][row, :f] - mel).max() <= MEL_ATOL, item
            assert not a["mel"][row, f:].any(), item  # zero past its frames
            items.append(item)
        return items


def one_epoch(
    config: Path,
    expected: Expected,
    position: int = 0,
    remote: tuple[Config, Any] | None = None,
    local: Config | None = None,
) -> tuple[list[int], dict[str, Any], str]:
    """A run from plan `position` to the end of that epoch: the stager, two local
    producer threads (of `local`, else the stager's config) and, remote=(cfg, keys), a
    remote one that joins first; -> (items, stager.json, its log)."""
    with stager_thread(config) as stager, contextlib.ExitStack() as producers:
        cfg = stager.cfg
        client = stager.client(position=position)
        items: list[int] = []
        if remote is not None:
            producers.enter_context(
                producer_threads(remote[0], stager.tcp, keys=remote[1], name="far")
            )
            time.sleep(1.0)  # alone for a while: its samples wait for an audit
        producers.enter_context(producer_threads(local or cfg, stager.control, n=2))
        while len(items) < N_CLIPS:
            batch = client.next(timeout_s=60)
            assert batch is not None
            items += expected.check(batch)
            client.free(batch)
        client.close()
        producers.close()
        return items, stager.summary(), stager.log.text()


def test_a_stager_mode_run_keeps_its_mels_and_its_next_epoch_computes_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch 1 over a cold cache: every row's mel on the stager's device, each kept in the
    feature cache; epoch 2 (a run resumed at it): every row comes as its cached mel, and
    the stager's mel function is not called at all."""
    calls = counted_mels(monkeypatch)
    config = clips_config(tmp_path)
    cfg = load_config(config)
    expected = Expected(cfg)
    first, summary, _ = one_epoch(config, expected)
    config = clips_config(tmp_path, "epoch-2.yaml", stager={"epochs": 2})
    assert len(calls) == N_CLIPS // cfg.stager.batch_size  # a call a batch
    counters = summary["counters"]
    assert counters["mels_from_cache"] == 0 and counters["mels_kept"] == N_CLIPS, counters
    assert counters["mels_not_kept"] == 0
    cache = feature_cache.FeatureCache(cfg)
    assert len(cache) == N_CLIPS  # the mels, never a waveform: the producers kept nothing
    calls.clear()
    second, summary, _ = one_epoch(config, expected, position=N_CLIPS)
    assert calls == []  # a warm cache: no FFT
    assert summary["counters"]["mels_from_cache"] == N_CLIPS
    assert summary["counters"]["mels_kept"] == 0
    assert first + second == plan_items(cfg, N_CLIPS, epochs=2)  # once each, in plan order


def test_a_cache_a_producer_mode_run_wrote_serves_a_stager_mode_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counted_mels(monkeypatch)
    producer_mode = clips_config(tmp_path, "producers.yaml", features={"device": "producer"})
    cfg = load_config(producer_mode)
    expected = Expected(cfg)
    with stager_thread(producer_mode) as stager:  # producers compute and keep the mels
        client = stager.client()
        with producer_threads(stager.cfg, stager.control, n=2):
            while (batch := client.next(timeout_s=60)) is not None:
                expected.check(batch)
                client.free(batch)
            client.close()
    stager_mode = clips_config(tmp_path)  # its length table: by features.device
    items, summary, _ = one_epoch(stager_mode, expected)
    assert calls == []
    assert summary["counters"]["mels_from_cache"] == N_CLIPS
    assert items == plan_items(cfg, N_CLIPS)


@pytest.mark.parametrize("warm", ["remote", "local"])
def test_an_audit_of_a_cached_mel_against_a_waveform_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: str
) -> None:
    """One host's cache is warm, the other's cold: a remote producer's sample (the
    clip's cached mel, or its waveform) audited by a local producer (its waveform, or its
    cached mel) agrees in mel space; no peer is struck for having a cache, or lacking one."""
    counted_mels(monkeypatch)
    keys = tmp_path / "keys"
    bundle = generate(keys, "far")
    config = clips_config(tmp_path, transport=tcp(free_port(), keys))
    cfg = load_config(config)
    expected = Expected(cfg)
    warm_cfg = replace(cfg, features={"cache_dir": str(tmp_path / "warm")})
    fill_cache(warm_cfg)
    remote_cfg, local_cfg = (warm_cfg, cfg) if warm == "remote" else (cfg, warm_cfg)
    items, summary, _ = one_epoch(
        config, expected, remote=(remote_cfg, load_client(bundle)), local=local_cfg
    )
    counters = summary["counters"]
    assert counters["audits_passed"] >= 1, counters
    assert counters["audits_failed"] == 0 and counters["strikes"] == 0, counters
    # The warm side sent mels (the local producers answered audits only, or some rows).
    warm_side = [pr for pr in summary["producers"] if pr["remote"] == (warm == "remote")]
    assert sum(pr["work"].get("cache_hits", 0) for pr in warm_side) >= 1, warm_side
    if warm == "remote":
        assert counters["mels_from_cache"] >= 1, counters  # delivered as they came
    assert items == plan_items(cfg, N_CLIPS)


def fill_cache(cfg: Config) -> None:
    """cfg's corpus prepared and every clip's mel in its feature cache, as a producer-mode
    producer keeps it."""
    from ringfeed.producer.pipeline import SamplePipeline

    prepare(cfg, workers=1, in_subprocess=False)
    index = build_in_memory(cfg)
    pipe = SamplePipeline(replace(cfg, features={"device": "producer"}), index=index)
    for k in range(index.n_items):
        pipe(index.entry(k), k)
    pipe.close()


def test_a_remote_wrong_mel_fails_its_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote peer whose every READY is a mel marked cached (MEL), of the right shape,
    hashed as sent, but not the clip's: its audits fail against the local producers'
    waveforms, it is banned, and nothing it sent is delivered (every row is checked)."""
    counted_mels(monkeypatch)
    keys = tmp_path / "keys"
    bundle = generate(keys, "liar")
    config = clips_config(
        tmp_path, transport=tcp(free_port(), keys), ring={"lease_s": 2.0, "heartbeat_s": 0.2}
    )
    with stager_thread(config) as stager:
        cfg, client, stop = stager.cfg, stager.client(), threading.Event()
        expected = Expected(cfg)
        thread, tally = in_thread(wrong_mels, cfg, stager.tcp, str(bundle), stop)
        wait_for(lambda: tally.lies, 30, "the liar answering grants")
        items: list[int] = []
        with producer_threads(cfg, stager.control, n=2):
            while len(items) < N_CLIPS:
                batch = client.next(timeout_s=60)
                assert batch is not None
                items += expected.check(batch)
                client.free(batch)
            client.close()
        stop.set()
        thread.join(10)
        summary = stager.summary()
        quarantine = read_quarantine(stager.dir / "quarantine.jsonl")
    assert not tally.errors, tally.errors
    counters = summary["counters"]
    assert counters["audits_failed"] >= 1 and counters["audits_passed"] == 0, counters
    assert quarantine == []
    assert items == plan_items(cfg, N_CLIPS)


@pytest.mark.parametrize("disk", ["full", "unwritable"])
def test_a_cache_the_stager_cannot_write_costs_the_cache_never_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, disk: str
) -> None:
    """Its mels are not kept (counted: mels_not_kept), the cache says why once, and every
    row is delivered."""
    counted_mels(monkeypatch)
    config = clips_config(tmp_path)
    cfg = load_config(config)
    expected = Expected(cfg)
    if disk == "full":  # ENOSPC where the cache meets the OS (only the stager writes it)
        monkeypatch.setattr(feature_cache, "_write_all", no_space)
    else:

        def refused(*_: Any) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(feature_cache, "_ShardWriter", refused)
    with caplog.at_level(logging.WARNING, "ringfeed.shared.corpus.feature_cache"):
        items, summary, _ = one_epoch(config, expected)
    counters = summary["counters"]
    assert counters["mels_kept"] == 0 and counters["mels_not_kept"] == N_CLIPS, counters
    assert items == plan_items(cfg, N_CLIPS)
    said = "no space left on the disk" if disk == "full" else "writes in a row failed"
    assert len([r for r in caplog.records if said in r.getMessage()]) == 1, caplog.text


def test_the_writer_never_blocks_the_stager_and_counts_what_it_drops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that does not answer: batches past MAX_QUEUED are dropped at once, counted;
    at exit the writer waits CLOSE_WAIT_S at most and counts what it left."""
    from ringfeed.shared.config import config_from_dict

    monkeypatch.setattr(writer_module, "CLOSE_WAIT_S", 0.5)
    stuck = threading.Event()

    def hung(*_: Any, **__: Any) -> bool:
        stuck.wait(5)
        return False

    monkeypatch.setattr(feature_cache.FeatureCache, "put", hung)
    cfg = config_from_dict(
        {"features": {"device": "stager", "cache_dir": str(tmp_path / "cache"), "n_mels": 8}}
    )
    writer = writer_module.CacheWriter(cfg=cfg, n_places=64)
    mel, lens = np.ones((4, 10, 8), np.float32), np.full(4, 10)

    def batch(b: int) -> None:  # 4 rows, each a place with a key
        places = np.arange(4 * b, 4 * b + 4)
        keys = b"".join(bytes([b + 1]) * 16 for _ in range(4))
        writer.noted(places, 100 + b, keys, [0] * 4, np.ones(4, bool))
        writer.keep(places, np.full(4, 100 + b), mel, lens)

    batch(0)
    wait_for(writer.queue.empty, 5, "the writer taking the first batch")
    t0 = time.monotonic()
    for b in range(1, 12):
        batch(b)
    assert time.monotonic() - t0 < 1.0  # never waits for the disk
    # One batch in the thread's hands, MAX_QUEUED waiting, the rest dropped.
    assert writer.dropped == 4 * (12 - 1 - writer_module.MAX_QUEUED), writer.counters()
    t0 = time.monotonic()
    writer.close()
    stuck.set()
    assert time.monotonic() - t0 < 2 * writer_module.CLOSE_WAIT_S + 1
    writer.thread.join(10)
    assert writer.counters() == {"mels_kept": 0, "mels_not_kept": 48}


def test_a_writer_that_fails_says_so_once_and_counts_what_it_no_longer_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache's own bug (not a full disk: any exception) ended the writer's thread with
    nothing in the log, and every later batch was counted as a full queue. It is said
    once, the writer is off, and what it no longer keeps is counted."""
    from ringfeed.shared.config import config_from_dict

    def broken(*_: Any, **__: Any) -> bool:
        raise RuntimeError("a bug in the cache")

    monkeypatch.setattr(feature_cache.FeatureCache, "put", broken)
    cfg = config_from_dict(
        {"features": {"device": "stager", "cache_dir": str(tmp_path / "cache"), "n_mels": 8}}
    )
    writer = writer_module.CacheWriter(cfg=cfg, n_places=64)
    mel, lens = np.ones((4, 10, 8), np.float32), np.full(4, 10)
    for b in range(3):
        places = np.arange(4 * b, 4 * b + 4)
        writer.noted(places, 100 + b, bytes([b + 1]) * 64, [0] * 4, np.ones(4, bool))
        writer.keep(places, np.full(4, 100 + b), mel, lens)
        wait_for(lambda: writer.off or not writer.thread.is_alive(), 5, "the writer failing")
    writer.close()
    assert writer.off
    assert caplog.text.count("feature cache writer failed") == 1
    assert writer.counters() == {"mels_kept": 0, "mels_not_kept": 12}
