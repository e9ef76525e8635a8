"""Reading a host's model list without holding the reactor.

A lab's list is tens of KiB, read in place in about a millisecond. But a router may list
half a million models within the 8 MiB a poll accepts, and msgspec takes 0.1 to 0.2 s of
a core to read those: every request would wait that long. A thread would not help, since
msgspec holds the GIL while it decodes. So a list longer than :data:`INLINE_BYTES` is
read by a child Python process (:mod:`crossbar.polling.listprocess`): the reactor only writes
the bytes to a pipe and reads back at most ``MAX_MODELS`` ids. The poller reads one list
at a time per host, and a changed long list at most once a minute, so children are few.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ProcessDone, ProcessExitedAlready
from twisted.internet.interfaces import IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

import crossbar
from crossbar.polling.modellist import ModelList, read_models

INLINE_BYTES = 256 * 1024
"""Longest list read on the reactor's thread: about 2 ms, the cost of a small request."""
CHILD_SECONDS = 30.0
"""Longest a child may take; 8 MiB takes it well under a second on a slow core."""
MAX_ANSWER = 4 * 1024 * 1024
"""Most a child may say: 2,000 ids of 256 bytes, each escaped at worst, fit well within."""
_ROOT = str(Path(crossbar.__file__).resolve().parent.parent)
"""Where this crossbar's package is, so that the child reads lists with the same code."""


class ListUnread(Exception):
    """A long list could not be read aside (the child failed, took too long, or could
    not start); its text says why, in words."""


class _Answer(msgspec.Struct):
    """What a child says: the list as crossbar keeps it, or why the answer is no list."""

    models: ModelList | None = None
    error: str = ""


_ANSWER = msgspec.json.Decoder(_Answer)


class ListReader:
    """Reads a model list answer: in place when short, in a child process when long."""

    def __init__(
        self,
        reactor: IReactorProcess,
        clock: IReactorTime,
        *,
        inline_bytes: int = INLINE_BYTES,
        timeout: float = CHILD_SECONDS,
        command: Sequence[str] = (sys.executable, "-m", "crossbar.polling.listprocess"),
    ) -> None:
        self._reactor = reactor
        self._clock = clock
        self.inline_bytes = inline_bytes
        self.timeout = timeout
        self._command = list(command)

    async def read(self, body: bytes) -> ModelList:
        """What crossbar keeps of ``body`` (:func:`~crossbar.polling.modellist.read_models`);
        ``ValueError`` when it is not a model list, :class:`ListUnread` when a long one
        could not be read."""
        if len(body) <= self.inline_bytes:
            return read_models(body)
        child = _Child(body)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
        try:
            self._reactor.spawnProcess(child, self._command[0], self._command, env=env)
        except OSError as e:
            raise ListUnread(f"could not start a reader: {e.strerror or e}") from None
        late = self._clock.callLater(self.timeout, child.stop, f"took over {self.timeout:g} s")
        try:
            out = await child.ended
        except CancelledError:
            child.stop("cancelled")
            raise
        finally:
            if late.active():
                late.cancel()
        try:
            answer = _ANSWER.decode(out)
        except msgspec.DecodeError:
            raise ListUnread(child.why or "the reader stopped without an answer") from None
        if answer.models is None:
            raise ValueError(answer.error or "no list")
        return answer.models


class _Child(ProcessProtocol):
    """One child: the list written to it, its answer kept up to :data:`MAX_ANSWER`."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._out = bytearray()
        self.why = ""
        """Why the child was stopped, if it was."""
        self.ended: Deferred[bytes] = Deferred()
        """Its whole output, once it has closed it (its exit is not waited for)."""

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self._body)
        self.transport.closeStdin()
        self._body = b""

    def outReceived(self, data: bytes) -> None:
        if len(self._out) + len(data) > MAX_ANSWER:
            self.stop(f"said over {MAX_ANSWER >> 20} MiB")
        elif not self.why:
            self._out += data

    def errReceived(self, data: bytes) -> None:
        """A crash's traceback: never shown (it may quote the list); its absence of an
        answer says enough."""

    def outConnectionLost(self) -> None:
        self._end()

    def processEnded(self, reason: Failure) -> None:
        if not reason.check(ProcessDone) and not self.why:
            self.why = "the reader failed"
        self._end()

    def stop(self, why: str) -> None:
        """Kill the child (if it still runs) and end with nothing read."""
        self.why = self.why or why
        self._out.clear()
        if self.transport is not None:
            with contextlib.suppress(ProcessExitedAlready, OSError):
                self.transport.signalProcess("KILL")
        self._end()

    def _end(self) -> None:
        if not self.ended.called:
            self.ended.callback(b"" if self.why else bytes(self._out))
