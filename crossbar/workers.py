"""Several crossbar processes sharing one port (``workers: N`` in crossbar.yaml).

One Python process tops out at one core. With ``workers: N`` the twistd process is
worker 0 and starts N-1 more (``python -m crossbar.workers``); each binds the same
TCP port with ``SO_REUSEPORT``, so the kernel spreads new connections over them,
and each has its own health table. Every worker also listens on a private loopback
port, written to a run folder, so that ``/_crossbar/metrics`` on any worker can
gather every worker's figures, labelled ``worker``. The status page and JSON are
those of the worker that answered (their tables agree within a poll interval).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from twisted.application.service import Service
from twisted.internet import protocol
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IStreamServerEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from crossbar.config import tcp_address

log = Logger()

RESTART_DELAY = 1.0
STOP_GRACE = 10.0


@attrs.frozen
class WorkerInfo:
    index: int
    count: int
    run_dir: str

    def port_file(self, index: int) -> Path:
        return Path(self.run_dir) / f"worker-{index}.port"


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
            return Deferred.fromCoroutine(_fail(e))
        finally:
            sock.close()  # the reactor holds its own copy of the descriptor
        return succeed(port)


async def _fail(e: Exception) -> IListeningPort:
    raise e


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


def peer_ports(info: WorkerInfo) -> Mapping[int, int]:
    """The private ports of the other workers that have written theirs."""
    ports = {}
    for index in range(info.count):
        if index == info.index:
            continue
        try:
            ports[index] = int(info.port_file(index).read_text())
        except (OSError, ValueError):
            continue
    return ports


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - runs in a child
    """Run one extra worker until SIGTERM, or until the twistd process is gone."""
    import argparse

    from twisted.internet import reactor, task
    from twisted.logger import ILogObserver, formatEvent, globalLogBeginner

    from crossbar.config import ConfigError, load_config
    from crossbar.service import Crossbar

    parser = argparse.ArgumentParser(prog="python -m crossbar.workers")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        text = formatEvent(event)
        if text and not event.get("log_namespace", "").startswith("twisted"):
            print(text, flush=True)

    globalLogBeginner.beginLoggingTo([observe], redirectStandardIO=False)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"crossbar: {e}", flush=True)
        raise SystemExit(2) from None
    info = WorkerInfo(args.index, args.count, args.run_dir)
    crossbar = Crossbar(config, reactor, worker=info)
    parent = os.getppid()

    def orphaned() -> None:
        if os.getppid() != parent:
            reactor.stop()  # type: ignore[attr-defined]

    watch = task.LoopingCall(orphaned)
    reactor.callWhenRunning(crossbar.startService)  # type: ignore[attr-defined]
    reactor.callWhenRunning(watch.start, 1.0, now=False)  # type: ignore[attr-defined]
    reactor.addSystemEventTrigger("before", "shutdown", crossbar.stopService)  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to twistd, which stops us
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
