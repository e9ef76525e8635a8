"""One request to one host, until its status line arrives: told to whoever asked
(:class:`Answerer`) by a method call, not a Deferred (a Deferred and its callbacks cost a
request some 20,000 instructions; the pool's :meth:`~crossbar.upstream.pool.Upstreams.request`
still gives one, for whoever wants it)."""

from __future__ import annotations

from typing import Protocol

from twisted.internet import error
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.client import ResponseNeverReceived

from crossbar.upstream.connection import Connection, Response


class Pool(Protocol):
    """What a call needs of its pool (:class:`~crossbar.upstream.pool.Upstreams`)."""

    def take(self, host: str) -> Connection | None: ...

    def connect(self, host: str) -> Deferred[Connection]: ...

    def release(self, connection: Connection) -> None: ...


class Answerer(Protocol):
    """Who waits for a host's answer: told once, of its head or of why none will come.
    An exception raised by either goes to :meth:`crashed` (as a Deferred's errback would
    have it)."""

    def answered(self, response: Response) -> None: ...

    def not_answered(self, reason: Failure) -> None: ...

    def crashed(self, reason: Failure) -> None: ...


class Call:
    """One request to one host, until its status line arrives (made by
    :meth:`Upstreams.call <crossbar.upstream.pool.Upstreams.call>`, sent by :meth:`start`).

    A kept-alive connection that the host closed just as it was reused fails before a
    single byte of answer; such a request is sent once more, on a new connection: a host
    closes an idle connection, not one it is answering on. Counting it as a failure would
    mark a healthy host down. :meth:`cancel` tells nobody: the one who cancels knows.
    """

    def __init__(
        self, pool: Pool, host: str, data: tuple[bytes, ...], head_only: bool, to: Answerer
    ) -> None:
        self.pool = pool
        self.host = host
        self.data = data
        self.head_only = head_only
        self._to = to
        self._connecting: Deferred[Connection] | None = None
        self._connection: Connection | None = None
        self._retried = False
        self.done = False
        """Told, or cancelled: nothing more is said."""

    def start(self) -> None:
        connection = self.pool.take(self.host)
        if connection is not None:
            self._send(connection)
        else:
            self._connect()

    def cancel(self) -> None:
        """Give up: the connection attempt, or the connection, is closed."""
        if self.done:
            return
        self.done = True
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.cancel()

    def _connect(self) -> None:
        d = self.pool.connect(self.host)
        self._connecting = d
        d.addCallbacks(self._connected, self.fail)

    def _connected(self, connection: Connection) -> None:
        self._connecting = None
        if self.done:  # cancelled meanwhile
            self.pool.release(connection)
        else:
            self._send(connection)

    def fail(self, reason: Failure) -> None:
        self._connecting = self._connection = None
        if not self.done:
            self._tell_no(reason)

    def _send(self, connection: Connection) -> None:
        self._connection = connection
        connection.send(self, self.data, self.head_only)

    def answered(self, response: Response) -> None:
        self._connection = None
        self.done = True
        try:
            self._to.answered(response)
        except Exception:
            self._to.crashed(Failure())

    def lost(self, connection: Connection, reason: Failure, got_bytes: bool) -> None:
        self._connection = None
        if self.done:
            return
        stale = connection.reused and not got_bytes and not self._retried
        if stale and reason.check(error.ConnectionDone, error.ConnectionLost):
            self._retried = True
            self._connect()
            return
        self._tell_no(Failure(ResponseNeverReceived([reason])))

    def _tell_no(self, reason: Failure) -> None:
        self.done = True
        try:
            self._to.not_answered(reason)
        except Exception:
            self._to.crashed(Failure())


class Result:
    """An answerer that fires a Deferred: :meth:`Upstreams.request
    <crossbar.upstream.pool.Upstreams.request>`'s. Cancelling it cancels the call, and it
    fails with ``CancelledError``."""

    def __init__(self) -> None:
        self.deferred: Deferred[Response] = Deferred(self._cancel)
        self.call: Call | None = None

    def answered(self, response: Response) -> None:
        self.deferred.callback(response)

    def not_answered(self, reason: Failure) -> None:
        self.deferred.errback(reason)

    def crashed(self, reason: Failure) -> None:
        self.deferred.errback(reason)  # not reached: a Deferred's callback never raises

    def _cancel(self, deferred: Deferred[Response]) -> None:
        if self.call is not None:
            self.call.cancel()
