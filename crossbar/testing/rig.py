"""A crossbar running in-process on a loopback port, in front of simulated hosts.

For testing a program against crossbar (or crossbar itself) without GPUs or subprocesses:
:func:`build` starts :class:`~crossbar.testing.SimulatedHost` s, then a crossbar in front of
them, and waits until they are healthy; the :class:`Rig` it returns has the base URL, an
HTTP client, the captured log and the hosts. Everything runs on the global reactor, so use it
from tests that run on it (pytest-twisted, trial)::

    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost({"tiny-a": "loaded"})})
        response, body = await rig.post("/lab/v1/chat/completions", {"model": "tiny-a"})
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import treq
from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IResponse

from crossbar.config import Config, HostConfig, HostSettings, Reloaded, RouteConfig
from crossbar.polling import HealthTable, HostState
from crossbar.testing.logs import LogCapture
from crossbar.testing.reader import Reader
from crossbar.testing.simulator import SimulatedHost
from crossbar.testing.timeouts import global_reactor, guard, turns

if TYPE_CHECKING:
    from crossbar.service import Crossbar

FAST = HostSettings(
    poll_interval=60.0,
    poll_timeout=1.0,
    connect_timeout=1.0,
    header_timeout=2.0,
    idle_timeout=2.0,
)
"""Settings for tests: no poll after the first one unless asked, short timeouts."""


def fast(**changes: Any) -> HostSettings:
    """:data:`FAST` with some settings changed."""
    return attrs.evolve(FAST, **changes)


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
        """crossbar's URL, without a trailing slash: a route's API is ``base + "/lab/v1"``."""
        return f"http://127.0.0.1:{self.port}"

    def reload(self, config: Config | Callable[[], Config]) -> Reloaded:
        """Reload crossbar as SIGHUP does, with ``config`` (or what it returns or raises,
        a :class:`~crossbar.config.ConfigError` say) as the file's new contents."""
        self.crossbar.load = config if callable(config) else lambda: config
        return self.crossbar.reload_everywhere()

    def state(self, name: str) -> HostState:
        """What crossbar's health table says of host ``name`` now."""
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
        return await guard(_whole(self.client.post(self.base + path, data=data)), timeout)

    async def get(self, path: str, timeout: float = 10.0) -> tuple[IResponse, bytes]:
        """GET and read the whole answer; the test fails if that takes over ``timeout``."""
        return await guard(_whole(self.client.get(self.base + path)), timeout)

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


def _whole(request: Deferred[Any]) -> Deferred[tuple[IResponse, bytes]]:
    async def read() -> tuple[IResponse, bytes]:
        response = await request
        return response, await treq.content(response)

    return Deferred.fromCoroutine(read())


async def build(
    hosts: Mapping[str, SimulatedHost | str],
    routes: Mapping[str, RouteConfig] | None = None,
    defaults: HostSettings = FAST,
    settings: Mapping[str, HostSettings] | None = None,
    up: Collection[str] | None = None,
    adjust: Callable[[Config], Config] | None = None,
) -> Rig:
    """Start simulators, then crossbar in front of them; wait until the hosts in ``up``
    (every simulator by default) are healthy.

    ``hosts`` maps names to simulators (started here) or to plain URLs; the route
    ``lab`` over every host, default model ``tiny-a``, is made when none are given;
    ``adjust`` may change the config made (keys, ``status_listen``) before crossbar starts.
    Stop it all with :func:`teardown`, or let :func:`rigs` do it.
    """
    # Imported here: crossbar.service imports klein, which installs the default reactor.
    from crossbar.service import Crossbar

    reactor = global_reactor()
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
    if adjust is not None:
        config = adjust(config)
    logs = LogCapture()
    crossbar = Crossbar(config, reactor)
    crossbar.startService()
    pool = HTTPConnectionPool(reactor, persistent=False)
    rig = Rig(crossbar, sims, HTTPClient(Agent(reactor, pool=pool)), pool, logs)
    try:
        for name in sims if up is None else up:
            await wait_state(rig, name, healthy=True, seconds=10)
        # The first round's asks of each loaded model's slots end too: a test's own
        # requests then meet a crossbar that knows what it will know, and a simulator
        # sees no ask of crossbar's among them.
        polled: Deferred[None] = Deferred()

        def ended(result: object) -> object:
            polled.callback(None)
            return result

        crossbar.poller.first_round.addBoth(ended)
        await polled
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


RigMaker = Callable[..., Awaitable[Rig]]
"""What :func:`rigs` yields: :func:`build`, remembering what it built."""


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


async def wait_state(rig: Rig, name: str, healthy: bool, seconds: float = 5.0) -> None:
    """Wait for the health table's change event that makes ``name`` (un)healthy."""
    table = rig.crossbar.table

    def holds() -> bool:
        state = table.get(name)
        return state is not None and state.healthy == healthy

    await _table_event(table, holds, seconds, f"{name} {'up' if healthy else 'down'}")


async def all_polled(table: HealthTable, seconds: float = 10.0) -> None:
    """Wait (on events, not time) until every host's first poll has ended."""

    def holds() -> bool:
        return all(s.state != "unknown" for s in table.snapshot().values())

    await _table_event(table, holds, seconds, "every host's first poll")


async def _table_event(
    table: HealthTable, holds: Callable[[], bool], seconds: float, what: str
) -> None:
    """Wait until ``holds()``, looking again at each change of ``table`` (now first)."""
    done: Deferred[None] = Deferred()

    def check(*_: HostState) -> None:
        if holds() and not done.called:
            done.callback(None)

    table.on_change(check)
    check()
    await guard(done, seconds, what)
