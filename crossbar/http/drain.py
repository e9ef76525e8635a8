"""Stopping without cutting answers: close the ports, turn new requests away, let
those in flight finish for a while, then cut the rest."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from crossbar._twisted import handling_request
from crossbar.http.listener import Listener
from crossbar.http.site import Site

log = Logger()

DRAIN_CHECK = 0.1
"""Seconds between two looks at the requests still in flight while crossbar stops."""
FRESH_GRACE = 2.0
"""Seconds a connection with no request yet is left open when the drain begins: its
client connected before the port closed, and its request is on its way."""


async def drain(
    sites: Sequence[Site],
    listeners: Iterable[Listener | None],
    timeout: float,
    clock: IReactorTime,
) -> None:
    """Stop taking requests and let those in flight finish, for up to ``timeout`` seconds.

    The ports close at once, after taking the connections the kernel had queued on them
    (readyz already says 503, so a balancer sends elsewhere). A connection is closed as
    soon as it is between requests (an idle kept-alive one at once, a busy one after its
    answer): its client reconnects to another crossbar rather than finding this one gone
    mid-request. A connection with no request yet is left :data:`FRESH_GRACE` for its
    first one, which is answered. Past the timeout, the connections left are cut, which
    cancels their requests on the hosts.
    """
    for site in sites:
        site.draining = True
    closing: list[Deferred[None]] = []
    for listener in listeners:
        closed = None if listener is None else listener.close()
        if closed is not None:
            closing.append(closed)
    fresh_until = clock.seconds() + min(FRESH_GRACE, timeout)
    busy, fresh = _close_idle(sites, fresh_until, clock)
    waiting = busy
    if busy:
        log.info(
            "stopping: waiting up to {timeout}s for {count}",
            timeout=f"{timeout:g}",
            count=count_requests(busy, "in flight"),
        )
    else:
        log.info("stopping: no request in flight")
    deadline = clock.seconds() + timeout
    while (busy or fresh) and clock.seconds() < deadline:
        await deferLater(clock, min(DRAIN_CHECK, timeout), lambda: None)
        answering = busy
        busy, fresh = _close_idle(sites, fresh_until, clock)
        waiting += max(busy - answering, 0)  # first requests of fresh connections
    cut = 0
    for site in sites:
        for channel in list(site.channels):
            if _answering(channel):  # the idle ones are closing already
                cut += 1
                transport: Any = channel.transport
                transport.abortConnection()
    if waiting:
        finished = max(waiting - cut, 0)
        words = [count_requests(finished, "finished")] if finished or not cut else []
        if cut:
            words.append(f"{count_requests(cut, 'cut off')} after {timeout:g}s")
        log.info("stopped: {outcome}", outcome=", ".join(words))
    await gatherResults(closing)


def _close_idle(sites: Sequence[Site], fresh_until: float, clock: IReactorTime) -> tuple[int, int]:
    """Close the client connections that are between requests; count the others: those
    answering (their answer closes them) and, for a moment, the fresh ones, whose
    first request is on its way (accepted just before the port closed)."""
    busy = fresh = 0
    wait_fresh = clock.seconds() < fresh_until
    for site in sites:
        for channel in list(site.channels):
            if _answering(channel):
                channel.persistent = False
                busy += 1
            elif wait_fresh and not channel.heads:
                fresh += 1
            else:
                transport: Any = channel.transport
                transport.loseConnection()
    return busy, fresh


def _answering(channel: Any) -> bool:
    """Whether a connection carries a request not yet answered in full. One whose answer
    is complete and that is closing (``Connection: close``) is not, though twisted.web
    still says it is handling a request until it is closed."""
    return handling_request(channel) and bool(channel.requests)


def count_requests(count: int, what: str) -> str:
    """``1 request finished``, ``3 requests in flight``."""
    return f"{count} request{'' if count == 1 else 's'} {what}"
