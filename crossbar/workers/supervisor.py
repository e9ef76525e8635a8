"""Several crossbar processes sharing one port (``workers: N`` in crossbar.yaml).

One Python process tops out at one core. With ``workers: N`` the twistd process is
worker 0 and starts N-1 more (``python -m crossbar.workers``); each binds the same
TCP port with ``SO_REUSEPORT``, so the kernel spreads new connections over them,
and each has its own health table. The status page and JSON are those of the worker
that answered (their tables agree within a poll interval).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from twisted.application.service import Service
from twisted.internet import protocol
from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger
from twisted.python.failure import Failure

from crossbar.pages.peers import WorkerInfo

log = Logger()

RESTART_DELAY = 1.0
STOP_GRACE = 10.0


class _Relay(protocol.ProcessProtocol):
    """Passes a worker's output lines to this process's log."""

    def __init__(self, index: int, ended: Deferred[None]) -> None:
        self._index = index
        self._ended = ended
        self._partial = b""

    def outReceived(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line.strip():
                text = line.decode("utf-8", "replace")
                log.info("[worker {index}] {line}", index=self._index, line=text)

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        self._ended.callback(None)


class WorkerProcesses(Service):
    """Starts workers 1..N-1, restarts one that dies, and stops them with crossbar."""

    def __init__(self, reactor: Any, config_path: str, info: WorkerInfo) -> None:
        self._reactor = reactor
        self._config_path = config_path
        self._info = info
        self._processes: dict[int, Any] = {}
        self._ended: dict[int, Deferred[None]] = {}

    def startService(self) -> None:
        super().startService()
        for index in range(1, self._info.count):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        ended: Deferred[None] = Deferred()
        argv = [
            sys.executable,
            "-m",
            "crossbar.workers",
            "--config",
            self._config_path,
            "--index",
            str(index),
            "--count",
            str(self._info.count),
            "--run-dir",
            self._info.run_dir,
        ]
        relay = _Relay(index, ended)
        self._processes[index] = self._reactor.spawnProcess(
            relay, sys.executable, argv, env=dict(os.environ)
        )
        self._ended[index] = ended
        ended.addCallback(self._exited, index)

    def _exited(self, _: object, index: int) -> None:
        self._processes.pop(index, None)
        if self.running:
            log.warn("worker {index} ended; starting it again", index=index)
            self._reactor.callLater(RESTART_DELAY, self._restart, index)

    def _restart(self, index: int) -> None:
        if self.running and index not in self._processes:
            self._spawn(index)

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        waits = []
        for index, process in list(self._processes.items()):
            try:
                process.signalProcess("TERM")
            except Exception:
                continue
            killer = self._reactor.callLater(STOP_GRACE, _kill, process)
            ended = self._ended[index]
            ended.addBoth(_cancel_call, killer)
            waits.append(ended)
        return DeferredList(waits, consumeErrors=True)


def _cancel_call(result: object, call: Any) -> object:
    if call.active():
        call.cancel()
    return result


def _kill(process: Any) -> None:
    with contextlib.suppress(Exception):
        process.signalProcess("KILL")
