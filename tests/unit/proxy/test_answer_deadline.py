"""The deadline of a host's answer (its head within ``header_timeout``, then each chunk
within ``idle_timeout``), which a client's connection lends to its requests one after
another (crossbar.http.timers.borrow): one timer for them all, each request's times
still kept to the millisecond, and a request that ends late taking nothing from the next."""

from __future__ import annotations

from typing import Any

from crossbar.testing import ClientLine, HostLine, MemoryProxy
from tests.support.exchange import BODY, END, EVENT, HEAD, chunk, config

ASK = (
    b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: crossbar\r\nContent-Length: %d\r\n\r\n%s"
    % (
        len(BODY),
        BODY,
    )
)


def counting_timers(proxy: MemoryProxy) -> list[float]:
    """Every timer made from now on, by its delay."""
    made: list[float] = []
    call_later = proxy.clock.callLater

    def counted(delay: float, f: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(delay)
        return call_later(delay, f, *args, **kwargs)

    proxy.clock.callLater = counted  # type: ignore[method-assign]
    return made


def answer(host: HostLine) -> None:
    host.send(HEAD + chunk(EVENT) + END)


def statuses(client: ClientLine) -> list[bytes]:
    return [line.split(b" ")[1] for line in client.received.split(b"\r\n") if b"HTTP/1.1 " in line]


def test_a_connection_s_requests_one_after_another_make_no_timer_for_their_answers() -> None:
    """Before, each request made and cancelled two (its head's, its stream's): some
    18,000 instructions a request."""
    proxy = MemoryProxy(config(header_timeout=60, idle_timeout=30), models=("m",))
    made = counting_timers(proxy)
    client = proxy.client()
    client.send(ASK)
    host = proxy.accept()
    answer(host)
    first = len(made)
    for _ in range(5):
        client.send(ASK)
        answer(host)
    assert statuses(client) == [b"200"] * 6
    assert len(made) == first, "a request after the first made a timer"


def test_each_request_still_gets_its_whole_header_timeout_then_its_idle_timeout() -> None:
    """The one timer, set long ago by an earlier request, waits for what each one has
    left: a host with no head is a 504 at ``header_timeout``, not before; one quiet
    mid-answer is cut off at ``idle_timeout`` after its last chunk, not before."""
    proxy = MemoryProxy(config(header_timeout=60, idle_timeout=30), models=("m",))
    client = proxy.client()
    client.send(ASK)
    host = proxy.accept()
    answer(host)
    proxy.clock.advance(2)  # the timer the first request set is under way
    client.send(ASK)  # on the host's kept-alive connection
    proxy.clock.advance(59.999)
    assert statuses(client) == [b"200"]
    proxy.clock.advance(0.001)
    assert statuses(client) == [b"200", b"504"]

    client.send(ASK)
    host = proxy.accept()  # the host that sent nothing was closed
    host.send(HEAD + chunk(EVENT))
    proxy.clock.advance(20)
    host.send(chunk(EVENT))
    proxy.clock.advance(29.999)
    assert not client.closed
    proxy.clock.advance(0.001)
    assert client.closed, "the answer quiet for idle_timeout was not cut off"


def test_a_pipelined_request_keeps_its_deadline_when_the_one_before_it_ends_after_it_began() -> (
    None
):
    """twisted.web starts a pipelined request before it tells the one before it that it
    ended: that end must not clear the deadline the next one has taken."""
    proxy = MemoryProxy(config(header_timeout=60, idle_timeout=30), models=("m",))
    client = proxy.client()
    client.send(ASK + ASK)
    host = proxy.accept()
    answer(host)  # the first ends; the second is sent on, and never answered
    assert statuses(client) == [b"200"]
    proxy.clock.advance(60)
    assert statuses(client) == [b"200", b"504"]
