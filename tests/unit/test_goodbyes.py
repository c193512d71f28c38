"""Goodbyes over a link that loses messages, against the real stager in this process (its
sockets and rings; tests/support/stager_thread.py): a peer says BYE again every
BYE_AGAIN_S until it hears BYE_ACK, and the stager answers each BYE, a repeated one too.
A lost consumer BYE had left the stager waiting stager.consumer_wait_s (600 s by
default) for a consumer that had gone; a lost BYE_ACK cost a producer SHUTDOWN_WAIT_S
and was counted as a message from an unknown peer. The producer's side of it, turn by
turn: tests/unit/test_session.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from unittest.mock import patch

from ringfeed.consumer.client import batch_client
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.peers import peer_socket
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread


def answers(sock, kind: type) -> bool:
    """Read what the stager sent; True once a message of `kind` came."""
    while sock.poll(0):
        msg, _ = p.decode(sock.recv_multipart())
        if isinstance(msg, kind):
            return True
    return False


def test_a_producer_that_says_bye_again_is_answered_again_and_not_taken_for_a_stranger(
    tmp_path: Path,
) -> None:
    n = 64
    with stager_thread(small(tmp_path, items=n, delay_s=0.0)) as stager:
        cfg, client = stager.cfg, stager.client()
        with peer_socket(stager.control) as sock:
            hello = p.Hello(
                "leaver", os.getpid(), socket.gethostname(), False, "t", "", config_fingerprint(cfg)
            )
            sock.send_multipart(p.encode(hello))
            wait_for(lambda: answers(sock, p.Welcome), 10, "WELCOME", interval_s=0)
            sock.send_multipart(p.encode(p.Bye(0, {})))
            wait_for(lambda: answers(sock, p.ByeAck), 10, "BYE_ACK", interval_s=0)
            # As if that BYE_ACK was lost on the way: the same BYE again, answered again.
            sock.send_multipart(p.encode(p.Bye(0, {})))
            wait_for(lambda: answers(sock, p.ByeAck), 10, "a second BYE_ACK", interval_s=0)
        with producer_threads(cfg, stager.control):
            items = consume(client)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)  # consume() checked every row's stamp
    assert "unknown-peer" not in summary["dropped"], summary["dropped"]


def test_a_consumers_lost_bye_is_said_again_and_the_stager_ends_at_once(tmp_path: Path) -> None:
    """The consumer's first BYE is lost on the way. The stager must still hear one and
    end the run now, not after stager.consumer_wait_s (here ten minutes)."""
    n = 32
    cfg_path = small(tmp_path, items=n, delay_s=0.0, stager={"consumer_wait_s": 600.0})
    sent = batch_client.send
    lost = []

    def lossy_send(sock, msg, payload=None):
        if isinstance(msg, p.Bye) and not lost:
            lost.append(msg)  # the link lost it
            return
        sent(sock, msg, payload)

    with stager_thread(cfg_path) as stager:
        cfg, client = stager.cfg, stager.client()
        with producer_threads(cfg, stager.control):
            items = consume(client)
            with patch.object(batch_client, "send", lossy_send):
                client.close()
            assert stager.ended() == 0, stager.log.text()
        assert "consumer finished" in stager.log.text()
    assert lost and len(items) == n
    assert_exactly_once(items, cfg, n)
