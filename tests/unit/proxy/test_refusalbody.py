"""crossbar.proxy.refusalbody: a short error answer held back until crossbar knows whether
it is a host's context-window refusal (retried elsewhere) or anything else (relayed as it
came)."""

from __future__ import annotations

from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone

from crossbar.proxy.overflow import MAX_REFUSAL_BYTES
from crossbar.proxy.refusalbody import RefusalBody
from tests.support.refusals import REAL


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
