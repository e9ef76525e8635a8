"""Every private attribute of Twisted that crossbar uses, and nowhere else.

Twisted does not promise these; each was read in Twisted 26.4 through 26.10 (the
range ``setup.cfg`` allows) and ``tests/unit/test_twisted.py`` fails loudly, naming
the attribute, if a release renames or drops one. Before widening the range, read
each use below against the new release's source.

- ``tcp.Connection._tempDataLen``, ``._writeDisconnected``, ``._aborting``: whether a
  socket has nothing queued and is still open for writing (:func:`write_now`);
- ``HTTPChannel._command``, ``._path``, ``._version``: the request line of a request
  refused before twisted.web made a ``Request`` of it (for its log line), and its HTTP
  version (the door's hygiene rules);
- ``HTTPChannel._handlingRequest``: whether a request is being answered (the header
  deadline starts only between requests);
- ``HTTPChannel._respondToBadRequestAndDisconnect``: where twisted.web's parser refuses a
  head or a chunk (:class:`ParserRefusals` answers those in crossbar's words);
- ``HTTPConnectionPool._factory`` and ``twisted.web.client._HTTP11ClientFactory``: a
  pool that does not log two lines for every connection the poller opens;
- ``twisted.scripts._twistd_unix.UnixAppLogger._getLogObserver``: the log observer twistd
  makes from its options (``--logfile``, ``--syslog``, ``-n``), so that crossbar can filter
  what reaches it without taking those options over;
- ``EPollReactor._poller``, ``._selectables``, ``._doReadOrWrite``: the epoll reactor's
  loop, run without a log context around each event (:func:`dispatch_plainly`).
"""

from __future__ import annotations

import gc
import socket
from collections.abc import Mapping
from types import MethodType
from typing import Any

from twisted.internet import tcp
from twisted.logger import ILogObserver, LegacyLogObserverWrapper
from twisted.python import log
from twisted.web import http
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

TESTED_TWISTED = ">=26.4,<27"
"""The Twisted releases this module was checked against (as in setup.cfg)."""


# -- sockets: write at once when nothing is queued ------------------------------------------


def direct(transport: object) -> tcp.Connection | None:
    """The plain TCP connection under ``transport``, if it is one (TLS is left alone)."""
    if isinstance(transport, tcp.Connection) and not transport.TLS:
        return transport
    return None


def write_now(connection: tcp.Connection | None, transport: Any, data: bytes) -> None:
    """Write ``data`` to ``transport``, sending what the socket takes right away when
    ``connection`` (from :func:`direct`) has nothing queued.

    Twisted queues every ``write()`` until the next reactor turn and registers the
    socket for writing in between: two ``epoll_ctl`` calls and a wake-up per write, a
    sixth of crossbar's CPU for a streamed chunk. With an empty queue, sending now is
    what the reactor would do next anyway; whatever the socket does not take (and any
    error) goes to the transport as usual, so ordering, backpressure and error handling
    stay Twisted's. Nothing is sent this way after ``abortConnection`` or over TLS.
    """
    if (
        connection is not None
        and not connection.dataBuffer
        and not connection._tempDataLen
        and connection.connected
        and not connection.disconnecting
        and not connection._writeDisconnected
        and not connection._aborting
        and not connection.TLS
    ):
        limit = connection.SEND_LIMIT  # as Twisted sends at most, for the same backpressure
        try:
            sent = connection.socket.send(data if len(data) <= limit else memoryview(data)[:limit])
        except OSError:
            sent = 0  # full (EAGAIN) or broken: the transport queues it, or finds the error
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)


def bytes_waiting(connection: tcp.Connection | None) -> bool:
    """Whether the peer of a just accepted ``connection`` (from :func:`direct`) has sent
    bytes not read yet: its first request is on its way. Twisted accepts up to a hundred
    connections in one go before it reads any of them."""
    if connection is None:
        return False
    try:
        return bool(connection.socket.recv(1, socket.MSG_PEEK))
    except OSError:  # nothing yet (EAGAIN), or gone: connectionLost follows
        return False


# -- twisted.web's server side --------------------------------------------------------------


def request_line(channel: http.HTTPChannel) -> tuple[bytes, bytes]:
    """Method and target of the request the channel is reading (``b"-"`` when unknown)."""
    return getattr(channel, "_command", None) or b"-", getattr(channel, "_path", None) or b"-"


def request_version(channel: http.HTTPChannel) -> bytes:
    """The HTTP version of the request the channel is reading (``b"HTTP/1.1"``): a
    request's own ``clientproto`` is set only once its body is in."""
    version: bytes = getattr(channel, "_version", None) or b"-"
    return version


def handling_request(channel: http.HTTPChannel) -> bool:
    """Whether the channel is answering a request (pipelined bytes wait meanwhile)."""
    return bool(channel._handlingRequest)


class ParserRefusals(http.HTTPChannel):
    """An HTTP channel whose parser's own refusals (conflicting lengths, a bad header
    line, a bad chunk, too many headers, a line too long) go to :meth:`bad_request`
    instead of twisted.web's bare ``400 Bad Request`` and close."""

    def _respondToBadRequestAndDisconnect(self) -> None:
        self.bad_request()

    def lineLengthExceeded(self, line: bytes) -> None:
        """A head line longer than ``MAX_LENGTH`` (16 KiB): LineReceiver would close the
        connection without a word."""
        self.bad_request(too_large=True)

    def bad_request(self, too_large: bool = False) -> None:
        super()._respondToBadRequestAndDisconnect()  # type: ignore[misc]


# -- the poller's Agent ---------------------------------------------------------------------


class _QuietClientFactory(_HTTP11ClientFactory):
    noisy = False


class QuietPool(HTTPConnectionPool):
    """A pool that does not log two lines for every upstream connection."""

    _factory = _QuietClientFactory


# -- twistd's log ---------------------------------------------------------------------------


def twistd_log_observer(options: Mapping[str, Any]) -> ILogObserver:
    """The observer twistd would log to, given twistd's own options."""
    from twisted.scripts._twistd_unix import UnixAppLogger

    observer: Any = UnixAppLogger(options)._getLogObserver()
    if ILogObserver.providedBy(observer):
        return observer  # type: ignore[no-any-return]
    return LegacyLogObserverWrapper(observer)  # syslog's is an old-style observer


# -- the reactor's loop ---------------------------------------------------------------------


def _do_poll(self: Any, timeout: float | None) -> None:
    """``EPollReactor.doPoll``, less ``log.callWithLogger`` around each event: that asks
    the selectable for its ``logPrefix()`` and copies the log context, for every read and
    write, so that a legacy ``log.msg`` line could name its connection (crossbar's own
    lines do not use it). An error that escapes is still logged, naming the connection."""
    if timeout is None:
        timeout = -1
    try:
        events = self._poller.poll(timeout, len(self._selectables))
    except InterruptedError:
        return
    selectables = self._selectables
    handle = self._doReadOrWrite
    for fd, event in events:
        selectable = selectables.get(fd)
        if selectable is None:
            continue
        try:
            handle(selectable, fd, event)
        except KeyboardInterrupt:
            raise
        except BaseException:
            log.err(system=_prefix(selectable))


def _prefix(selectable: Any) -> str:
    try:
        return str(selectable.logPrefix())
    except Exception:
        return "(buggy logPrefix method)"


def run_lean(reactor: Any) -> None:
    """How crossbar's own processes run their reactor (twistd's, and each worker's): the
    loop of :func:`dispatch_plainly`, and the heap made during start-up frozen out of the
    garbage collector's full passes once the reactor runs, before any request. Those
    objects (modules, the config, the app) live as long as the process anyway; without
    this every full pass walked all of them again, a sixteenth of crossbar's CPU under
    load (``benchmarks/run.py --probe``: 0.55 s of 8 s, 0.23 s with it)."""
    dispatch_plainly(reactor)
    reactor.callWhenRunning(gc.freeze)


def dispatch_plainly(reactor: object) -> bool:
    """Run ``reactor``'s loop with :func:`_do_poll` when it is Twisted's epoll reactor
    as this module knows it (about 3% of a streamed chunk's CPU, measured); anything
    else is left alone. Whether it was done."""
    try:
        from twisted.internet.epollreactor import EPollReactor
    except ImportError:  # no epoll: not Linux
        return False
    if not isinstance(reactor, EPollReactor) or type(reactor).doIteration is not (
        EPollReactor.doPoll
    ):
        return False
    reactor.doIteration = MethodType(_do_poll, reactor)  # type: ignore[method-assign]
    return True
