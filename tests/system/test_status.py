"""The ``/_crossbar/`` pages: in memory with a Clock where exact values matter, and end to
end (real loopback sockets, simulated llama-server hosts, a headless Chromium) for the rest."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock

from crossbar import __version__
from crossbar.config import DEMO_SOURCE, Config, HostSettings, RouteConfig, parse_config
from crossbar.pages.app import StatusApp, base_url
from crossbar.pages.peers import WorkerInfo
from crossbar.pages.times import ago
from crossbar.polling.health import HealthTable
from crossbar.queueing.queue import FairQueue, Flow
from crossbar.routing.placement import Occupancy
from crossbar.routing.policies import Policies, RoundRobin
from crossbar.service import Crossbar
from crossbar.stats.metrics import Metrics
from crossbar.stats.record import RequestRecord
from crossbar.stats.window import RecentTraffic
from crossbar.testing import Rig, SimulatedHost
from tests.support import all_polled, rigs
from tests.support.chromium import CHROMIUM, chromium, dump_dom
from tests.support.pagerows import PageRows

T0 = 1_700_000_000.0
T0_RFC3339 = "2023-11-14T22:13:20.000Z"
SCRIPT = "<script>document.title='owned'</script>"
NO_TOKENS = {
    "prompt_tokens": 0,
    "cached_tokens": 0,
    "cache_hit_rate": None,
    "generated_tokens": 0,
    "tokens_per_second": None,
    "first_token_p50_seconds": None,
}
"""A host's token figures in ``recent`` when no answer reported any."""


# -- helpers ------------------------------------------------------------------------------------


@attrs.define
class FakeProxy:
    """The traffic the pages read: requests in flight, and the policies (whose
    round-robin turns are ``turns``)."""

    in_flight: dict[str, int] = attrs.Factory(dict)
    turns: dict[str, int] = attrs.Factory(dict)
    policies: Policies = attrs.field(init=False, factory=Policies)
    queue: FairQueue[object] = attrs.field(init=False, factory=FairQueue)
    usage: Occupancy = attrs.field(init=False, factory=Occupancy)

    def __attrs_post_init__(self) -> None:
        round_robin = self.policies.named("round_robin")
        assert isinstance(round_robin, RoundRobin)
        round_robin.turns = self.turns  # one dict: a test moves the turn as traffic would


def header(response: Any, name: str) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0] if values else None


def lab_config(hosts: dict[str, str], routes: dict[str, Any], source: str = "lab.yaml") -> Config:
    return parse_config(
        {
            "listen": "tcp:0:interface=127.0.0.1",
            "poll_interval": "60s",
            "hosts": hosts,
            "routes": routes,
        },
        source,
    )


def status_app(config: Config, table: HealthTable, proxy: FakeProxy, clock: Clock) -> StatusApp:
    recent = RecentTraffic(config.hosts, clock)
    return StatusApp(config, table, proxy, Metrics(table, proxy), clock, recent=recent)


# -- in memory ----------------------------------------------------------------------------------


@attrs.define
class Desk:
    """A status app over a hand-driven table and clock, served by StubTreq (whose
    requests say ``Host: crossbar``). It started at T0."""

    table: HealthTable
    proxy: FakeProxy
    clock: Clock
    http: StubTreq
    recent: RecentTraffic

    async def get(self, path: str, method: str = "GET") -> tuple[Any, bytes]:
        response = await self.http.request(method, "http://crossbar" + path)
        return response, await treq.content(response)


@pytest.fixture
def desk() -> Desk:
    config = lab_config(
        {"gpu-a": "http://10.0.0.1:8080", "gpu-b": "http://10.0.0.2:8080/", "gpu-c": "http://c"},
        {
            "lab": {"hosts": ["gpu-b", "gpu-a"], "default_model": "m2"},
            "bee": {"hosts": ["gpu-b"]},
            "any": {"hosts": ["gpu-c", "gpu-a"]},
        },
    )
    clock = Clock()
    clock.advance(T0)
    table = HealthTable({n: h.url for n, h in config.hosts.items()}, clock)
    proxy = FakeProxy(in_flight={"gpu-a": 2, "gpu-b": 0, "gpu-c": 0})
    app = status_app(config, table, proxy, clock)
    table.record_ok("gpu-a", loaded=["m1"], known=["m2", "m1"])
    table.record_failure("gpu-b", "health: HTTP 500")
    clock.advance(3.6)
    return Desk(table, proxy, clock, StubTreq(app.resource()), app.recent)


@pytest_twisted.ensureDeferred
async def test_status_json_has_every_host_and_route(desk: Desk) -> None:
    response, body = await desk.get("/status")
    assert response.code == 200
    assert header(response, "content-type") == "application/json"
    assert json.loads(body) == {
        "version": __version__,
        "uptime_seconds": 3.6,
        "config": "lab.yaml",
        "reloads": None,  # built without a service: no reload history
        "slot_shares": {},  # no slots known: nothing waits, no share counted
        "flows": {
            "window_seconds": 300,
            "top": [],
            "others": {"flows": 0, "share": 0, "requests": 0},
        },
        "prefixes": {"shared": [], "hosts": []},  # built without a service: none kept
        "worker": None,
        "hosts": {
            "gpu-a": {
                "url": "http://10.0.0.1:8080",
                "healthy": True,
                "state": "up",
                "loaded": ["m1"],
                "known": ["m1", "m2"],
                "last_ok": T0_RFC3339,
                "last_err": "",
                "consecutive": 1,
                "in_flight": 2,
                "leaving": False,
                "recent": {
                    "window_seconds": 300,
                    "requests": 0,
                    "errors": 0,
                    "ttfb_p50_seconds": None,
                    **NO_TOKENS,
                },
            },
            "gpu-b": {
                "url": "http://10.0.0.2:8080",
                "healthy": False,
                "state": "down",
                "loaded": [],
                "known": [],
                "last_ok": None,
                "last_err": "health: HTTP 500",
                "consecutive": 0,
                "in_flight": 0,
                "leaving": False,
                "recent": {
                    "window_seconds": 300,
                    "requests": 0,
                    "errors": 0,
                    "ttfb_p50_seconds": None,
                    **NO_TOKENS,
                },
            },
            "gpu-c": {
                "url": "http://c",
                "healthy": False,
                "state": "unknown",
                "loaded": [],
                "known": [],
                "last_ok": None,
                "last_err": "",
                "consecutive": 0,
                "in_flight": 0,
                "leaving": False,
                "recent": {
                    "window_seconds": 300,
                    "requests": 0,
                    "errors": 0,
                    "ttfb_p50_seconds": None,
                    **NO_TOKENS,
                },
            },
        },
        "routes": {
            "lab": {
                "base_url": "http://crossbar/lab/v1",
                "hosts": ["gpu-b", "gpu-a"],
                "policy": "priority",
                "when_all_down": "fail",
                "default_model": "m2",
                "choice": "gpu-a",  # gpu-b comes first but is down
                "choice_model": "known",  # gpu-a knows m2: a request would load it
                "waiting": {"requests": 0, "oldest_seconds": None},
            },
            "bee": {
                "base_url": "http://crossbar/bee/v1",
                "hosts": ["gpu-b"],
                "policy": "priority",
                "when_all_down": "fail",
                "default_model": None,
                "choice": None,
                "choice_model": None,
                "waiting": {"requests": 0, "oldest_seconds": None},
            },
            "any": {
                "base_url": "http://crossbar/any/v1",
                "hosts": ["gpu-c", "gpu-a"],
                "policy": "priority",
                "when_all_down": "fail",
                "default_model": None,
                "choice": "gpu-a",
                "choice_model": None,  # no default model to name
                "waiting": {"requests": 0, "oldest_seconds": None},
            },
        },
    }


@pytest_twisted.ensureDeferred
async def test_state_is_unknown_until_the_first_poll_ends(desk: Desk) -> None:
    async def state() -> str:
        _, body = await desk.get("/status/gpu-c")
        return str(json.loads(body)["state"])

    assert await state() == "unknown"
    desk.table.record_ok("gpu-c", loaded=[], known=[])
    assert await state() == "up"
    desk.table.record_failure("gpu-c", "models: timed out after 5s")
    assert await state() == "down"


@pytest_twisted.ensureDeferred
async def test_one_host_alone_and_an_unknown_one(desk: Desk) -> None:
    response, body = await desk.get("/status/gpu-b")
    assert response.code == 200
    assert json.loads(body)["last_err"] == "health: HTTP 500"
    response, body = await desk.get("/status/gpu-z")
    assert response.code == 404
    assert header(response, "content-type") == "application/json"
    assert json.loads(body) == {"error": "unknown host"}


@pytest_twisted.ensureDeferred
async def test_choice_follows_the_table(desk: Desk) -> None:
    desk.table.record_ok("gpu-b", loaded=["m2"], known=["m2"])
    desk.table.record_ok("gpu-b", loaded=["m2"], known=["m2"])  # recovered after a failure
    _, body = await desk.get("/status")
    routes = json.loads(body)["routes"]
    assert routes["lab"]["choice"] == "gpu-b"
    assert routes["bee"]["choice"] == "gpu-b"


@pytest_twisted.ensureDeferred
async def test_choice_is_the_proxys_first_pick_under_every_policy() -> None:
    config = lab_config(
        {"gpu-a": "http://a", "gpu-b": "http://b"},
        {
            "busy": {"hosts": ["gpu-a", "gpu-b"], "policy": "least_busy"},
            "turns": {"hosts": ["gpu-a", "gpu-b"], "policy": "round_robin"},
            "anyway": {"hosts": ["gpu-b"], "when_all_down": "try_all"},
        },
    )
    clock = Clock()
    table = HealthTable({n: h.url for n, h in config.hosts.items()}, clock)
    table.record_ok("gpu-a", loaded=[], known=[])
    table.mark_down("gpu-b", "test")
    table.record_ok("gpu-b", loaded=[], known=[])
    table.record_ok("gpu-b", loaded=[], known=[])
    proxy = FakeProxy(in_flight={"gpu-a": 3, "gpu-b": 1}, turns={"turns": 5})
    http = StubTreq(status_app(config, table, proxy, clock).resource())

    async def choices() -> dict[str, str | None]:
        body = await treq.content(await http.get("http://crossbar/status"))
        return {name: r["choice"] for name, r in json.loads(body)["routes"].items()}

    assert await choices() == {"busy": "gpu-b", "turns": "gpu-b", "anyway": "gpu-b"}
    proxy.in_flight["gpu-b"] = 4
    proxy.turns["turns"] = 6
    table.mark_down("gpu-b", "test")  # try_all still sends there
    assert await choices() == {"busy": "gpu-a", "turns": "gpu-a", "anyway": "gpu-b"}
    page = PageRows((await treq.content(await http.get("http://crossbar/"))).decode())
    assert page.tables["routes"][2]["Goes to now"] == "gpu-b (none healthy; tried anyway)"


@pytest_twisted.ensureDeferred
async def test_readyz_names_the_routes_without_a_healthy_host(desk: Desk) -> None:
    response, body = await desk.get("/readyz")
    assert response.code == 503
    assert json.loads(body) == {"ready": False, "routes_down": ["bee"]}
    desk.table.record_ok("gpu-b", loaded=[], known=[])
    desk.table.record_ok("gpu-b", loaded=[], known=[])
    response, body = await desk.get("/readyz")
    assert response.code == 200
    assert json.loads(body) == {"ready": True, "routes_down": []}
    response, body = await desk.get("/livez")
    assert response.code == 200


@pytest_twisted.ensureDeferred
async def test_page_shows_hosts_and_routes(desk: Desk) -> None:
    response, body = await desk.get("/")
    assert response.code == 200
    assert header(response, "content-type") == "text/html; charset=utf-8"
    assert header(response, "cache-control") == "no-store"
    page = body.decode()
    assert page.startswith("<!DOCTYPE html>\n<html")
    assert "<script" not in page  # no JavaScript at all
    parsed = PageRows(page)
    assert parsed.title == "crossbar status"
    assert parsed.metas == {
        "viewport": "width=device-width, initial-scale=1",
        "refresh": "5",
    }
    rows = parsed.tables
    assert rows["hosts"] == [
        {
            "Host": "gpu-a http://10.0.0.1:8080",
            "State": "\u25cf up",
            "Last good poll": "3 s ago",
            "Last error": "",
            "Loaded": "m1",
            "Known": "m1, m2",
            "Good polls in a row": "1",
            "In flight": "2",
            "Requests, 5 min": "0",
            "Errors, 5 min": "0",
            "First byte p50, 5 min": "none",
        },
        {
            "Host": "gpu-b http://10.0.0.2:8080",
            "State": "\u25bc down",
            "Last good poll": "never",
            "Last error": "health: HTTP 500",
            "Loaded": "none",
            "Known": "none",
            "Good polls in a row": "0",
            "In flight": "0",
            "Requests, 5 min": "0",
            "Errors, 5 min": "0",
            "First byte p50, 5 min": "none",
        },
        {
            "Host": "gpu-c http://c",
            "State": "? unknown",
            "Last good poll": "never",
            "Last error": "",
            "Loaded": "none",
            "Known": "none",
            "Good polls in a row": "0",
            "In flight": "0",
            "Requests, 5 min": "0",
            "Errors, 5 min": "0",
            "First byte p50, 5 min": "none",
        },
    ]
    assert rows["routes"] == [
        {
            "Route": "lab http://crossbar/lab/v1",
            "Policy": "priority",
            "Hosts, in order": "gpu-b gpu-a",
            "Default model": "m2",
            "Goes to now": "gpu-a (knows m2; would load it)",
        },
        {
            "Route": "bee http://crossbar/bee/v1",
            "Policy": "priority",
            "Hosts, in order": "gpu-b",
            "Default model": "none (first healthy host)",
            "Goes to now": "no healthy host",
        },
        {
            "Route": "any http://crossbar/any/v1",
            "Policy": "priority",
            "Hosts, in order": "gpu-c gpu-a",
            "Default model": "none (first healthy host)",
            "Goes to now": "gpu-a",
        },
    ]
    desk.clock.advance(120)
    _, body = await desk.get("/")
    assert PageRows(body.decode()).tables["hosts"][0]["Last good poll"] == "2 min ago"


@pytest_twisted.ensureDeferred
async def test_page_and_json_show_each_flows_share_of_the_last_five_minutes(
    desk: Desk,
) -> None:
    queue, now = desk.proxy.queue, desk.clock.seconds()
    for name, seconds in (("alice", 40.0), ("alice", 50.0), ("10.0.0.7", 30.0)):
        queue.started(Flow(name), now)
        queue.finished(Flow(name), seconds, now)
    _, body = await desk.get("/")
    parsed = PageRows(body.decode())
    assert parsed.tables["flows"] == [
        {"Flow": "alice", "Share": "75%", "Slot time": "1 min", "Requests": "2 requests"},
        {"Flow": "10.0.0.7", "Share": "25%", "Slot time": "30 s", "Requests": "1 request"},
    ]
    _, body = await desk.get("/status")
    assert json.loads(body)["flows"]["top"] == [
        {"flow": "alice", "share": 0.75, "slot_seconds": 90.0, "requests": 2},
        {"flow": "10.0.0.7", "share": 0.25, "slot_seconds": 30.0, "requests": 1},
    ]
    desk.clock.advance(301)  # five minutes on: nothing left in the window
    _, body = await desk.get("/")
    assert "flows" not in PageRows(body.decode()).tables
    assert "No request has held a slot in the last 5 min" in body.decode()


@pytest_twisted.ensureDeferred
async def test_page_escapes_what_hosts_say(desk: Desk) -> None:
    """Model ids come from the hosts and error text may quote them: both are shown as text."""
    evil_model = '"><img src=x onerror=alert(1)>'
    desk.table.record_ok("gpu-a", loaded=[evil_model], known=[evil_model])
    desk.table.record_failure("gpu-b", f"models: bad answer: {SCRIPT}")
    _, body = await desk.get("/")
    page = body.decode()
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;" in page
    hosts = PageRows(page).tables["hosts"]
    assert hosts[0]["Loaded"] == evil_model
    assert hosts[1]["Last error"] == f"models: bad answer: {SCRIPT}"


@pytest_twisted.ensureDeferred
async def test_the_header_says_version_uptime_and_config(desk: Desk) -> None:
    desk.clock.advance(3 * 3600 + 12 * 60 - 3.6)  # crossbar started at T0
    _, body = await desk.get("/")
    texts = PageRows(body.decode()).texts
    assert texts["about"] == "up 3 h 12 min \u00b7 config lab.yaml"
    assert "demo" not in texts
    assert f'<small class="muted">{__version__}</small>' in body.decode()
    assert f'<span title="{T0_RFC3339}">3 h 12 min</span>' in body.decode()
    status = await desk.get("/status")
    doc = json.loads(status[1])
    assert (doc["version"], doc["uptime_seconds"], doc["config"]) == (
        __version__,
        11520.0,
        "lab.yaml",
    )


@pytest_twisted.ensureDeferred
async def test_a_demo_and_a_worker_say_so() -> None:
    config = lab_config({"gpu-a": "http://a"}, {"lab": {"hosts": ["gpu-a"]}}, DEMO_SOURCE)
    clock = Clock()
    table = HealthTable(config.urls, clock)
    proxy = FakeProxy(in_flight={"gpu-a": 0})
    recent = RecentTraffic(config.hosts, clock)
    worker = WorkerInfo(1, 3, "/run/crossbar")
    app = StatusApp(
        config, table, proxy, Metrics(table, proxy), clock, recent=recent, worker=worker
    )
    http = StubTreq(app.resource())

    texts = PageRows((await treq.content(await http.get("http://crossbar/"))).decode()).texts
    assert (
        texts["demo"] == "Demo: the fleet is simulated (--demo), no GPU; its answers are made up."
    )
    assert texts["about"] == "up 0 s \u00b7 config (demo) \u00b7 worker 1 of 3"
    doc = json.loads(await treq.content(await http.get("http://crossbar/status")))
    assert (doc["config"], doc["worker"]) == ("(demo)", {"index": 1, "count": 3})


@pytest_twisted.ensureDeferred
async def test_base_urls_use_the_host_the_reader_reached(desk: Desk) -> None:
    response = await desk.http.get("http://gpu-box:7777/status")
    routes = json.loads(await treq.content(response))["routes"]
    assert routes["lab"]["base_url"] == "http://gpu-box:7777/lab/v1"
    response = await desk.http.get("http://gpu-box:7777/")
    rows = PageRows((await treq.content(response)).decode()).tables["routes"]
    assert rows[1]["Route"] == "bee http://gpu-box:7777/bee/v1"


@attrs.define
class BareRequest:
    """What :func:`base_url` reads of a request: its Host header and the local address."""

    host: bytes | None
    local: Any

    def getHeader(self, name: bytes) -> bytes | None:
        return self.host if name == b"host" else None

    def getHost(self) -> Any:
        return self.local


@pytest.mark.parametrize(
    ("host", "local", "url"),
    [
        (b"gpu-box:7777", IPv4Address("TCP", "10.0.0.9", 7777), "http://gpu-box:7777"),
        (None, IPv4Address("TCP", "10.0.0.9", 7777), "http://10.0.0.9:7777"),  # HTTP/1.0
        (b"", IPv4Address("TCP", "10.0.0.9", 80), "http://10.0.0.9"),
        (None, IPv6Address("TCP", "fd00::9", 7777), "http://[fd00::9]:7777"),
    ],
)
def test_base_url(host: bytes | None, local: Any, url: str) -> None:
    assert base_url(cast(Any, BareRequest(host, local))) == url


@pytest_twisted.ensureDeferred
async def test_each_host_shows_its_last_five_minutes(desk: Desk) -> None:
    for status, first_byte in ((200, 0.25), (200, 0.25), (200, 4.0), (502, None)):
        desk.recent.request_done(RequestRecord("lab", "gpu-a", status, 5.0, first_byte, 10, "m2"))
    desk.recent.request_done(RequestRecord("bee", "gpu-b", 503, 0.1, 0.002, 10, None))

    doc = json.loads((await desk.get("/status"))[1])
    assert doc["hosts"]["gpu-a"]["recent"] == {
        "window_seconds": 300,
        "requests": 4,
        "errors": 1,
        "ttfb_p50_seconds": 0.25,
        **NO_TOKENS,
    }
    assert doc["hosts"]["gpu-b"]["recent"]["ttfb_p50_seconds"] == 0.002
    hosts = PageRows((await desk.get("/"))[1].decode()).tables["hosts"]
    seen = [
        (row["Requests, 5 min"], row["Errors, 5 min"], row["First byte p50, 5 min"])
        for row in hosts
    ]
    assert seen == [("4", "1", "250 ms"), ("1", "1", "2.0 ms"), ("0", "0", "none")]

    desk.clock.advance(300)
    _, body = await desk.get("/status/gpu-a")
    assert json.loads(body)["recent"] == {
        "window_seconds": 300,
        "requests": 0,
        "errors": 0,
        "ttfb_p50_seconds": None,
        **NO_TOKENS,
    }


@pytest_twisted.ensureDeferred
async def test_other_paths_and_methods_answer_json(desk: Desk) -> None:
    response, body = await desk.get("/nope")
    assert response.code == 404
    assert json.loads(body) == {"error": "not found"}
    response, body = await desk.get("/status", method="POST")
    assert response.code == 405
    assert header(response, "allow") == "GET, HEAD"
    assert json.loads(body) == {"error": "method not allowed"}


@pytest_twisted.ensureDeferred
async def test_with_a_listener_of_their_own_the_pages_leave_only_the_probes_behind() -> None:
    config = lab_config({"gpu-a": "http://10.0.0.1:8080"}, {"lab": {"hosts": ["gpu-a"]}})
    clock = Clock()
    table = HealthTable({"gpu-a": "http://10.0.0.1:8080"}, clock)
    app = status_app(config, table, FakeProxy(in_flight={"gpu-a": 0}), clock)

    async def get(http: StubTreq, path: str, method: str = "GET") -> tuple[int, Any]:
        response = await http.request(method, "http://crossbar" + path, allow_redirects=False)
        body = await treq.content(response)
        return response.code, json.loads(body) if body.startswith(b"{") else body

    main = StubTreq(app.probes())  # mounted at /_crossbar/ of the main port
    assert await get(main, "/livez") == (200, {"live": True})
    assert await get(main, "/readyz") == (503, {"ready": False, "routes_down": ["lab"]})
    table.record_ok("gpu-a", loaded=["m1"], known=["m1"])
    assert (await get(main, "/readyz"))[0] == 200
    for path in ("/", "/status", "/status/gpu-a", "/metrics", "/livez/x"):
        assert await get(main, path) == (404, {"error": "not found"})
    assert (await get(main, "/livez", "POST"))[0] == 405

    own = StubTreq(app.own_root())  # the root of status_listen
    code, status = await get(own, "/_crossbar/status")
    assert code == 200 and list(status["hosts"]) == ["gpu-a"]
    assert (await get(own, "/_crossbar/metrics"))[0] == 200
    assert (await get(own, "/_crossbar/livez"))[0] == 200
    for path in ("/lab/v1/models", "/status", "/favicon.ico"):
        assert await get(own, path) == (404, {"error": "not found"})
    response = await own.get("http://crossbar/", allow_redirects=False)
    await treq.content(response)
    assert response.code == 302 and header(response, "location") == "/_crossbar/"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-2, "0 s ago"),
        (0.4, "0 s ago"),
        (59.9, "59 s ago"),
        (60, "1 min ago"),
        (7200, "2 h ago"),
        (3 * 86400 + 5, "3 d ago"),
    ],
)
def test_ago(seconds: float, text: str) -> None:
    assert ago(seconds) == text


# -- end to end ---------------------------------------------------------------------------------


@attrs.define
class Fleet:
    rig: Rig

    @property
    def crossbar(self) -> Crossbar:
        return self.rig.crossbar

    @property
    def hosts(self) -> dict[str, SimulatedHost]:
        return self.rig.sims

    @property
    def client(self) -> HTTPClient:
        return self.rig.client

    @property
    def base(self) -> str:
        return self.rig.base + "/_crossbar"

    async def get(self, path: str) -> tuple[Any, bytes]:
        response = await self.client.get(self.base + path)
        return response, await treq.content(response)

    async def get_json(self, path: str) -> Any:
        _, body = await self.get(path)
        return json.loads(body)

    async def poll_until(self, name: str, healthy: bool) -> None:
        """Poll one host now, as often as its recovery needs (a few times at most)."""
        for _ in range(5):
            await self.crossbar.poller.poll_now(name)
            state = self.crossbar.table.get(name)
            assert state is not None
            if state.healthy == healthy:
                return
        raise AssertionError(f"{name} did not become healthy={healthy}: {state}")


@pytest_twisted.async_yield_fixture
async def fleet(reactor: Any) -> AsyncIterator[Fleet]:
    """gpu-a is up with m1 loaded; gpu-b answers every request with HTTP 500."""
    hosts = {
        "gpu-a": SimulatedHost({"m1": "loaded", "m2": "unloaded"}, reactor=reactor),
        "gpu-b": SimulatedHost({"m2": "loaded"}, reactor=reactor),
    }
    hosts["gpu-b"].fault = "error"
    routes = {
        "lab": RouteConfig("lab", ("gpu-a", "gpu-b"), "m1"),
        "spare": RouteConfig("spare", ("gpu-b",), None),
    }
    async with rigs() as make:
        rig = await make(hosts, routes, defaults=HostSettings(poll_interval=60.0), up=())
        await all_polled(rig.crossbar.table)
        yield Fleet(rig)


@pytest_twisted.ensureDeferred
async def test_every_endpoint_end_to_end(fleet: Fleet) -> None:
    status = await fleet.get_json("/status")
    a, b = status["hosts"]["gpu-a"], status["hosts"]["gpu-b"]
    assert (a["state"], a["healthy"], a["loaded"], a["known"]) == ("up", True, ["m1"], ["m1", "m2"])
    assert a["last_ok"].endswith("Z") and a["last_err"] == "" and a["in_flight"] == 0
    assert (b["state"], b["healthy"], b["last_ok"]) == ("down", False, None)
    assert b["last_err"] == "health: HTTP 500"
    base = fleet.rig.base  # the Host header the client sent: 127.0.0.1 and the port
    assert status["routes"] == {
        "lab": {
            "base_url": f"{base}/lab/v1",
            "hosts": ["gpu-a", "gpu-b"],
            "policy": "priority",
            "when_all_down": "fail",
            "default_model": "m1",
            "choice": "gpu-a",
            "choice_model": "loaded",
            "waiting": {"requests": 0, "oldest_seconds": None},
        },
        "spare": {
            "base_url": f"{base}/spare/v1",
            "hosts": ["gpu-b"],
            "policy": "priority",
            "when_all_down": "fail",
            "default_model": None,
            "choice": None,
            "choice_model": None,
            "waiting": {"requests": 0, "oldest_seconds": None},
        },
    }
    assert (status["version"], status["config"], status["worker"]) == (
        __version__,
        "crossbar.yaml",
        None,
    )
    assert 0 <= status["uptime_seconds"] < 60
    assert await fleet.get_json("/status/gpu-b") == b

    response, body = await fleet.get("/readyz")
    assert response.code == 503
    assert json.loads(body) == {"ready": False, "routes_down": ["spare"]}
    response, _ = await fleet.get("/livez")
    assert response.code == 200

    response, body = await fleet.get("/metrics")
    assert response.code == 200
    assert header(response, "content-type").startswith("text/plain; version=")  # type: ignore[union-attr]
    assert 'crossbar_host_up{host="gpu-a"} 1.0' in body.decode()
    assert 'crossbar_host_up{host="gpu-b"} 0.0' in body.decode()

    response, body = await fleet.get("/")
    assert response.code == 200
    rows = PageRows(body.decode()).tables["hosts"]
    states = {row["Host"].split()[0]: row["State"] for row in rows}
    assert states == {"gpu-a": "\u25cf up", "gpu-b": "\u25bc down"}

    # without the slash, a redirect to the page (whose links are relative)
    response = await fleet.client.get(fleet.base, allow_redirects=False)
    await treq.content(response)
    assert response.code in (301, 308)
    assert header(response, "location") == fleet.base + "/"


@pytest_twisted.ensureDeferred
async def test_real_requests_reach_the_last_five_minutes_and_the_metrics(fleet: Fleet) -> None:
    """The proxy has one observer slot: both the window and the metrics must see each request."""
    chat = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        response, _ = await fleet.rig.post("/lab/v1/chat/completions", chat)
        assert response.code == 200
    fleet.hosts["gpu-a"].fault = "error"
    response, _ = await fleet.rig.post("/lab/v1/chat/completions", chat)
    assert response.code == 500
    fleet.hosts["gpu-a"].fault = None
    response, _ = await fleet.rig.post("/spare/v1/chat/completions", chat)
    assert response.code == 503  # no host was tried: nobody's error

    recent = (await fleet.get_json("/status/gpu-a"))["recent"]
    assert (recent["requests"], recent["errors"]) == (3, 1)
    assert 0 < recent["ttfb_p50_seconds"] < 2
    assert (await fleet.get_json("/status/gpu-b"))["recent"]["requests"] == 0
    _, body = await fleet.get("/")
    row = PageRows(body.decode()).tables["hosts"][0]
    assert (row["Host"].split()[0], row["Requests, 5 min"], row["Errors, 5 min"]) == (
        "gpu-a",
        "3",
        "1",
    )
    assert row["First byte p50, 5 min"].endswith(("ms", " s"))
    _, metrics = await fleet.get("/metrics")
    assert 'crossbar_requests_total{code="500",host="gpu-a",route="lab"} 1.0' in metrics.decode()


@pytest_twisted.ensureDeferred
async def test_readyz_flips_when_the_last_healthy_host_of_a_route_goes_down(fleet: Fleet) -> None:
    fleet.hosts["gpu-b"].fault = None
    await fleet.poll_until("gpu-b", healthy=True)
    response, body = await fleet.get("/readyz")
    assert response.code == 200
    assert json.loads(body) == {"ready": True, "routes_down": []}

    await fleet.hosts["gpu-b"].refuse()  # "spare" has no other host
    await fleet.poll_until("gpu-b", healthy=False)
    response, body = await fleet.get("/readyz")
    assert response.code == 503
    assert json.loads(body) == {"ready": False, "routes_down": ["spare"]}

    fleet.hosts["gpu-a"].fault = "error"  # now "lab" has none either
    await fleet.poll_until("gpu-a", healthy=False)
    assert await fleet.get_json("/readyz") == {"ready": False, "routes_down": ["lab", "spare"]}


# -- in a real browser --------------------------------------------------------------------------


def screenshot(url: str, profile: Path, png: Path) -> None:
    """The page as headless Chromium paints it on a laptop's screen."""
    chromium(url, profile, f"--screenshot={png}", "--window-size=1200,900")


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's header (its IHDR chunk comes first)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", png[:16]
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install chromium)",
)
@pytest_twisted.ensureDeferred
async def test_page_in_headless_chromium(fleet: Fleet, tmp_path: Path) -> None:
    from twisted.internet.threads import deferToThread

    chat = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    for streamed in (False, False, True):  # a streamed answer has a first content event
        response, _ = await fleet.rig.post("/lab/v1/chat/completions", {**chat, "stream": streamed})
        assert response.code == 200
    # Error text is untrusted: in a real browser it must stay text and never run.
    fleet.crossbar.table.record_failure("gpu-b", f"health: {SCRIPT}")
    url = fleet.base + "/"
    dom = await deferToThread(dump_dom, url, tmp_path / "profile")
    page = PageRows(dom)
    assert page.title == "crossbar status"
    assert page.texts["about"].startswith("up ")
    hosts = {row["Host"].split()[0]: row for row in page.tables["hosts"]}
    assert set(hosts) == {"gpu-a", "gpu-b"}
    assert hosts["gpu-a"]["State"] == "\u25cf up"
    # a router: each loaded model with its slots and idle time, then the room they take
    loaded = hosts["gpu-a"]["Loaded"]
    assert re.fullmatch(r"m1 \(4 slots; 4k tokens a slot; idle \d+ s\) 1 of 4 instances", loaded)
    assert hosts["gpu-a"]["Requests, 5 min"] == "3"
    assert hosts["gpu-b"]["State"] == "\u25bc down"
    assert hosts["gpu-b"]["Last error"] == f"health: {SCRIPT}"
    routes = {row["Route"]: row["Goes to now"] for row in page.tables["routes"]}
    assert routes == {
        f"lab {fleet.rig.base}/lab/v1": "gpu-a (m1 loaded)",
        f"spare {fleet.rig.base}/spare/v1": "no healthy host",
    }
    # The tokens the simulated answers reported, and the last hour drawn in inline SVG that
    # the browser parsed as SVG: each chart's title, in words, in the DOM it built.
    usage = {row["Host"]: row for row in page.tables["usage"]}
    assert set(usage) == {"gpu-a", "gpu-b"}
    assert int(usage["gpu-a"]["Prompt tokens, 5 min"].replace(",", "")) > 0
    assert usage["gpu-a"]["First token p50, 5 min"].endswith(("ms", " s"))
    assert usage["gpu-b"]["Prompt tokens, 5 min"] == "0"
    assert len(page.charts) == 2 * 4
    # "highest 3 in the minute under way", or "1 min ago" when a minute turned meanwhile
    assert page.charts[0].startswith(
        "gpu-a, last 60 min, requests a minute: requests 3 in all, highest 3 "
    )
    assert page.charts[3].startswith("gpu-a, last 60 min, median time to first token: first")
    assert page.charts[4] == "gpu-b, last 60 min, requests a minute: requests none; errors none"
    assert dom.count("<svg") == 2 * 4 + 2 * 6  # the charts and their legends' line samples

    png = tmp_path / "status.png"
    await deferToThread(screenshot, url, tmp_path / "profile", png)
    data = png.read_bytes()
    assert png_size(data) == (1200, 900)
    assert len(data) > 30_000, f"{len(data)} bytes: is the page blank?"


@pytest_twisted.ensureDeferred
async def test_a_cache_affinity_route_shows_the_share_of_turns_at_home() -> None:
    config = lab_config(
        {"gpu-a": "http://a", "gpu-b": "http://b"},
        {
            "agents": {"hosts": ["gpu-a", "gpu-b"], "policy": "cache_affinity"},
            "lab": {"hosts": ["gpu-a"]},
        },
    )
    clock = Clock()
    clock.advance(T0)
    table = HealthTable(config.urls, clock)
    proxy = FakeProxy(in_flight={"gpu-a": 0, "gpu-b": 0})
    recent = RecentTraffic(config.hosts, clock, routes=["agents"])
    app = StatusApp(config, table, proxy, Metrics(table, proxy), clock, recent=recent)
    http = StubTreq(app.resource())

    async def routes() -> tuple[dict[str, Any], list[dict[str, str]]]:
        doc = json.loads(await treq.content(await http.get("http://crossbar/status")))
        page = (await treq.content(await http.get("http://crossbar/"))).decode()
        return doc["routes"], PageRows(page).tables["routes"]

    doc, rows = await routes()
    assert doc["agents"]["affinity"] == {
        "window_seconds": 300,
        "turns": 0,
        "home": 0,
        "moved": 0,
        "home_share": None,
    }
    assert "affinity" not in doc["lab"]
    assert rows[0]["Policy"] == "cache_affinity no conversation in 5 min"
    for outcome in ("new", "home", "home", "home", "moved"):
        recent.request_done(RequestRecord("agents", "gpu-a", 200, 1.0, 0.1, 10, "m", outcome))  # type: ignore[arg-type]
    doc, rows = await routes()
    assert doc["agents"]["affinity"]["home_share"] == 0.8
    assert (doc["agents"]["affinity"]["turns"], doc["agents"]["affinity"]["moved"]) == (5, 1)
    assert rows[0]["Policy"] == "cache_affinity 80% of 5 turns at their home host, 5 min"
    assert rows[1]["Policy"] == "priority"
