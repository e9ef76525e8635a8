"""crossbar.proxy.overflow and crossbar.proxy.refusalbody: a host's refusal of a prompt
longer than its slot, recognised from its body, held back from the client until it is known."""

from __future__ import annotations

import pytest
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone

from crossbar.proxy.overflow import MAX_REFUSAL_BYTES, Overflow, may_be_refusal, read_overflow
from crossbar.proxy.refusalbody import RefusalBody

REAL = (
    b'{"error":{"code":400,"message":"request (3528 tokens) exceeds the available context size'
    b' (2048 tokens), try increasing it","type":"exceed_context_size_error",'
    b'"n_prompt_tokens":3528,"n_ctx":2048}}'
)
"""llama.cpp 0c1e57098's answer, byte for byte, to a 3,528-token prompt on a 2,048-token slot."""


def test_a_real_refusal_is_read_with_the_host_s_own_numbers() -> None:
    assert read_overflow(400, REAL) == Overflow(prompt_tokens=3528, window=2048)
    assert may_be_refusal(400, len(REAL)) and may_be_refusal(400, None)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, REAL),
        (400, b'{"error":{"code":400,"message":"model is not loaded","type":"not_found"}}'),
        (400, REAL.replace(b"3528,", b'"3528",')),
        (400, REAL.replace(b"2048}", b"0}")),
        (400, REAL.replace(b"2048}", b"1e3}")),
        (400, REAL.replace(b"3528,", b"true,")),
        (400, b'{"error":"exceed_context_size_error"}'),
        (400, b"not json"),
        (400, b"[" * 5000),
        (400, REAL[:-1] + b',"pad":"' + b"x" * MAX_REFUSAL_BYTES + b'"}'),
    ],
)
def test_anything_else_is_not_a_refusal(status: int, body: bytes) -> None:
    assert read_overflow(status, body) is None


def test_a_long_or_other_answer_is_never_held_for_it() -> None:
    assert not may_be_refusal(400, MAX_REFUSAL_BYTES + 1)
    assert not may_be_refusal(200, 10)


class Collect(Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.ended: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.ended = reason


def test_a_short_body_is_held_whole_then_told() -> None:
    told: list[tuple[bytes, bool]] = []
    body = RefusalBody(lambda data, whole: told.append((data, whole)))
    body.dataReceived(REAL[:100])
    assert told == []  # nothing yet: the client gets nothing of it meanwhile
    body.dataReceived(REAL[100:])
    body.connectionLost(Failure(ResponseDone()))
    assert told == [(REAL, True)]


def test_what_is_no_refusal_is_handed_over_whole_and_a_long_body_as_it_comes() -> None:
    told: list[tuple[bytes, bool]] = []
    short = RefusalBody(lambda data, whole: told.append((data, whole)))
    short.dataReceived(b'{"error":"bad"}')
    short.connectionLost(Failure(ResponseDone()))
    relay = Collect()
    short.hand_over(relay)
    assert relay.data == b'{"error":"bad"}' and relay.ended is not None

    long_relay = Collect()
    long = RefusalBody(lambda data, whole: long.hand_over(long_relay))
    long.dataReceived(b"x" * (MAX_REFUSAL_BYTES + 1))
    long.dataReceived(b"rest")
    assert long_relay.data == b"x" * (MAX_REFUSAL_BYTES + 1) + b"rest"
    assert long_relay.ended is None
    long.connectionLost(Failure(ResponseDone()))
    assert long_relay.ended is not None
