"""Listening: a service that opens crossbar's port (or fails start-up loudly), and
an endpoint for a port several worker processes share (``SO_REUSEPORT``)."""

from __future__ import annotations

import socket
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocolFactory,
    IStreamServerEndpoint,
)
from twisted.logger import ILogFilterPredicate, LogEvent, PredicateResult
from twisted.python.failure import Failure
from zope.interface import implementer

from crossbar.config import tcp_address

INTERNAL_LISTENER = "crossbar internal listener"
"""The log prefix of ports only crossbar itself uses (a worker's metrics port, the demo's
simulated hosts). Twisted logs "<prefix> starting on <port>" for every port it opens;
:func:`not_an_internal_start` keeps those lines out of crossbar's log."""


@implementer(ILogFilterPredicate)
class _NotAnInternalStart:
    """A log filter: drop the "starting on" line of an internal port, keep all else.
    On every log line's path, so it only looks at what such a line carries."""

    def __call__(self, event: LogEvent) -> Any:
        message = event.get("message")
        if message and isinstance(message[0], str) and message[0].startswith(INTERNAL_LISTENER):
            return PredicateResult.no
        return PredicateResult.maybe


not_an_internal_start = _NotAnInternalStart()


class CannotListen(Exception):
    """A port that cannot be opened; ``str()`` is the one line an admin reads."""


class Listener(Service):
    """Listens on an endpoint; ``listening`` fires with the port once it is open.

    A port that cannot be opened (in use, no permission) is raised from
    ``startService`` as :class:`CannotListen`, so that twistd stops instead of running
    deaf; ``name`` is how the message names the endpoint.
    """

    def __init__(
        self, endpoint: IStreamServerEndpoint, factory: IProtocolFactory, name: str = ""
    ) -> None:
        self._endpoint = endpoint
        self._factory = factory
        self._name = name or "the endpoint"
        self.port: IListeningPort | None = None
        self.listening: Deferred[IListeningPort] = Deferred()

    def startService(self) -> None:
        super().startService()
        d = self._endpoint.listen(self._factory)
        failures: list[Failure] = []
        d.addCallbacks(self._listened, failures.append)
        if failures:
            self.running = False
            reason = failures[0].value or RuntimeError("no reason given")
            raise CannotListen(f"cannot listen on {self._name}: {_words(reason)}") from reason

    def _listened(self, port: IListeningPort) -> None:
        self.port = port
        self.listening.callback(port)

    def stopService(self) -> Deferred[Any] | None:
        super().stopService()
        return self.close()

    def close(self) -> Deferred[None] | None:
        """Stop accepting connections (those open stay); idempotent.

        The connections the kernel has queued on the port are accepted first: closed
        with the port they would be reset, and when another crossbar shares the port
        (``listen_reuse_port``) their clients could have been served by either.
        """
        port, self.port = self.port, None
        if port is None:
            return None
        accept = getattr(port, "doRead", None)  # a TCP port (twisted.internet.tcp.Port)
        if accept is not None:
            for _ in range(4):
                accept()  # up to its numberAccepts each time; at once when none is queued
        return port.stopListening()


@implementer(IStreamServerEndpoint)
class ReusePortEndpoint:
    """Listens on a TCP port that other processes may bind too (``SO_REUSEPORT``)."""

    def __init__(self, reactor: Any, listen: str) -> None:
        self._reactor = reactor
        self._interface, self._port, self._backlog = tcp_address(listen)

    def listen(self, factory: IProtocolFactory) -> Deferred[IListeningPort]:
        family = socket.AF_INET6 if ":" in self._interface else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self._interface, self._port))
            sock.listen(self._backlog)
            sock.setblocking(False)
            port = self._reactor.adoptStreamPort(sock.fileno(), family, factory)
        except OSError as e:
            return fail(e)
        finally:
            sock.close()  # the reactor holds its own copy of the descriptor
        return succeed(port)


def _words(reason: BaseException) -> str:
    """``address already in use``, ``permission denied``: the system's words."""
    cause = getattr(reason, "socketError", None) or reason
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
