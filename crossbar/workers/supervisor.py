"""Several crossbar processes sharing one port (``workers: N`` in crossbar.yaml).

One Python process tops out at one core. With ``workers: N`` the twistd process is
worker 0 and starts N-1 more (``python -m crossbar.workers``); each binds the same
TCP port with ``SO_REUSEPORT``, so the kernel spreads new connections over them,
and each has its own health table. The status page and JSON are those of the worker
that answered (their tables agree within a poll interval).

Twisted's ``ProcessMonitor`` runs the children: it restarts one that ends, logs
their output lines, and stops them with SIGTERM, then SIGKILL. Around it this module
adds what it lacks: a line saying which worker ended and how, output lines that
are neither blank nor too long for its line reader, and a stop that waits until
every child has exited.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import (
    IDelayedCall,
    IProcessProtocol,
    IProcessTransport,
    IReactorProcess,
    IReactorTime,
)
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.runner.procmon import ProcessMonitor
from zope.interface import implementer

from crossbar.pages import WorkerInfo

log = Logger()

THRESHOLD = 30
"""A worker that ran this long (seconds) had started fine: it is restarted at once,
and its back-off starts again from ``MIN_RESTART_DELAY``. ProcessMonitor's 1 s is
shorter than a worker's start (imports, config): one failing while it starts would
be restarted at once, forever."""
MIN_RESTART_DELAY = 1
MAX_RESTART_DELAY = 60
"""A worker that dies sooner waits 1, 2, 4, ... up to 60 s before its next start, so
a worker that cannot start costs a start and a log line a minute, not every second."""
STOP_MARGIN = 5
"""Seconds past a worker's ``drain_timeout`` before SIGKILL on stop: a worker drains for
up to ``drain_timeout`` after SIGTERM, then closes its pools and exits."""
STOP_GRACE = 30 + STOP_MARGIN
"""Seconds between SIGTERM and SIGKILL with the default ``drain_timeout`` (30 s)."""
LINE_LIMIT = 8192
"""Longer output lines are cut in pieces: ProcessMonitor's line reader (16 KiB at most)
would otherwise fail and close the child's stdout."""


class WorkerProcesses(Service):
    """Starts workers 1..N-1, restarts one that dies, and stops them with crossbar.

    ``stopService`` returns a Deferred that fires once every child has exited, so
    twistd does not exit (and remove the run directory) under a running worker.
    """

    def __init__(
        self,
        reactor: Any,
        config_path: str,
        info: WorkerInfo,
        drain_timeout: float = STOP_GRACE - STOP_MARGIN,
    ) -> None:
        self._reactor = reactor
        self._spawner = _Spawner(reactor, self._ended)
        self.monitor = _Monitor(self._spawner)
        self.monitor.killTime = math.ceil(drain_timeout) + STOP_MARGIN
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for index in range(1, info.count):
            self.monitor.addProcess(
                worker_name(index), worker_argv(config_path, info, index), env=env
            )

    def startService(self) -> None:
        super().startService()
        self.monitor.startService()

    def stopService(self) -> Deferred[None]:
        super().stopService()
        self.monitor.stopService()
        return self._spawner.all_ended()

    def reload(self) -> None:
        """Ask every running worker to reload its config (SIGHUP), as worker 0 just did."""
        for protocol in self.monitor.protocols.values():
            transport = getattr(protocol, "transport", None)
            # One that has just exited is being restarted and reads the new config.
            with suppress(ProcessExitedAlready):
                if transport is not None:
                    transport.signalProcess("HUP")
        others = len(self.monitor.protocols)
        log.info(
            "reload: asked {others}",
            others=f"the {others} other workers" if others > 1 else "the other worker",
        )

    def _ended(self, name: str, reason: Failure) -> None:
        """One line per end, in words; the back-off bounds how often it comes."""
        how = describe_end(reason)
        restart = self.monitor.restart.get(name)
        if not self.running or restart is None or not restart.active():
            log.info("{name} {how}", name=name, how=how)
            return
        # Whole seconds (1, 2, 4 ...), less the moments since it was scheduled.
        delay = round(restart.getTime() - self._reactor.seconds(), 1)
        when = f"in {delay:g}s" if delay > 0 else "now"
        log.warn("{name} {how}; starting it again {when}", name=name, how=how, when=when)


def worker_name(index: int) -> str:
    """The name in the log lines about a worker and in front of each line it prints."""
    return f"worker-{index}"


def worker_argv(config_path: str, info: WorkerInfo, index: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "crossbar.workers",
        "--config",
        config_path,
        "--index",
        str(index),
        "--count",
        str(info.count),
        "--run-dir",
        info.run_dir,
    ]


def describe_end(reason: Failure) -> str:
    """How a process ended, e.g. ``exited with code 1`` or ``was killed by SIGKILL``."""
    value = reason.value
    if isinstance(value, ProcessDone | ProcessTerminated):
        if value.signal is not None:
            try:
                name = signal.Signals(value.signal).name
            except ValueError:
                name = f"signal {value.signal}"
            return f"was killed by {name}"
        return f"exited with code {value.exitCode}"
    return f"ended: {value}"


class _OutputLog(Logger):
    """ProcessMonitor's logger, without blank output lines, and with a worker's JSON
    lines (``log_format: json``) handed on as the objects they are.

    Its output relay also ends each stream with a blank line when the child exits
    (it tests ``bytes[-1] == b"\\n"``, which is never true), so blank lines are dropped.
    """

    def emit(self, level: LogLevel, format: str | None = None, **kwargs: object) -> None:
        if "stream" in kwargs and not str(kwargs.get("line", "")).strip():
            return
        relayed = _json_object(kwargs.get("line"))
        if relayed is not None:  # a worker's JSON line (log_format: json): kept whole
            kwargs["worker_json"] = relayed | {"worker": kwargs.get("tag")}
            with suppress(KeyError, TypeError):
                level = LogLevel.levelWithName(str(relayed.get("level")))
        super().emit(level, format, **kwargs)


def _json_object(line: object) -> dict[str, object] | None:
    """A worker's output line that is one JSON object with an ``event``, else ``None``."""
    if not isinstance(line, str) or not line.startswith("{"):
        return None
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and "event" in parsed else None


class _Monitor(ProcessMonitor):
    """ProcessMonitor with crossbar's timings (see the constants above)."""

    threshold = THRESHOLD
    minRestartDelay = MIN_RESTART_DELAY
    maxRestartDelay = MAX_RESTART_DELAY

    def __init__(self, reactor: IReactorProcess) -> None:
        super().__init__(reactor)
        # "[worker-1] line" in crossbar's namespace, not in twisted.runner's.
        self.log = _OutputLog("crossbar.workers", source=self)


@implementer(IReactorProcess, IReactorTime)
class _Spawner:
    """The reactor as the ProcessMonitor sees it: it knows which children are running.

    ProcessMonitor only spawns through its reactor, so this is where each child's
    end can be seen without touching its private methods.
    """

    def __init__(self, reactor: Any, ended: Callable[[str, Failure], None]) -> None:
        self._reactor = reactor
        self._ended = ended
        self._running: set[str] = set()
        self._waiting: list[Deferred[None]] = []

    def all_ended(self) -> Deferred[None]:
        """Fires once no child is running (at once if none is)."""
        d: Deferred[None] = Deferred()
        self._waiting.append(d)
        self._check()
        return d

    def spawnProcess(
        self,
        processProtocol: IProcessProtocol,
        executable: bytes | str,
        args: Sequence[bytes | str],
        env: Any = None,
        path: bytes | str | None = None,
        uid: int | None = None,
        gid: int | None = None,
        usePTY: bool = False,
        childFDs: Any = None,
    ) -> IProcessTransport:
        name = str(getattr(processProtocol, "name", executable))
        watched = _Watched(processProtocol, lambda reason: self._process_ended(name, reason))
        process: IProcessTransport = self._reactor.spawnProcess(
            watched, executable, args, env, path, uid, gid, usePTY, childFDs
        )
        self._running.add(name)
        return process

    def _process_ended(self, name: str, reason: Failure) -> None:
        self._running.discard(name)
        self._ended(name, reason)
        self._check()

    def _check(self) -> None:
        if not self._running:
            waiting, self._waiting = self._waiting, []
            for d in waiting:
                d.callback(None)

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> IDelayedCall:
        call: IDelayedCall = self._reactor.callLater(delay, callable, *args, **kw)
        return call

    def seconds(self) -> float:
        return float(self._reactor.seconds())

    def getDelayedCalls(self) -> Sequence[IDelayedCall]:
        calls: Sequence[IDelayedCall] = self._reactor.getDelayedCalls()
        return calls


@implementer(IProcessProtocol)
class _Watched:
    """Passes everything to ProcessMonitor's protocol, with long lines cut, and then
    reports the end (after ProcessMonitor has scheduled the restart)."""

    def __init__(self, inner: IProcessProtocol, ended: Callable[[Failure], None]) -> None:
        self._inner = inner
        self._ended = ended
        self._line_length: dict[int, int] = {}

    def makeConnection(self, process: IProcessTransport) -> None:
        self._inner.makeConnection(process)

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self._inner.childDataReceived(childFD, self._cut(childFD, data))

    def _cut(self, fd: int, data: bytes) -> bytes:
        """``data`` with a newline wherever a line would pass ``LINE_LIMIT`` bytes."""
        length = self._line_length.get(fd, 0)
        pieces: list[bytes] = []
        for i, part in enumerate(data.split(b"\n")):
            if i:
                pieces.append(b"\n")
                length = 0
            while length + len(part) > LINE_LIMIT:
                room = LINE_LIMIT - length
                pieces += [part[:room], b"\n"]
                part, length = part[room:], 0
            pieces.append(part)
            length += len(part)
        self._line_length[fd] = length
        return b"".join(pieces)

    def childConnectionLost(self, childFD: int) -> None:
        self._inner.childConnectionLost(childFD)

    def processExited(self, reason: Failure) -> None:
        self._inner.processExited(reason)

    def processEnded(self, reason: Failure) -> None:
        try:
            self._inner.processEnded(reason)
        finally:
            self._ended(reason)
