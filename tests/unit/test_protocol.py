"""Protocol round trips and strict decoding, without sockets."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringfeed.shared.config import config_from_dict
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p

# What a producer of the default config says in its HELLO. The corpus digest is given:
# computing it would need the default corpus prepared, and a clean clone has no index.
CONFIG_PRINT = config_fingerprint(config_from_dict({}), corpus="4" * 16)
PLAN_PRINT = {"index": "0" * 16, "seed": "1" * 16, "buckets": "2" * 16, "lengths": "3" * 16}

EXAMPLES = [
    p.Hello("host-0", 123, "host", False, "9f2c", "ray actor 1a2b on node 3c4d", CONFIG_PRINT),
    p.Welcome("run", "ringfeed-run-batches", 13, PLAN_PRINT, "ringfeed-run-spares"),
    p.Request(2),
    p.Grant(7, False, 2, 16, 800, 200, [3, 4], [11, 12], [99, 100]),
    p.Grant(8, True, 0, 0, 0, 0, [5], [13], [101]),
    p.Ready(7, [3], [11], [40, 300], [0xDEADBEEF], [0]),
    p.Ready(7, [3, 4], [11, 12], [40, 300, 41, 80], [1, 2], [0, 8], b"k" * 16 + bytes(16), [4, 0]),
    p.Skip(7, 3, 11, "unreadable audio: not a RIFF file", "/x.wav", "audio"),
    p.Heartbeat(5, {"decoded": 3, "cache_hits": 2}),
    p.Crash("host-0", "Traceback ...\nValueError: boom"),
    p.Bye(5, {"decoded": 5}),
    p.ByeAck(),
    p.Shutdown("run finished"),
    p.ConsumerHello("trainer", 64, 2, "s3cret", PLAN_PRINT, 3),
    p.BatchReady(1, 9, 40, 330, 3, 8, 2, 8, 800, 200),
    p.BatchReady(1, 4, 10, 352, 0, 32, 0, 64, 400, 96),
    p.BatchFree(1, 4),
    p.StepStats(10, 0.25, 0.01, 1.5, 8, 4321),
    p.EndOfData(12),
    p.Stats({"a": 1, "b": [1, 2]}),
    p.Rehello(),
    p.Refused("this stager speaks ringfeed protocol version 4, the peer version 3"),
]


def test_every_kind_has_an_example() -> None:
    assert {type(m) for m in EXAMPLES} == set(p.MESSAGE_TYPES.values())


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: object) -> None:
    decoded, payload = p.decode([bytes(f) for f in p.encode(msg)])
    assert decoded == msg and payload == []


def test_a_readys_entries_carry_their_cache_keys_and_line_up() -> None:
    """A local producer's clip keys travel with their entries, NO_KEY where an entry has
    none; a READY whose keys or clip marks do not line up with its places is not
    consistent (the stager refuses it whole)."""
    entries = [
        p.ReadyEntry(3, 7, 11, [40, 300], 1, 0, b"k" * 16, 4),
        p.ReadyEntry(4, 7, 12, [41, 80], 2, 8),
    ]
    ready = p.Ready.of(entries)
    assert ready.cache_keys == b"k" * 16 + p.NO_KEY and ready.clip_marks == [4, 0]
    assert ready.entries(2) == [entries[0], entries[1]._replace(cache_key=p.NO_KEY)]
    plain = p.Ready.of([entries[1]])
    assert plain.cache_keys == b"" and plain.clip_marks == [] and plain.consistent(2)
    assert not p.Ready(
        7, [3, 4], [11, 12], [1, 2, 3, 4], [1, 2], [0, 0], b"k" * 16, [0]
    ).consistent(2)
    assert not p.Ready(7, [3], [11], [1, 2], [1], [0], b"k" * 16, []).consistent(2)


def test_ready_carries_raw_payload_frames() -> None:
    frames = p.encode(p.Ready(1, [0], [2], [3], [0], [0]), [memoryview(b"\x00" * 12)])
    msg, payload = p.decode([bytes(f) for f in frames])
    assert isinstance(msg, p.Ready) and payload == [b"\x00" * 12]


def _header(*values: object) -> bytes:
    return msgpack.packb(list(values), use_bin_type=True)


# A GRANT's fields: generation, spare, batch, rows, frames, text, places, items, positions.
_GRANT = (7, False, 2, 16, 800, 200, [1], [3], [4])


@pytest.mark.parametrize(
    ("frames", "needle"),
    [
        ([], "empty"),
        ([b"\xc1garbage"], "not msgpack"),
        ([_header(p.VERSION, int(p.Kind.GRANT), 1, 2)], "2 fields, expected 9"),
        ([_header(99, int(p.Kind.GRANT), *_GRANT)], "protocol version 99"),
        ([_header(p.VERSION, 250)], "unknown message kind"),
        ([_header(p.VERSION, int(p.Kind.GRANT), *_GRANT[:6], "1", [3], [4])], "GRANT.places"),
        ([_header(p.VERSION, int(p.Kind.GRANT), *_GRANT[:6], [True], [3], [4])], "GRANT.places"),
        ([_header(p.VERSION, int(p.Kind.GRANT), 1, 0, *_GRANT[2:])], "GRANT.spare"),
        (
            [_header(p.VERSION, int(p.Kind.READY), 1, [0], [2], [1, "x"], [0], [0], b"", [])],
            "READY.lengths",
        ),
        (
            [_header(p.VERSION, int(p.Kind.READY), [1], [0], [2], [1], [0], [0], b"", [])],
            "READY.generation",
        ),
        (  # a cache key is 16 bytes: no part of one
            [_header(p.VERSION, int(p.Kind.READY), 1, [0], [2], [1], [0], [0], b"k" * 15, [0])],
            "READY.cache_keys",
        ),
        (
            [_header(p.VERSION, int(p.Kind.READY), 1, [0], [2], [1], [0], [0], "k" * 16, [0])],
            "READY.cache_keys",
        ),
        ([b"\x00" * (p.MAX_HEADER_BYTES + 1)], "header of"),
        ([_header(p.VERSION, int(p.Kind.GRANT), *_GRANT), b"x"], "unexpected payload"),
        (
            [_header(p.VERSION, int(p.Kind.READY), 1, [0], [2], [1], [0], [0], b"", [])]
            + [b""] * (p.MAX_PAYLOAD_FRAMES + 1),
            "payload frames",
        ),
        ([_header(1, 2, 3)[:-1]], "not msgpack"),
    ],
)
def test_malformed_messages_raise_protocol_error(frames: list[bytes], needle: str) -> None:
    with pytest.raises(p.ProtocolError, match=needle):
        p.decode(frames)


def _hello(name: str = "p", pid: int = 1) -> list[bytes]:
    return [_header(p.VERSION, int(p.Kind.HELLO), name, pid, "host", False, "t", "", {}, {})]


@pytest.mark.parametrize(
    ("frames", "needle"),
    [
        # A peer may not claim what no honest peer sends: negative or huge numbers,
        # names longer than any producer's, more work counters than a producer has.
        (
            [_header(p.VERSION, int(p.Kind.CONSUMER_HELLO), "t", -1, 0, "s", {}, 0, False)],
            "position",
        ),
        (
            [_header(p.VERSION, int(p.Kind.CONSUMER_HELLO), "t", 0, 2**60, "s", {}, 0, False)],
            "batch_index",
        ),
        (
            [_header(p.VERSION, int(p.Kind.CONSUMER_HELLO), "t", 0, 0, "s", {"k": 7}, 0, False)],
            "CONSUMER_HELLO.plan",
        ),
        (
            [
                _header(
                    p.VERSION, int(p.Kind.HELLO), "n", 1, "h", False, "t", "", {"k": "v" * 65}, {}
                )
            ],
            "HELLO.config",
        ),
        (_hello(name="x" * (p.MAX_NAME + 1)), "HELLO.name: not a valid str"),
        (_hello(pid=-5), "HELLO.pid"),
        ([_header(p.VERSION, int(p.Kind.GRANT), -2, *_GRANT[1:])], "GRANT.generation"),
        ([_header(p.VERSION, int(p.Kind.GRANT), *_GRANT[:6], [-1], [3], [4])], "GRANT.places"),
        ([_header(p.VERSION, int(p.Kind.BATCH_FREE), -1, 0)], "BATCH_FREE.slot"),
        (
            [_header(p.VERSION, int(p.Kind.HEARTBEAT), 0, {str(i): 1 for i in range(33)})],
            "HEARTBEAT.work",
        ),
        ([_header(p.VERSION, int(p.Kind.HEARTBEAT), 0, {"k" * 65: 1})], "HEARTBEAT.work"),
        ([_header(p.VERSION, int(p.Kind.SKIP), 0, 0, 0, "r" * 5000, "", "")], "SKIP.reason"),
    ],
)
def test_out_of_range_fields_raise_protocol_error(frames: list[bytes], needle: str) -> None:
    with pytest.raises(p.ProtocolError, match=needle):
        p.decode(frames)


def test_limits_admit_what_honest_peers_send() -> None:
    long_ok = p.Skip(0, 0, 0, "r" * 4096, "/" * 4096, "audio")
    assert p.decode([bytes(f) for f in p.encode(long_ok)])[0] == long_ok
    name = p.Hello("n" * p.MAX_NAME, 2**31 - 1, "h" * p.MAX_NAME, True, "t" * 64, "", CONFIG_PRINT)
    assert p.decode([bytes(f) for f in p.encode(name)])[0] == name


def test_a_refusal_decodes_whatever_its_version() -> None:
    """REFUSED's layout [version, 19, reason] is frozen: a producer of another version
    still learns why it is refused (and exits, instead of saying HELLO forever)."""
    for version in (3, p.VERSION, 99):
        msg, _ = p.decode([_header(version, int(p.Kind.REFUSED), "other version")])
        assert msg == p.Refused("other version")


def test_another_version_names_both_versions() -> None:
    hello = _header(3, int(p.Kind.HELLO), "old", 1, "host", False, "t", "")
    with pytest.raises(p.VersionMismatch, match=f"protocol version 3, expected {p.VERSION}") as e:
        p.decode([hello])
    assert (e.value.theirs, e.value.ours) == (3, p.VERSION)


def test_encode_refuses_oversized_headers() -> None:
    with pytest.raises(p.ProtocolError, match="bytes >"):
        p.encode(p.Crash("x", "y" * (p.MAX_HEADER_BYTES + 10)))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=3))
def test_random_bytes_never_escape_as_other_errors(frames: list[bytes]) -> None:
    try:
        p.decode(frames)
    except p.ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(EXAMPLES), st.integers(0, 64), st.integers(0, 255))
def test_mutated_valid_messages_decode_or_raise_protocol_error(msg, pos, byte) -> None:
    header = bytearray(p.encode(msg)[0])
    header[pos % len(header)] = byte
    try:
        decoded, _ = p.decode([bytes(header)])
    except p.ProtocolError:
        return
    assert dataclasses.is_dataclass(decoded)


def test_grant_and_ready_entries_round_trip_through_the_wire():
    """A run of rows of one batch slot (its shape with it), and a run of spare places."""
    rows = [
        p.GrantEntry(3, 7, 11, 99, 2, (16, 800, 200)),
        p.GrantEntry(4, 7, 12, 100, 2, (16, 800, 200)),
    ]
    spares = [p.GrantEntry(0, 8, 13, 101), p.GrantEntry(5, 8, 14, 102)]
    for run in (rows, spares):
        msg, _ = p.decode(p.encode(p.Grant.of(run)))
        assert msg.entries() == run
    ready = [
        p.ReadyEntry(3, 7, 11, [40, 300], 0xBEEF, True),
        p.ReadyEntry(4, 7, 12, [2, 5], 9, False),
    ]
    msg, _ = p.decode(p.encode(p.Ready.of(ready)))
    assert msg.entries(2) == ready
    assert "inconsistent" in msg.entries(3)  # a run with 3 fields: the lists do not line up


def test_a_grant_whose_lists_differ_in_length_is_refused_at_decode():
    with pytest.raises(p.ProtocolError, match="differ in length"):
        p.decode(p.encode(p.Grant(1, False, 0, 4, 8, 8, [1, 2], [1], [1, 2])))
