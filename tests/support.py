"""Helpers for the fault and soak tests: crossbar in front of simulated hosts on loopback,
log capture, a port that never accepts, and crossbar as a ``twistd`` process."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import treq
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse
from zope.interface import implementer

from crossbar.config import Config, HostConfig, HostSettings, RouteConfig
from crossbar.fleet import HealthTable, HostState
from crossbar.service import Crossbar
from crossbar.testing import SimulatedHost

T = TypeVar("T")

FAST = HostSettings(
    poll_interval=60.0,
    poll_timeout=1.0,
    connect_timeout=1.0,
    header_timeout=2.0,
    idle_timeout=2.0,
)
"""Settings for tests: no poll after the first one unless asked, short timeouts."""


def _reactor() -> Any:
    from twisted.internet import reactor

    return reactor


async def guard(d: Deferred[T], seconds: float, what: str = "answer") -> T:
    """Await ``d``, failing the test (not hanging it) after ``seconds``."""
    d.addTimeout(seconds, _reactor())
    try:
        return await d
    except DeferredTimeout:
        raise AssertionError(f"no {what} within {seconds:g}s") from None


async def eventually(check: Callable[[], bool], seconds: float = 3.0, what: str = "") -> None:
    """Wait until ``check()`` holds, looking every 10 ms; fail after ``seconds``.

    For state that has no event of its own (counters); everything else awaits events.
    """
    reactor = _reactor()
    deadline = reactor.seconds() + seconds
    while not check():
        if reactor.seconds() > deadline:
            raise AssertionError(f"not true within {seconds:g}s: {what or check}")
        await deferLater(reactor, 0.01, lambda: None)


async def turns(n: int = 5) -> None:
    """Let the reactor run a few times (for closes to reach the other side)."""
    for _ in range(n):
        await deferLater(_reactor(), 0.001, lambda: None)


@implementer(ILogObserver)
class LogCapture:
    """Every log event while it is installed, as formatted text."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []
        globalLogPublisher.addObserver(self)

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        globalLogPublisher.removeObserver(self)

    @property
    def lines(self) -> list[str]:
        return [formatEvent(e) or "" for e in self.events]

    def matching(self, *parts: str) -> list[str]:
        """Lines that contain every one of ``parts``."""
        return [line for line in self.lines if all(p in line for p in parts)]


class Blackhole:
    """A loopback port that never accepts: its accept queue is full, so connects hang.

    On Linux a socket that ``listen(0)``s accepts one connection into its queue
    (plus one being completed); the kernel then drops further SYNs, and a new
    connect neither succeeds nor is refused until its own timeout.
    """

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(0)
        self.port: int = self.sock.getsockname()[1]
        self._fillers: list[socket.socket] = []
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self._fillers.append(filler)
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hangs(self, seconds: float = 0.2) -> bool:
        """Whether a new connect really hangs (blocks for ``seconds``)."""
        probe = socket.socket()
        probe.settimeout(seconds)
        try:
            probe.connect(("127.0.0.1", self.port))
        except TimeoutError:
            return True
        except OSError:
            return False
        finally:
            self._fillers.append(probe)
        return False

    def close(self) -> None:
        for s in [*self._fillers, self.sock]:
            s.close()


class Reader(Protocol):
    """Reads an answer's body as it streams; can hang up like a client that goes away."""

    def __init__(self) -> None:
        self.data = b""
        self.reason: Failure | None = None
        self.ended: Deferred[None] = Deferred()
        self._waiting: list[tuple[int, Deferred[bytes]]] = []

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        ready = [(n, d) for n, d in self._waiting if len(self.data) >= n]
        self._waiting = [(n, d) for n, d in self._waiting if len(self.data) < n]
        for _, d in ready:
            d.callback(self.data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        self.reason = reason
        for _, d in self._waiting:
            d.errback(reason)
        self._waiting = []
        self.ended.callback(None)

    def bytes(self, n: int = 1) -> Deferred[bytes]:
        """Fires once at least ``n`` bytes have arrived."""
        d: Deferred[bytes] = Deferred()
        if len(self.data) >= n:
            d.callback(self.data)
        else:
            self._waiting.append((n, d))
        return d

    async def end(self, seconds: float = 5.0) -> Failure:
        """Wait for the end of the body; why it ended."""
        await guard(self.ended, seconds, "end of the answer")
        assert self.reason is not None
        return self.reason

    def hang_up(self) -> None:
        transport: Any = self.transport
        transport.stopProducing()


def broken(reason: Failure) -> bool:
    """A body that did not end cleanly: the client can tell the stream is incomplete."""
    return not reason.check(ResponseDone) and not reason.check(PotentialDataLoss)


@attrs.define
class Rig:
    """An in-process crossbar, its simulated hosts and an HTTP client."""

    crossbar: Crossbar
    sims: dict[str, SimulatedHost]
    client: HTTPClient
    pool: HTTPConnectionPool
    logs: LogCapture

    @property
    def port(self) -> int:
        port = self.crossbar.listener.port
        assert port is not None
        address: Any = port.getHost()
        return int(address.port)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self, name: str) -> HostState:
        state = self.crossbar.table.get(name)
        assert state is not None
        return state

    def completions(self, name: str) -> list[bytes]:
        """Bodies of the completion requests the simulated host received."""
        return [r.body for r in self.sims[name].requests if r.path.endswith("/completions")]

    async def post(
        self, path: str, body: bytes | dict[str, Any], timeout: float = 10.0
    ) -> tuple[IResponse, bytes]:
        """POST and read the whole answer; the test fails if that takes over ``timeout``."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await guard(self._whole(self.client.post(self.base + path, data=data)), timeout)

    async def get(self, path: str, timeout: float = 10.0) -> tuple[IResponse, bytes]:
        return await guard(self._whole(self.client.get(self.base + path)), timeout)

    def _whole(self, request: Deferred[Any]) -> Deferred[tuple[IResponse, bytes]]:
        async def read() -> tuple[IResponse, bytes]:
            response = await request
            return response, await treq.content(response)

        return Deferred.fromCoroutine(read())

    async def stream(
        self, path: str, body: dict[str, Any], timeout: float = 10.0
    ) -> tuple[IResponse, Reader]:
        """POST and return once the status line is in; the body is read as it comes."""
        data = json.dumps(body).encode()
        request = self.client.post(self.base + path, data=data, unbuffered=True)
        response = await guard(request, timeout, "answer")
        reader = Reader()
        response.deliverBody(reader)
        return response, reader


def header(response: IResponse, name: str) -> str | None:
    values = response.headers.getRawHeaders(name.encode())
    return values[0].decode() if values else None


async def wait_state(rig: Rig, name: str, healthy: bool, seconds: float = 5.0) -> None:
    """Wait for the health table's change event that makes ``name`` (un)healthy."""
    table = rig.crossbar.table
    d: Deferred[None] = Deferred()

    def check(*_: object) -> None:
        state = table.get(name)
        if state is not None and state.healthy == healthy and not d.called:
            d.callback(None)

    table.on_change(check)
    check()
    await guard(d, seconds, f"{name} {'up' if healthy else 'down'}")


RigMaker = Callable[..., Awaitable[Rig]]


async def all_polled(table: HealthTable, seconds: float = 10.0) -> None:
    """Wait (on events, not time) until every host's first poll has ended."""
    done: Deferred[None] = Deferred()

    def check(*_: HostState) -> None:
        if all(s.state != "unknown" for s in table.snapshot().values()) and not done.called:
            done.callback(None)

    table.on_change(check)
    check()
    await guard(done, seconds, "every host's first poll")


def fast(**changes: Any) -> HostSettings:
    """:data:`FAST` with some settings changed."""
    return attrs.evolve(FAST, **changes)


@contextlib.asynccontextmanager
async def rigs() -> AsyncIterator[RigMaker]:
    """Builds rigs with :func:`build`, and tears every one down at the end."""
    made: list[Rig] = []

    async def make(*args: Any, **kwargs: Any) -> Rig:
        rig = await build(*args, **kwargs)
        made.append(rig)
        return rig

    try:
        yield make
    finally:
        for rig in made:
            await teardown(rig)


async def build(
    hosts: Mapping[str, SimulatedHost | str],
    routes: Mapping[str, RouteConfig] | None = None,
    defaults: HostSettings = FAST,
    settings: Mapping[str, HostSettings] | None = None,
    up: Collection[str] | None = None,
) -> Rig:
    """Start simulators, then crossbar in front of them; wait until the hosts in ``up``
    (every simulator by default) are healthy.

    ``hosts`` maps names to simulators (started here) or to plain URLs; the route
    ``lab`` over every host, default model ``tiny-a``, is made when none are given.
    """
    reactor = _reactor()
    sims = {n: h for n, h in hosts.items() if isinstance(h, SimulatedHost)}
    for sim in sims.values():
        await sim.listen(0, "127.0.0.1")
    urls = {n: h.url if isinstance(h, SimulatedHost) else h for n, h in hosts.items()}
    if routes is None:
        routes = {"lab": RouteConfig("lab", tuple(hosts), "tiny-a")}
    config = Config(
        listen="tcp:0:interface=127.0.0.1",
        defaults=defaults,
        hosts={n: HostConfig(n, u, (settings or {}).get(n)) for n, u in urls.items()},
        routes=routes,
    )
    logs = LogCapture()
    crossbar = Crossbar(config, reactor)
    crossbar.startService()
    pool = HTTPConnectionPool(reactor, persistent=False)
    rig = Rig(crossbar, sims, HTTPClient(Agent(reactor, pool=pool)), pool, logs)
    try:
        for name in sims if up is None else up:
            await wait_state(rig, name, healthy=True, seconds=10)
    except BaseException:
        await teardown(rig)
        raise
    return rig


async def teardown(rig: Rig) -> None:
    """Stop the simulators first (breaking any stream still open), then crossbar."""
    for sim in rig.sims.values():
        await sim.stop()
    await rig.crossbar.stopService()
    rig.logs.close()
    await turns()


# -- crossbar as a separate process -----------------------------------------------------------

TWISTD = str(Path(sys.executable).with_name("twistd"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB (Linux ``/proc``)."""
    figures = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            figures[key] = int(value.split()[0])
    return figures


@attrs.define
class Daemon:
    """``twistd -n crossbar`` running from a config file, with its output in a file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def start_daemon(tmp: Path, yaml: str) -> Daemon:
    """Start crossbar with ``yaml`` (without ``listen``, which is added) and wait for its port."""
    port = free_port()
    (tmp / "crossbar.yaml").write_text(f'listen: "tcp:{port}:interface=127.0.0.1"\n{yaml}')
    log = tmp / "crossbar.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [TWISTD, "-n", "--pidfile=", "crossbar", "-c", "crossbar.yaml"],
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(proc, port, log)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"twistd exited early:\n{daemon.output()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return daemon
        except OSError:
            if time.monotonic() > deadline:
                daemon.stop()
                raise AssertionError("crossbar did not start listening") from None
            time.sleep(0.05)


def raw_request(port: int, path: str, body: bytes, extra: bytes = b"") -> bytes:
    """The bytes of a POST request, written by hand."""
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), port, len(body), extra, body)
    )
