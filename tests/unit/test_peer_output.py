"""Bounded peer output (issue 18, case 4): a peer that holds the key and floods CRASH, or
writes terminal escape sequences into its name, host, place, traceback and counters,
against the real stager in this process (tests/support/stager_thread.py) with honest
producer threads. The stager's log stays small, what it does not log is counted, no
control character from a peer reaches the log, stager.json or the inspector, and the
epoch is still delivered exactly once."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.ledger.table import Ledger, LedgerTerms
from ringfeed.consumer.stager.peer_log import PEER_BURST, PEER_REFILL_S, TOTAL_BURST, PeerLog
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.producer_book import MAX_PRODUCERS, BookTerms, ProducerBook
from ringfeed.consumer.stager.producer_desk import CRASHES_KEPT
from ringfeed.consumer.tools.inspector import Inspector
from ringfeed.consumer.tools.inspector import main as inspector_main
from ringfeed.consumer.tools.screen import BOLD, CLEAR, RESET, render
from ringfeed.producer.sources import RowMismatch, SyntheticSource, check_synthetic_rows
from ringfeed.shared.config import Config, config_from_dict
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.run.stats_record import (
    BuilderStats,
    ConsumerStats,
    ControlStats,
    CrashReport,
    DeliveryStats,
    DeskStats,
    DropStats,
    Padding,
    RunStats,
    StagerStats,
    TrainerReport,
)
from ringfeed.shared.sample.content import content_error
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.bounds import clean
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.peers import peer_socket
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread
from tests.support.stats import StatsReader

# A traceback as long as decode takes (shared/wire/bounds.py MAX_STR).
LONG_TRACEBACK = "Traceback (most recent call last):\n" + "  x\n" * 4000
# Without the limit the flood below wrote over 100 MiB; with it, a few tracebacks.
MAX_LOG_GROWTH_BYTES = 256 * 1024
# Escape sequences and other controls a hostile peer writes: clear the screen, set the
# terminal's title, a C1 CSI, bell, DEL, a bidi override, NUL, a bare CR.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m\x7f\u202e\x00\r"
PERSIAN = "تولیدکننده\u200cها"  # a ZWNJ inside: printable text that must survive
# The bidi embeddings, overrides and isolates (Unicode category Cf, as ZWNJ is).
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def control_characters(text: str) -> set[str]:
    """The characters of text no peer's string may bring (newlines aside)."""
    return {c for c in text if c != "\n" and (unicodedata.category(c) == "Cc" or c in BIDI)}


def test_decode_removes_controls_and_keeps_every_script() -> None:
    hello = p.Hello(f"w{HOSTILE}{PERSIAN}", 7, f"h{HOSTILE}", False, "t", f"on{HOSTILE}", {})
    got, _ = p.decode([bytes(f) for f in p.encode(hello)])
    assert (got.name, got.host, got.place) == (
        f"w[2J]0;owned31m{PERSIAN}",
        "h[2J]0;owned31m",
        "on[2J]0;owned31m",
    )
    crash, _ = p.decode([bytes(f) for f in p.encode(p.Crash("c", f"line 1\n{HOSTILE}line 2\n"))])
    assert crash.traceback == "line 1\n[2J]0;owned31mline 2\n"
    beat, _ = p.decode([bytes(f) for f in p.encode(p.Heartbeat(1, {f"k{HOSTILE}": 3}))])
    assert beat.work == {"k[2J]0;owned31m": 3}
    skip = p.Skip(1, 1, 1, f"bad{HOSTILE}", f"/a\n{HOSTILE}", f"audio{HOSTILE}")
    got, _ = p.decode([bytes(f) for f in p.encode(skip)])
    assert not control_characters(got.reason + got.path + got.stage) and "\n" not in got.path
    assert clean(PERSIAN) == PERSIAN


def test_peer_log_bounds_each_peer_and_all_of_them(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    drops, logger = Drops(), logging.getLogger("peer-log-test")
    say = PeerLog(drops, logger, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="peer-log-test"):
        written = sum(say("flood", logging.ERROR, "crashed: %s", i) for i in range(1000))
        assert written == PEER_BURST and drops.counts["rate-limited"] == 1000 - PEER_BURST
        say.summarize()  # no budget yet: nothing told
        now[0] += PEER_REFILL_S
        say.summarize()
        told = [r.getMessage() for r in caplog.records if "suppressed" in r.getMessage()]
        assert told == [
            f"{1000 - PEER_BURST} log lines about flood were suppressed (over "
            f"{PEER_BURST} per {PEER_REFILL_S:.0f} s)"
        ]
        # Many names at once: the total budget holds whatever the number of peers.
        many = sum(say(f"peer{i}", logging.INFO, "joined") for i in range(10_000))
    assert many <= TOTAL_BURST, many
    ours = [r for r in caplog.records if r.name == "peer-log-test"]
    assert len(ours) <= PEER_BURST + 1 + TOTAL_BURST


def flood_crashes(cfg: Config, endpoint: str, stop: threading.Event, sent: list[int]) -> None:
    """An authenticated local producer (this user's process, on the ipc socket) that says
    HELLO and then CRASH as fast as the stager takes them, until stop."""
    with peer_socket(endpoint) as peer:
        prints = config_fingerprint(cfg)
        hello = p.Hello("flood", os.getpid(), socket.gethostname(), False, "t", "", prints)
        peer.send_multipart(p.encode(hello))
        crash = p.encode(p.Crash("flood", LONG_TRACEBACK))
        while not stop.is_set():
            peer.send_multipart(crash)  # blocks when the stager's queue is full: its pace
            sent[0] += 1
        peer.setsockopt(zmq.LINGER, 10_000)  # deliver what is queued: every one is counted


def test_a_crash_flood_costs_the_log_a_few_lines(tmp_path: Path) -> None:
    n, flood_s = 400, 3.0
    stop, sent = threading.Event(), [0]
    with (
        stager_thread(small(tmp_path, items=n, delay_s=0.01)) as stager,
        StatsReader(stager.stats) as st,
    ):
        cfg, client = stager.cfg, stager.client()
        with producer_threads(cfg, stager.control, n=2):
            size0, t0 = len(stager.log.text().encode()), time.monotonic()
            flood = threading.Thread(
                target=flood_crashes, args=(cfg, stager.control, stop, sent), daemon=True
            )
            flood.start()
            items = consume(client, timeout_s=60)
            stop.wait(max(0.0, flood_s - (time.monotonic() - t0)))
            stop.set()
            flood.join(10)
            allowed = PEER_BURST + int((time.monotonic() - t0) / PEER_REFILL_S) + 1
            st.first(
                lambda s: s["dropped"].get("rate-limited", 0) >= sent[0] - allowed,
                30,
                "every CRASH of the flood read by the stager",
            )
            client.close()
        summary = stager.summary()
        log_text = stager.log.text()
    grown = len(log_text.encode()) - size0
    logged = log_text.count("producer flood crashed")
    print(f"{sent[0]} CRASH in {flood_s:.0f}+ s: log +{grown} bytes, {logged} logged")
    assert_exactly_once(items, cfg, n)
    assert sent[0] > 1000, f"the flood sent only {sent[0]} messages"
    assert grown < MAX_LOG_GROWTH_BYTES, f"the stager's log grew {grown} bytes"
    assert 1 <= logged <= allowed
    assert summary["dropped"]["rate-limited"] == sent[0] - logged, summary["dropped"]


def inspect_json(run_id: str, config: Path, capsys: pytest.CaptureFixture) -> str:
    """What `ringfeed inspect --json` prints (its entry, consumer/tools/inspector.py main)."""
    capsys.readouterr()
    assert inspector_main(run_id, as_json=True, config_path=str(config)) == 0
    return capsys.readouterr().out


def strings_in(value: Any) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in strings_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return [value] if isinstance(value, str) else []


def screen_of(run_id: str, config: Path) -> str:
    """The inspector's live screen, one refresh, without its own bold and clear codes."""
    insp = Inspector(run_id, str(config))
    try:
        insp.poll_stats(3.0)
        text = render(insp.snapshot())
    finally:
        insp.close()
    for code in (BOLD, RESET, CLEAR):
        text = text.replace(code, "")
    return text


def test_no_control_character_from_a_peer_reaches_log_json_or_inspector(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    n = 100
    config = small(tmp_path, items=n, ring={"lease_s": 5.0})  # the peer stays listed
    name, shown = f"evil{HOSTILE}{PERSIAN}", clean(f"evil{HOSTILE}{PERSIAN}")
    with stager_thread(config) as stager, StatsReader(stager.stats) as st:
        cfg, client = stager.cfg, stager.client()  # connected, not reading yet: the run waits
        with producer_threads(cfg, stager.control, n=2), peer_socket(stager.control) as peer:
            prints = config_fingerprint(cfg)
            hello = p.Hello(name, os.getpid(), f"host{HOSTILE}", False, "t", f"at{HOSTILE}", prints)
            peer.send_multipart(p.encode(hello))
            peer.send_multipart(p.encode(p.Heartbeat(0, {f"decoded{HOSTILE}": 1})))
            peer.send_multipart(p.encode(p.Crash(name, f"Traceback\n{HOSTILE}boom\n")))
            st.first(lambda s: s["crashes"] and s["producers"], 20, "the peer's row and crash")
            screen = screen_of(stager.run_id, config)
            as_json = inspect_json(stager.run_id, config, capsys)
            items = consume(client, timeout_s=30)
            client.close()
        stager_json = stager.summary()
        log_text = stager.log.text()
    assert_exactly_once(items, cfg, n)
    assert shown == f"evil[2J]0;owned31m{PERSIAN}"
    for where, texts in (
        ("the stager log", [log_text]),
        ("stager.json", strings_in(stager_json)),
        ("inspect --json", strings_in(json.loads(as_json))),
        ("the inspector's screen", [screen]),
    ):
        assert not {c for t in texts for c in control_characters(t)}, where
        assert any(shown[:24] in t for t in texts), f"{where} does not show the peer"
    assert "Traceback\n[2J]0;owned31mboom" in log_text


def test_the_stats_message_stays_under_its_limit_in_the_worst_case() -> None:
    """As many producers as a run admits, each with the longest name and host and the
    most work counters a peer may send (the producer book's own record), composed with
    every other part's record at its largest: the longest crash reports kept, the
    largest counters and bucket shapes."""
    cfg = config_from_dict({})
    terms = LedgerTerms(12, 32, 32, 8, 32, 1.0, 3)
    manager = Ledger(plan=Plan(Shuffle(100, 1), 1), terms=terms)
    book = ProducerBook(
        ledger=manager,
        terms=BookTerms(16, 3, MAX_PRODUCERS, True, 1.0, manager.capacity),
        hostname="head",
        clock=time.monotonic,
    )
    for i in range(MAX_PRODUCERS):
        name = f"{i:04d}" + "n" * (p.MAX_NAME - 4)
        hello = p.Hello(name, 2**31 - 1, "h" * p.MAX_NAME, True, f"t{i}", "", {})
        book.hello(f"R{i}".encode(), hello, remote=True, peer=PeerId(f"key {i}", "x"))
        pr = book.producers[f"R{i}".encode()]
        pr.work = {
            f"{k:02d}" + "k" * (p.MAX_WORK_KEY - 2): 2**53 - 1 for k in range(p.MAX_WORK_KEYS)
        }
        pr.samples = 2**40
    crash, many = CrashReport("n" * p.MAX_NAME, "t" * 2000), 2**40
    stats = StagerStats.compose(
        RunStats(
            "r" * 32, 0.0, 100, ((2**20,) * 3,) * 16, 0, 2, cfg.features.device, cfg.ring.lease_s
        ),
        manager.stats(),
        book.stats(),
        BuilderStats(3, Padding(1.0, 1.0)),
        DeliveryStats(many),
        ConsumerStats(False, TrainerReport(many, 1.0, 1.0, 1.0, many, many, 1.0)),
        DeskStats((crash,) * CRASHES_KEPT),
        ControlStats(many),
        DropStats({r: many for r in ("malformed", "stale", "torn")}),
    )
    snap = stats.to_dict()
    assert snap["producers_unlisted"]["count"] == MAX_PRODUCERS - len(snap["producers"])
    header = p.encode(p.Stats(snap))[0]
    assert len(header) < p.MAX_HEADER_BYTES, len(header)


def test_synthetic_items_past_ten_thousand_pass_the_content_check() -> None:
    """A synthetic row names its item in two bounded mel columns: item 10**7 used to be
    written as the value 1e7, which the content check (|x| <= 1e4) refused, so every
    sample of a large synthetic run (the ring benchmark's) was skipped."""
    cfg = config_from_dict({"data": {"format": "synthetic", "synthetic_items": 10**8 // 2}})
    source = SyntheticSource(cfg)
    for item in (0, 8191, 8192, 123_456, 10**7, 10**8 // 2 - 1):
        sample = source.prepare(item)
        rows = {"tokens": sample.tokens, "mel": sample.mel}
        assert content_error(rows, cfg.vocab_size) == "", item
        text_len, frames = len(sample.tokens), len(sample.mel)
        batch = {
            "items": np.array([item, -1]),
            "text_lens": np.array([text_len, 0]),
            "mel_lens": np.array([frames, 0]),
            "tokens": np.zeros((2, cfg.text.max_text_len), np.int32),
            "mel": np.zeros((2, cfg.features.max_frames, cfg.features.n_mels), np.float32),
            "valid": np.array([True, False]),
            "position": np.array([item, -1]),
            "speaker": np.array([0, cfg.data.max_speakers - 1], np.int32),  # padding's id
            "language": np.array([0, cfg.data.max_languages - 1], np.int32),
        }
        batch["tokens"][0, :text_len], batch["mel"][0, :frames] = sample.tokens, sample.mel
        assert check_synthetic_rows(batch, 1, cfg) == [item]
        batch["mel"][0, 0, 2] += 1  # another item's high stamp: caught
        with pytest.raises(RowMismatch):
            check_synthetic_rows(batch, 1, cfg)
