"""crossbar.upstream.call: one request to one host until its head, told to whoever asked by
a method call (no Deferred), with a fake pool and connections; and what the exchange makes
of an error of its own while it is told (crossbar.testing.MemoryProxy)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from twisted.internet import error
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.client import ResponseNeverReceived

from crossbar.proxy import hostanswer
from crossbar.testing import MemoryProxy
from crossbar.upstream import Call
from tests.support.errors import api_error
from tests.support.exchange import EVENT, HEAD, ask, chunk, config


class Connection:
    def __init__(self, reused: bool = False) -> None:
        self.reused = reused
        self.sent: list[tuple[bytes, ...]] = []
        self.cancelled = False
        self.waiter: Any = None

    def send(self, waiter: Any, data: tuple[bytes, ...], head_only: bool) -> None:
        self.waiter = waiter
        self.sent.append(data)

    def cancel(self) -> None:
        self.cancelled = True


class Pool:
    def __init__(self, *idle: Connection) -> None:
        self.idle = list(idle)
        self.connecting: list[Deferred[Any]] = []
        self.released: list[Connection] = []

    def take(self, host: str) -> Connection | None:
        return self.idle.pop() if self.idle else None

    def connect(self, host: str) -> Deferred[Any]:
        self.connecting.append(Deferred())
        return self.connecting[-1]

    def release(self, connection: Connection) -> None:
        self.released.append(connection)


class Told:
    """What the call told; ``raises``: its ``answered`` fails."""

    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.said: list[tuple[str, Any]] = []

    def answered(self, response: Any) -> None:
        self.said.append(("answered", response))
        if self.raises:
            raise ValueError("a bug")

    def not_answered(self, reason: Failure) -> None:
        self.said.append(("not answered", reason))

    def crashed(self, reason: Failure) -> None:
        self.said.append(("crashed", reason))


def call(pool: Pool, told: Told) -> Call:
    made = Call(cast(Any, pool), "gpu-a", (b"GET / HTTP/1.1\r\n\r\n",), False, told)
    made.start()
    return made


def test_the_head_is_told_once_and_nothing_after_it() -> None:
    told, connection = Told(), Connection()
    call(Pool(connection), told)
    assert connection.sent == [(b"GET / HTTP/1.1\r\n\r\n",)]
    connection.waiter.answered("head")
    connection.waiter.lost(connection, Failure(error.ConnectionDone()), True)
    assert told.said == [("answered", "head")]


def test_an_error_of_the_one_told_goes_to_its_crashed_not_up_the_connection() -> None:
    told, connection = Told(raises=True), Connection()
    call(Pool(connection), told)
    connection.waiter.answered("head")  # does not raise
    first, (what, why) = told.said
    assert first == ("answered", "head")
    assert what == "crashed" and why.check(ValueError)


def test_a_cancelled_call_tells_nobody_and_closes_what_it_had() -> None:
    told, pool = Told(), Pool()
    connecting = call(pool, told)
    connecting.cancel()  # while connecting: the attempt is cancelled, and its failure unsaid
    assert pool.connecting[0].called
    connection = Connection()
    sending = call(Pool(connection), told)
    sending.cancel()  # once sent: the connection is closed, not reused
    connection.waiter.lost(connection, Failure(error.ConnectionLost()), False)
    assert connection.cancelled and told.said == []


def test_a_kept_alive_connection_closed_before_a_byte_is_sent_again_once_on_a_new_one() -> None:
    told, stale = Told(), Connection(reused=True)
    pool = Pool(stale)
    call(pool, told)
    stale.waiter.lost(stale, Failure(error.ConnectionDone()), False)
    assert told.said == [] and len(pool.connecting) == 1
    fresh = Connection()
    pool.connecting[0].callback(fresh)
    fresh.waiter.lost(fresh, Failure(error.ConnectionDone()), False)  # not again
    [(what, why)] = told.said
    assert what == "not answered" and why.check(ResponseNeverReceived)


def test_a_failed_connection_attempt_is_told() -> None:
    told, pool = Told(), Pool()
    call(pool, told)
    pool.connecting[0].errback(Failure(error.ConnectionRefusedError()))
    [(what, why)] = told.said
    assert what == "not answered" and why.check(error.ConnectionRefusedError)


def test_an_error_of_crossbar_s_own_on_the_host_s_head_is_a_500_in_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(hostanswer, "answer_headers", broken)
    proxy = MemoryProxy(config(), models=("m",))
    client = ask(proxy)
    proxy.accept().send(HEAD + chunk(EVENT))  # the head goes out with the first content
    head, _, body = client.received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 ")
    assert json.loads(body) == api_error(500, "internal error")
