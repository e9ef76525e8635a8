"""The simulator's HTTP side: twisted.web plumbing that behaves like llama-server's.

Kept apart from the host so that what the host decides (which answer) and how it goes out
(headers, keep-alive, SSE pacing and backpressure, open connections) can be read separately.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

from crossbar.http import INTERNAL_LISTENER
from crossbar.testing.simulator.apis import GENERATE
from crossbar.testing.simulator.replies import HttpError, error_body, json_object

JSON = b"application/json; charset=utf-8"
# The namespace the simulator has always logged under, whichever module logs.
_log = Logger(namespace="crossbar.testing.simulator")


class QuietSite(Site):
    """A Site that keeps quiet: the real router does not log routine requests either."""

    noisy = False

    def log(self, request: http.Request) -> None:
        pass


class _Connection(ProtocolWrapper):
    """One client connection; tells the tracker's owner once it is completely gone."""

    factory: ConnectionTracker

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.factory.on_lost()


class ConnectionTracker(WrappingFactory):
    """Keeps the open connections, so tests can count, await and abort them."""

    noisy = False
    protocol = _Connection

    def logPrefix(self) -> str:
        """Crossbar's log leaves out the "starting on" line of a port with this prefix."""
        return INTERNAL_LISTENER

    def __init__(self, site: Site, on_lost: Callable[[], None]) -> None:
        super().__init__(site)
        self.on_lost = on_lost


class SimResource(Resource):
    """The single leaf resource: every request is recorded, then handed to ``handle``.

    ``handle`` is cancelled when the client goes away; if it fails for any other reason the
    client gets a 500 (a bug in the simulator must not look like a hang).
    """

    isLeaf = True

    def __init__(
        self,
        record: Callable[[Request], None],
        handle: Callable[[Request], Coroutine[Any, Any, None]],
    ) -> None:
        super().__init__()
        self._record = record
        self._handle = handle

    def render(self, request: Request) -> int:
        self._record(request)
        request.setHeader(b"server", b"llama.cpp")
        request.setHeader(b"access-control-allow-origin", b"")  # sic: empty unless --api-key/CORS
        finished: Deferred[None] = request.notifyFinish()
        handling = Deferred.fromCoroutine(self._handle(request))
        finished.addErrback(lambda _: handling.cancel())
        handling.addErrback(_unexpected, request)
        return NOT_DONE_YET


def _unexpected(failure: Failure, request: Request) -> None:
    """Answer 500 for a bug in the simulator, and drop cancellations silently."""
    if failure.check(CancelledError):
        return
    _log.failure("crossbar simulator failed to answer", failure)
    if not request.startedWriting and not request.finished:
        send_error(request, 500, failure.getErrorMessage())


# -- answers ------------------------------------------------------------------------------------


def send(
    request: Request,
    status: int,
    data: bytes,
    content_type: bytes = JSON,
    *,
    chunked: bool = False,
) -> None:
    """Answer at once. Errors close the connection (``Connection: close``, no keep-alive);
    ``chunked`` answers have no Content-Length, like the completions a router proxies."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", content_type)
    if not chunked:
        request.setHeader(b"content-length", b"%d" % len(data))
    if status >= 400:
        close_after(request)
    else:
        request.setHeader(b"keep-alive", b"timeout=5, max=100")
    request.write(data)
    request.finish()


def send_error(request: Request, status: int, message: str) -> None:
    send(request, status, error_body(status, message))


def close_after(request: Request) -> None:
    """Close the connection once this answer is out, saying so."""
    request.setHeader(b"connection", b"close")
    request.channel.persistent = False


def unanswered(request: Request, clock: IReactorTime, pinged: bool) -> None:
    """Close the connection with no answer; ``pinged``: a stream's head and one ``:`` ping
    go out first, and the connection is then aborted (a host killed mid-prefill)."""
    if not (pinged and wants_stream(request)):
        (transport(request).abortConnection if pinged else transport(request).loseConnection)()
        return
    request.setHeader(b"content-type", b"text/event-stream")
    request.write(b": ping\n\n")
    clock.callLater(0.05, transport(request).abortConnection)  # once the ping has left


def transport(request: Request) -> Any:
    """The connection under a request (a TCP transport, or a test double)."""
    return request.transport


def request_body(request: Request) -> bytes:
    content: Any = request.content
    content.seek(0)
    data: bytes = content.read()
    content.seek(0)
    return data


def query(request: Request, name: str) -> str:
    values: Sequence[bytes] = request.args.get(name.encode(), [b""])
    return values[0].decode()


def json_body(request: Request) -> dict[str, Any]:
    return json_object(request_body(request))


def wants_stream(request: Request) -> bool:
    if request.method != b"POST" or request.path.decode() not in GENERATE:
        return False
    try:
        return json_body(request).get("stream") is True
    except HttpError:
        return False


# -- streams ------------------------------------------------------------------------------------


class Pacing(Protocol):
    """The host's side of a stream: its pace, read before every token, and its counters."""

    chunk_interval: float
    active_streams: int
    chunks_sent: int


@implementer(IPushProducer)
class SSEStream:
    """Writes SSE events one by one, paced by the reactor and paused by backpressure.

    Events marked as paced wait ``chunk_interval`` before being written (that is token
    generation); the others follow at once.  ``done`` fires when the stream ends for any
    reason; cancelling it stops generation.  With ``reset_after``, the connection is aborted
    after that many paced events.
    """

    def __init__(
        self,
        host: Pacing,
        clock: IReactorTime,
        request: Request,
        events: Iterator[tuple[bool, bytes]],
        reset_after: int | None,
    ) -> None:
        self.done: Deferred[None] = Deferred(lambda _: self.stopProducing())
        self._host = host
        self._clock = clock
        self._request = request
        self._events = events
        self._reset_after = reset_after
        self._pending: tuple[bool, bytes] | None = None
        self._waited = False
        self._paused = False
        self._stopped = False
        self._call: IDelayedCall | None = None
        self._sent = 0

    def start(self) -> None:
        self._host.active_streams += 1
        self._request.registerProducer(self, True)
        self._run()

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._call is None and not self._stopped:
            self._run()

    def stopProducing(self) -> None:
        self._end()

    def _end(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._host.active_streams -= 1
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        if not self.done.called:
            self.done.callback(None)

    def _waited_interval(self) -> None:
        self._call = None
        self._waited = True
        self._run()

    def _run(self) -> None:
        self._call = None
        budget = 256  # yield to the reactor now and then when not paced
        while not (self._paused or self._stopped):
            if self._pending is None:
                self._pending = next(self._events, None)
                if self._pending is None:
                    self._request.unregisterProducer()
                    self._request.finish()
                    self._end()
                    return
            paced, data = self._pending
            if paced and not self._waited:
                interval = self._host.chunk_interval
                budget -= 1
                if interval > 0 or budget <= 0:
                    self._call = self._clock.callLater(max(interval, 0.0), self._waited_interval)
                    return
            self._pending, self._waited = None, False
            self._request.write(data)
            if paced:
                self._sent += 1
                self._host.chunks_sent += 1
                if self._reset_after is not None and self._sent >= self._reset_after:
                    # Give the chunks time to leave: an abort drops whatever is still buffered.
                    delay = max(self._host.chunk_interval, 0.02)
                    self._call = self._clock.callLater(delay, self._reset)
                    return

    def _reset(self) -> None:
        self._call = None
        transport(self._request).abortConnection()
        self._end()
