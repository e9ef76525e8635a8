"""Writes that go to the socket at once when nothing is queued before them.

Twisted queues every ``write()`` until the next reactor turn and registers the socket
for writing in between: two ``epoll_ctl`` calls and a wake-up for each write. For a
streamed chunk, or a request sent upstream, that was a sixth of crossbar's CPU. When
the socket's queue is empty, sending at once is what the reactor would do next anyway;
whatever the socket does not take (and any error) is handed to the transport as usual,
so ordering, backpressure and error handling stay Twisted's.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp


def direct(transport: object) -> tcp.Connection | None:
    """The plain TCP connection under ``transport``, if it is one (TLS is left alone)."""
    if isinstance(transport, tcp.Connection) and not transport.TLS:
        return transport
    return None


def write_now(connection: tcp.Connection | None, transport: Any, data: bytes) -> None:
    """Write ``data`` to ``transport``, sending what the socket takes right away when
    ``connection`` (from :func:`direct`) has nothing queued."""
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
