"""A poll's answer read as a poll may: within a size, its connection closed when the poll
gives up on it (a timeout, crossbar stopping), digested as it comes. Twisted I/O for
:mod:`crossbar.polling.poller`."""

from __future__ import annotations

from typing import Any, Protocol

import treq
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.iweb import IResponse

from crossbar.upstream import stop_producing


class PollError(Exception):
    """A poll failed; ``str()`` is the ``last_err`` text."""


class _Watched:
    """A response that remembers who reads its body, so a poll given up on (timed
    out, or crossbar stopping) can close the connection: ``treq.collect`` cannot."""

    def __init__(self, response: IResponse) -> None:
        self.length = response.length
        self._response = response
        self._reader: Any = None

    def deliverBody(self, protocol: Any) -> None:
        self._reader = protocol
        self._response.deliverBody(protocol)

    def stop(self) -> None:
        if self._reader is not None:
            stop_producing(self._reader.transport)


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def read_limited(response: IResponse, limit: int, digest: Digest | None = None) -> Deferred[bytes]:
    """The body, through ``treq.collect``, refused (and its connection closed) past
    ``limit`` bytes; cancelling closes the connection too. ``digest`` is fed each part
    as it comes, so that digesting a long body never holds the reactor at once."""
    parts: list[bytes] = []
    size = 0

    def keep(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > limit:
            raise PollError(f"answer larger than {_size(limit)}")
        parts.append(data)
        if digest is not None:
            digest.update(data)

    watched = _Watched(response)
    result: Deferred[bytes] = Deferred(lambda _: watched.stop())

    def done(outcome: object) -> None:
        if result.called:  # given up on already
            return
        if isinstance(outcome, Failure):
            result.errback(outcome)
        else:
            result.callback(b"".join(parts))

    treq.collect(watched, keep).addBoth(done)  # type: ignore[arg-type]
    if isinstance(response.length, int) and response.length > limit and not result.called:
        watched.stop()
        result.errback(PollError(f"answer larger than {_size(limit)}"))
    return result


def _size(limit: int) -> str:
    mib, rest = divmod(limit, 1024 * 1024)
    return f"{mib} MiB" if mib and not rest else f"{limit} bytes"


def discard(response: IResponse) -> None:
    """Close the connection of an answer whose body nobody wants."""
    watched = _Watched(response)
    treq.collect(watched, lambda _: None).addErrback(lambda _: None)  # type: ignore[arg-type]
    watched.stop()
