"""Short, human words for the ways a request to an upstream host can fail.

They end up in ``last_err``, the status pages and the log, so they must be one
line, say what happened, and never echo a request or response body.
"""

from __future__ import annotations

import os

from twisted.internet import defer, error
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from crossbar.upstream.parsing import BadAnswer


def is_cancellation(reason: BaseException | Failure) -> bool:
    """Whether a failure is only our own cancellation (Agent wraps it in ResponseNeverReceived)."""
    exc = reason.value if isinstance(reason, Failure) else reason
    if isinstance(exc, defer.CancelledError | error.ConnectingCancelledError):
        return True
    if isinstance(exc, ResponseNeverReceived | ResponseFailed):
        return any(is_cancellation(r) for r in exc.reasons)
    return False


def describe(reason: BaseException | Failure) -> str:
    """One line for an exception from connecting to, or talking with, an upstream."""
    exc = reason.value if isinstance(reason, Failure) else reason
    if isinstance(exc, ResponseNeverReceived | ResponseFailed):
        inner = [describe(r) for r in exc.reasons]
        tls = [words for words in inner if words.startswith("TLS: ")]
        if tls and isinstance(exc, ResponseNeverReceived):
            return tls[0]  # the handshake failed: nothing was asked, nothing answered
        if inner and all(isinstance(r.value, BadAnswer) for r in exc.reasons):
            return "; ".join(inner)  # refused by crossbar, whether in the head or the body
        prefix = (
            "closed before answering"
            if isinstance(exc, ResponseNeverReceived)
            else "answer cut off"
        )
        return f"{prefix} ({'; '.join(inner)})" if inner else prefix
    if isinstance(exc, error.ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, error.TimeoutError | defer.TimeoutError | TimeoutError):
        return "timed out"
    if isinstance(exc, error.DNSLookupError):
        return "DNS lookup failed"
    if isinstance(exc, error.ConnectionLost | error.ConnectionDone):
        return "connection lost"
    if isinstance(exc, error.ConnectError):
        return f"cannot connect: {_words(exc.osError) or _first_line(exc) or 'no reason given'}"
    if isinstance(exc, BadAnswer):
        return f"bad answer: {exc}"
    if exc is not None and type(exc).__module__.startswith("OpenSSL"):
        return f"TLS: {_tls_reason(exc)}"
    if exc is not None and type(exc).__module__.startswith("service_identity"):
        return "TLS: the certificate is for another host name"
    if isinstance(exc, OSError) and exc.errno is not None:
        return _words(exc.errno)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def stop_producing(transport: object) -> None:
    """Close the connection behind a response body's transport (a producer)."""
    if transport is not None:
        IPushProducer(transport).stopProducing()


class Discard(Protocol):
    """Closes the connection of an upstream answer whose body nobody wants."""

    def connectionMade(self) -> None:
        stop_producing(self.transport)


def _words(reason: object) -> str:
    """The system's words for an errno (``101`` -> ``network is unreachable``)."""
    if isinstance(reason, int):
        return os.strerror(reason).lower()
    return str(reason or "").strip().lower()


def _first_line(exc: BaseException) -> str:
    """The first line of what an exception says, without Twisted's generic prefix."""
    lines = str(exc.args[0] if exc.args else exc).strip().splitlines()
    return lines[0].rstrip(".").lower() if lines else ""


def _tls_reason(exc: BaseException) -> str:
    """pyOpenSSL's errors are lists of ``(library, function, reason)``: the last reason
    says it (``certificate verify failed``)."""
    errors = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    reasons = [e[-1] for e in errors if isinstance(e, tuple) and e and e[-1]]
    return str(reasons[-1]).lower() if reasons else "handshake failed"
