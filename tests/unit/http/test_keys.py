"""crossbar.http.keys: who may come in, by the keys in a request's head. The guard as
a pure function first; then, over loopback, through the rig: routes with and without
keys, what crosses to a host, the status pages' keys and their own listener, workers
gathering each other's metrics, and no key anywhere an admin or a client can read."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient
from twisted.internet.threads import deferToThread
from twisted.web.client import Agent, HTTPConnectionPool

from crossbar.config import Config, HostConfig, RouteConfig, Secret, parse_config
from crossbar.config.secrets import expand, offered
from crossbar.http.admission import RawHeaders, Refusal
from crossbar.http.keys import (
    NO_KEY,
    NOT_BEARER,
    PAGES_UNAUTHORIZED,
    UNKNOWN_KEY,
    KeyGuard,
)
from crossbar.http.listener import CannotListen
from crossbar.pages.peers import WorkerInfo
from crossbar.service import Crossbar
from crossbar.testing import FAST, Rig, SimulatedHost, all_polled, rigs
from tests.support import free_port, guard, header, turns

KEY_A, KEY_B, TEAM, STATUS = (Secret(k) for k in (b"lab-key-a", b"lab-key-b", b"team", b"st"))
CHAT = b"/lab/v1/chat/completions"
PAGES_REFUSED = {"error": "unauthorized: the status pages need a key"}


def keyed_config(routes: dict[str, RouteConfig] | None = None, **changes: Any) -> Config:
    routes = routes or {
        "lab": RouteConfig("lab", ("gpu-a",), None, api_keys=(KEY_A, KEY_B)),
        "team": RouteConfig("team", ("gpu-a",), None, api_keys=(TEAM,)),
        "open": RouteConfig("open", ("gpu-a",), None),
    }
    fields: dict[str, Any] = {"status_keys": (STATUS,), **changes}
    return Config("tcp:0", {"gpu-a": HostConfig("gpu-a", "http://a")}, routes, **fields)


def auth(value: bytes) -> RawHeaders:
    return [(b"Host", [b"crossbar"]), (b"Authorization", [value])]


def api_key(value: bytes) -> RawHeaders:
    return [(b"X-Api-Key", [value])]


# -- the guard, as a pure function --------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "keys"),
    [
        (auth(b"Bearer lab-key-a"), [b"lab-key-a"]),
        (auth(b"bearer lab-key-a"), [b"lab-key-a"]),
        (auth(b"BEARER   lab-key-a  "), [b"lab-key-a"]),
        (auth(b"Bearer\tlab-key-a"), [b"lab-key-a"]),
        (api_key(b"lab-key-a"), [b"lab-key-a"]),
        (api_key(b" lab-key-a "), [b"lab-key-a"]),
        ([(b"x-api-key", [b"one", b"two"])], [b"one", b"two"]),
        ([(b"authorization", [b"Bearer one"]), (b"X-API-KEY", [b"two"])], [b"one", b"two"]),
        (auth(b"Basic bGFiOmtleQ=="), []),
        (auth(b"Bearerlab-key-a"), []),
        (auth(b"Bearer"), []),
        (auth(b"lab-key-a"), []),
        ([(b"Proxy-Authorization", [b"Bearer lab-key-a"])], []),
        ([(b"X-Api-Keys", [b"lab-key-a"])], []),
    ],
)
def test_the_keys_a_head_offers(headers: RawHeaders, keys: list[bytes]) -> None:
    assert list(offered(headers)) == keys


@pytest.mark.parametrize(
    "headers",
    [
        auth(b"Bearer lab-key-a"),
        auth(b"bEaReR lab-key-b"),  # either of the route's two keys, the scheme in any case
        api_key(b"lab-key-b"),
        [(b"Authorization", [b"Bearer wrong"]), (b"X-Api-Key", [b"lab-key-a"])],
    ],
)
def test_a_route_with_keys_lets_in_a_head_with_one_of_them(headers: RawHeaders) -> None:
    assert KeyGuard.for_config(keyed_config())(CHAT, headers) in (KEY_A, KEY_B)


@pytest.mark.parametrize(
    ("headers", "refusal"),
    [
        ([], NO_KEY),
        (auth(b"Bearer "), NO_KEY),  # an empty key is none
        (api_key(b""), NO_KEY),
        (auth(b"Bearer wrong"), UNKNOWN_KEY),
        (auth(b"Bearer LAB-KEY-A"), UNKNOWN_KEY),  # a key is compared exactly
        (auth(b"Bearer lab-key"), UNKNOWN_KEY),  # a prefix of a key
        (auth(b"Bearer lab-key-ab"), UNKNOWN_KEY),  # a key and more
        (auth(b"Bearer lab-key-a lab-key-b"), UNKNOWN_KEY),
        (auth(b"Basic lab-key-a"), NOT_BEARER),
        (auth(b"lab-key-a"), NOT_BEARER),
        (auth(b"Bearer team"), UNKNOWN_KEY),  # another route's key
        (auth(b"Bearer st"), UNKNOWN_KEY),  # a status key
        ([(b"Proxy-Authorization", [b"Bearer lab-key-a"])], NO_KEY),
    ],
)
def test_a_route_with_keys_refuses_any_other_head_saying_why(
    headers: RawHeaders, refusal: Refusal
) -> None:
    assert KeyGuard.for_config(keyed_config())(CHAT, headers) == refusal
    assert refusal.status == 401
    assert refusal.headers == ((b"WWW-Authenticate", b"Bearer"),)
    assert refusal.close  # the body that may follow is never read


def test_a_401_says_why_in_words_and_never_echoes_the_key() -> None:
    assert NO_KEY.error == "unauthorized: no key sent"
    assert UNKNOWN_KEY.error == "unauthorized: key not known"
    assert NOT_BEARER.error == (
        "unauthorized: Authorization without Bearer (send Authorization: Bearer <key>)"
    )
    refused = KeyGuard.for_config(keyed_config())(CHAT, auth(b"Basic lab-key-a"))
    assert isinstance(refused, Refusal) and "lab-key-a" not in refused.error


def test_the_guard_names_the_key_that_let_a_head_in() -> None:
    """The proxy learns who asked from the door, without reading the head again."""
    keys = KeyGuard.for_config(keyed_config())
    assert keys(CHAT, auth(b"Bearer lab-key-b")) is KEY_B
    assert keys(CHAT, [(b"X-Api-Key", [b"wrong"]), *auth(b"Bearer lab-key-a")]) is KEY_A
    assert keys(CHAT, auth(b"Bearer team")) == UNKNOWN_KEY
    assert keys(b"/open/v1/models", auth(b"Bearer lab-key-a")) is None


def test_a_route_without_keys_is_open() -> None:
    keys = KeyGuard.for_config(keyed_config())
    assert keys(b"/open/v1/models", []) is None
    assert keys(b"/open/v1/models", auth(b"Bearer whatever")) is None


def test_a_route_that_is_not_there_needs_some_route_s_key() -> None:
    """Without a key, no difference between a route with keys and no route at all: a
    stranger cannot learn route names by trying them. With any route's key, the proxy
    answers 404 as for everyone when no route has keys."""
    keys = KeyGuard.for_config(keyed_config())
    for path in (b"/nope/v1/models", b"/l\xd0\xb0b/v1/x", b"/lab2", b"/_crossbarx/v1/x"):
        assert keys(path, []) == NO_KEY
        assert not isinstance(keys(path, auth(b"Bearer team")), Refusal)  # let in
        assert keys(path, auth(b"Bearer st")) == UNKNOWN_KEY
    assert keys(b"/", []) is None  # no route named: the proxy's 400
    assert keys(b"//lab/v1/models", []) is None
    open_only = KeyGuard.for_config(keyed_config(routes={"open": RouteConfig("open", (), None)}))
    assert open_only(b"/nope/v1/models", []) is None


@pytest.mark.parametrize(
    "path",
    [
        b"/_crossbar",
        b"/_crossbar/",
        b"/_crossbar/status",
        b"/_crossbar/status/gpu-a",
        b"/_crossbar/metrics",
        b"/_crossbar/livez/",
        b"/_crossbar/%6civez",
        b"/_crossbar//livez",
        b"/%5Fcrossbar/status",  # walked decoded by twisted.web
    ],
)
def test_the_status_pages_need_a_status_key(path: bytes) -> None:
    keys = KeyGuard.for_config(keyed_config())
    assert keys(path, []) == PAGES_UNAUTHORIZED
    assert keys(path, auth(b"Bearer lab-key-a")) == PAGES_UNAUTHORIZED
    assert keys(path, auth(b"Bearer st")) is None
    assert keys(path, api_key(b"st")) is None


@pytest.mark.parametrize("path", [b"/_crossbar/livez", b"/_crossbar/readyz"])
def test_a_load_balancer_asks_livez_and_readyz_without_a_key(path: bytes) -> None:
    for pages in ("all", "probes", "only"):
        assert KeyGuard.for_config(keyed_config(), pages)(path, []) is None  # type: ignore[arg-type]


def test_a_main_port_that_serves_only_the_probes_guards_no_page() -> None:
    keys = KeyGuard.for_config(keyed_config(), "probes")
    assert keys(b"/_crossbar/status", []) is None  # a 404 there: nothing to guard
    assert keys(CHAT, []) == NO_KEY  # the routes' keys still hold


@pytest.mark.parametrize(
    "path", [b"/", b"/_crossbar/status", b"/%5fcrossbar/status", CHAT, b"/open/v1/models"]
)
def test_the_pages_own_listener_wants_a_status_key_for_every_path_but_the_probes(
    path: bytes,
) -> None:
    keys = KeyGuard.for_config(keyed_config(), "only")
    assert keys(path, []) == PAGES_UNAUTHORIZED
    assert keys(path, auth(b"Bearer lab-key-a")) == PAGES_UNAUTHORIZED
    assert keys(path, auth(b"Bearer st")) is None


def test_a_guard_is_needed_only_where_there_are_keys_to_ask_for() -> None:
    no_status = keyed_config(status_keys=())
    no_routes = keyed_config(routes={"open": RouteConfig("open", (), None)})
    nothing = attrs.evolve(no_routes, status_keys=())
    assert KeyGuard.for_config(keyed_config()).needed
    assert KeyGuard.for_config(no_status).needed
    assert KeyGuard.for_config(no_routes).needed
    assert not KeyGuard.for_config(nothing).needed
    assert not KeyGuard.for_config(no_routes, "probes").needed
    assert KeyGuard.for_config(no_status, "only").needed  # the routes' keys, there too
    assert KeyGuard.for_config(no_routes, "only").needed


def test_keys_from_the_environment_and_the_top_level_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSBAR_TEAM_KEY", "from-env")
    config = parse_config(
        {
            "hosts": {"gpu-a": "http://10.0.0.1:8080"},
            "api_keys": ["${CROSSBAR_TEAM_KEY}", "literal-key"],
            "routes": {"lab": {"hosts": ["gpu-a"]}, "own": {"hosts": ["gpu-a"], "api_keys": []}},
        }
    )
    keys = KeyGuard.for_config(config)
    assert isinstance(keys(CHAT, auth(b"Bearer from-env")), Secret)
    assert isinstance(keys(CHAT, api_key(b"literal-key")), Secret)
    assert keys(CHAT, auth(b"Bearer ${CROSSBAR_TEAM_KEY}")) == UNKNOWN_KEY
    assert keys(b"/own/v1/models", []) is None  # an empty list of its own: open


# -- over loopback --------------------------------------------------------------------------


def lab(**routes: tuple[Secret, ...]) -> dict[str, RouteConfig]:
    return {
        name: RouteConfig(name, ("gpu-a", "gpu-b"), "tiny-a", api_keys=keys)
        for name, keys in routes.items()
    }


def sims() -> dict[str, SimulatedHost]:
    return {n: SimulatedHost({"tiny-a": "loaded"}) for n in ("gpu-a", "gpu-b")}


def with_host_key(name: str, key: bytes) -> Callable[[Config], Config]:
    def adjust(config: Config) -> Config:
        host = attrs.evolve(config.hosts[name], api_key=Secret(key))
        return attrs.evolve(config, hosts={**config.hosts, name: host})

    return adjust


async def request(
    rig: Rig, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> tuple[Any, bytes]:
    response = await guard(
        rig.client.request(method, rig.base + path, headers=headers or {}, **kwargs), 10
    )
    return response, await guard(treq.content(response), 10)


def raw(port: int, data: bytes) -> bytes:
    """Send bytes; read the answer until crossbar closes (blocking, loopback)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


WORDS_401_END = b'"type":"authentication_error","code":401}}'


def credentials_seen(sim: SimulatedHost) -> list[dict[str, str]]:
    return [
        {k: v for k, v in r.headers.items() if k in ("authorization", "x-api-key")}
        for r in sim.requests
        if r.path.startswith("/v1/chat")
    ]


@pytest_twisted.ensureDeferred
async def test_a_request_without_a_key_is_refused_before_its_body_is_sent_or_read() -> None:
    async with rigs() as make:
        rig = await make(sims(), lab(lab=(KEY_A,)))
        head = (
            b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: 10000000\r\nExpect: 100-continue\r\n\r\n"
        )
        answer = await deferToThread(raw, rig.port, head)
        assert answer.startswith(b"HTTP/1.1 401 ")
        assert b"\r\nWWW-Authenticate: Bearer\r\n" in answer
        assert b"100 Continue" not in answer  # never invited to send the body
        assert answer.endswith(b'{"error":{"message":"unauthorized: no key sent",' + WORDS_401_END)
        # One that sends a large body anyway reads its 401 all the same.
        wrong = head.replace(b"Expect: 100-continue", b"Authorization: Bearer lab-key-b")
        answer = await deferToThread(raw, rig.port, wrong + b"x" * 1_000_000)
        assert answer.startswith(b"HTTP/1.1 401 ")
        assert rig.completions("gpu-a") == rig.completions("gpu-b") == []
        assert rig.logs.matching("- - POST /lab/v1/chat/completions 401")

        body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
        response, _ = await request(
            rig, "POST", "/lab/v1/chat/completions", {"X-Api-Key": "lab-key-a"}, data=body
        )
        assert response.code == 200
        assert rig.completions("gpu-a") == [body.replace(b"{", b'{"model":"tiny-a",', 1)]


@pytest_twisted.ensureDeferred
async def test_the_key_a_client_shows_crossbar_never_reaches_a_host() -> None:
    async with rigs() as make:
        rig = await make(sims(), lab(lab=(KEY_A,), open=()))
        mine = {"Authorization": "Bearer lab-key-a", "X-Api-Key": "lab-key-a"}
        response, _ = await request(rig, "POST", "/lab/v1/chat/completions", mine, data=b"{}")
        assert response.code == 200
        theirs = {"Authorization": "Bearer sk-upstream", "X-Api-Key": "up"}
        response, _ = await request(rig, "POST", "/open/v1/chat/completions", theirs, data=b"{}")
        assert response.code == 200
        # A route with keys forwards neither header; an open one forwards both as sent.
        assert credentials_seen(rig.sims["gpu-a"]) == [
            {},
            {"authorization": "Bearer sk-upstream", "x-api-key": "up"},
        ]


@pytest_twisted.ensureDeferred
async def test_a_host_with_a_key_gets_exactly_its_key_on_every_attempt() -> None:
    async with rigs() as make:
        rig = await make(sims(), lab(open=(), lab=(KEY_A,)), adjust=with_host_key("gpu-b", b"hk-b"))
        client = {"Authorization": "Bearer sk-client", "X-Api-Key": "client"}
        await rig.sims["gpu-a"].stop()  # the table still trusts it: the request fails over
        response, _ = await request(rig, "POST", "/open/v1/chat/completions", client, data=b"{}")
        assert (response.code, header(response, "x-crossbar-host")) == (200, "gpu-b")
        keyed = {"X-Api-Key": "lab-key-a"}
        response, _ = await request(rig, "POST", "/lab/v1/chat/completions", keyed, data=b"{}")
        assert (response.code, header(response, "x-crossbar-host")) == (200, "gpu-b")
        # Whatever the client sent, and whatever the route's keys: the host's own key.
        assert credentials_seen(rig.sims["gpu-b"]) == [{"authorization": "Bearer hk-b"}] * 2


@pytest_twisted.ensureDeferred
async def test_a_retry_on_a_host_without_a_key_carries_the_client_s_not_the_first_host_s() -> None:
    async with rigs() as make:
        rig = await make(sims(), lab(open=()), adjust=with_host_key("gpu-a", b"hk-a"))
        client = {"Authorization": "Bearer sk-client"}
        response, _ = await request(rig, "POST", "/open/v1/chat/completions", client, data=b"{}")
        assert header(response, "x-crossbar-host") == "gpu-a"
        await rig.sims["gpu-a"].stop()
        response, _ = await request(rig, "POST", "/open/v1/chat/completions", client, data=b"{}")
        assert (response.code, header(response, "x-crossbar-host")) == (200, "gpu-b")
        assert credentials_seen(rig.sims["gpu-a"]) == [{"authorization": "Bearer hk-a"}]
        assert credentials_seen(rig.sims["gpu-b"]) == [{"authorization": "Bearer sk-client"}]


def status_keys(*keys: bytes, listen: str | None = None) -> Callable[[Config], Config]:
    def adjust(config: Config) -> Config:
        secrets = tuple(Secret(k) for k in keys)
        return attrs.evolve(config, status_keys=secrets, status_listen=listen)

    return adjust


@pytest_twisted.ensureDeferred
async def test_status_keys_guard_every_page_but_the_probes() -> None:
    async with rigs() as make:
        rig = await make(sims(), lab(lab=(KEY_A,)), adjust=status_keys(b"st-1", b"st-2"))
        for path in ("/_crossbar/", "/_crossbar/status", "/_crossbar/metrics", "/_crossbar"):
            for shown in ({}, {"Authorization": "Bearer lab-key-a"}):
                response, body = await request(rig, "GET", path, shown)
                assert (response.code, json.loads(body)) == (401, PAGES_REFUSED)
                assert header(response, "www-authenticate") == "Bearer"
        for key in ("st-1", "st-2"):
            response, body = await request(
                rig, "GET", "/_crossbar/status", {"Authorization": f"Bearer {key}"}
            )
            assert response.code == 200 and "gpu-a" in json.loads(body)["hosts"]
        response, body = await request(rig, "GET", "/_crossbar/metrics", {"X-Api-Key": "st-1"})
        assert response.code == 200 and b"crossbar_host_up" in body
        for probe in ("/_crossbar/livez", "/_crossbar/readyz"):
            response, _ = await request(rig, "GET", probe)
            assert response.code == 200
        assert rig.logs.matching("status pages: http://", "/_crossbar/; a status key is required")


@pytest_twisted.ensureDeferred
async def test_status_listen_serves_the_pages_on_their_own_port() -> None:
    listen = "tcp:0:interface=127.0.0.1"
    async with rigs() as make:
        rig = await make(sims(), lab(lab=()), adjust=status_keys(b"st-1", listen=listen))
        listener = rig.crossbar.status_listener
        assert listener is not None and listener.port is not None
        pages = f"http://127.0.0.1:{listener.port.getHost().port}"  # type: ignore[attr-defined]
        key = {"Authorization": "Bearer st-1"}

        async def get(url: str, headers: dict[str, str] | None = None) -> tuple[Any, Any]:
            response = await guard(
                rig.client.get(url, headers=headers or {}, allow_redirects=False), 10
            )
            body = await guard(treq.content(response), 10)
            return response.code, json.loads(body) if body.startswith(b"{") else body

        # The main port: the routes, livez and readyz, and a JSON 404 for any other page.
        assert (await get(rig.base + "/_crossbar/livez"))[0] == 200
        assert (await get(rig.base + "/_crossbar/readyz"))[0] == 200
        for path in ("/_crossbar/status", "/_crossbar/", "/_crossbar/metrics", "/_crossbar"):
            assert await get(rig.base + path, key) == (404, {"error": "not found"})
        assert (await get(rig.base + "/lab/v1/models"))[0] == 200
        # The pages' port: the pages, behind the status key; no route is proxied there.
        assert (await get(pages + "/_crossbar/status"))[0] == 401
        code, status = await get(pages + "/_crossbar/status", key)
        assert code == 200 and set(status["hosts"]) == {"gpu-a", "gpu-b"}
        code, page = await get(pages + "/_crossbar/", key)
        assert code == 200 and b"gpu-a" in page
        assert (await get(pages + "/_crossbar/livez"))[0] == 200
        assert await get(pages + "/lab/v1/models", key) == (404, {"error": "not found"})
        response = await rig.client.get(pages + "/", headers=key, allow_redirects=False)
        await treq.content(response)
        assert response.code in (301, 302, 303, 307, 308)
        assert header(response, "location") == "/_crossbar/"
        [line] = rig.logs.matching("status pages:")
        assert line == (
            f"status pages: {pages}/_crossbar/ (the main port serves only /_crossbar/livez"
            " and /_crossbar/readyz); a status key is required (Authorization: Bearer <key>)"
        )
        # Announced above, not as a second crossbar (twistd's log drops internal lines).
        assert len(rig.logs.matching("crossbar starting on")) == 1


async def _two_workers(
    tmp_path: Path,
    reactor: Any,
    url: str,
    made: Callable[[], object] = lambda: None,
    status_keys: tuple[Secret, ...] = (),
) -> tuple[list[Crossbar], int]:
    """Two workers of one config on loopback ports, started, and the pages' port; ``made``
    is called once they are made, before any port opens. On fresh ports again if a port
    found free was taken before they listened on it (a race seen in CI)."""
    for attempt in range(3):
        status_port = free_port()
        config = Config(
            listen=f"tcp:{free_port()}:interface=127.0.0.1",
            status_listen=f"tcp:{status_port}:interface=127.0.0.1",
            hosts={"gpu-a": HostConfig("gpu-a", url)},
            routes={"lab": RouteConfig("lab", ("gpu-a",), None)},
            defaults=FAST,
            workers=2,
            status_keys=status_keys,
        )
        workers = [Crossbar(config, reactor, WorkerInfo(i, 2, str(tmp_path))) for i in (0, 1)]
        made()
        for worker in workers:
            worker.load = lambda config=config: config
        try:
            for worker in workers:
                worker.startService()
            return workers, status_port
        except CannotListen:
            for worker in workers:
                await worker.stopService()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest_twisted.ensureDeferred
async def test_workers_gather_each_other_s_metrics_with_the_status_key(
    tmp_path: Path, reactor: Any
) -> None:
    """Two workers in this process share the port and the pages' port; each one's private
    loopback port wants the run's secret, and the gatherer shows it."""
    sim = SimulatedHost({"tiny-a": "loaded"})
    await sim.listen(0, "127.0.0.1")
    client = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))
    workers: list[Crossbar] = []
    try:
        workers, status_port = await _two_workers(
            tmp_path, reactor, sim.url, status_keys=(Secret(b"st-1"), Secret(b"st-2"))
        )
        await turns()
        key = {"Authorization": "Bearer st-2"}
        url = f"http://127.0.0.1:{status_port}/_crossbar/metrics"
        response = await guard(client.get(url, headers=key), 10)
        merged = (await guard(treq.content(response), 10)).decode()
        assert response.code == 200
        assert 'worker="0"' in merged and 'worker="1"' in merged
        # A peer's private port refuses anyone without the run's secret.
        private = int((tmp_path / "worker-1.port").read_text())
        response = await guard(client.get(f"http://127.0.0.1:{private}/_crossbar/metrics"), 10)
        await treq.content(response)
        assert response.code == 401
    finally:
        for worker in workers:
            await worker.stopService()
        await sim.stop()


@pytest_twisted.ensureDeferred
async def test_a_private_port_wants_the_run_s_secret_even_with_open_pages(
    tmp_path: Path, reactor: Any
) -> None:
    """Audit finding 11: with ``status_listen`` and no ``status_keys``, each worker's private
    loopback port served the pages and ``POST /reload`` to any local user. It now wants
    the secret that worker 0 wrote (mode 0600) before any port opened."""
    sim = SimulatedHost({"tiny-a": "loaded"})
    await sim.listen(0, "127.0.0.1")
    secret_file = tmp_path / "peers.secret"
    made_before_any_port: list[bool] = []
    client = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))

    async def ask(method: str, port: int, path: str, key: str | None = None) -> tuple[int, Any]:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        url = f"http://127.0.0.1:{port}/_crossbar/{path}"
        response = await guard(client.request(method, url, headers=headers), 10)
        body = await guard(treq.content(response), 10)
        return response.code, json.loads(body) if path != "metrics" else body.decode()

    workers: list[Crossbar] = []
    try:
        workers, status_port = await _two_workers(
            tmp_path,
            reactor,
            sim.url,
            made=lambda: made_before_any_port.append(secret_file.exists()),
        )
        await turns()
        for index in (0, 1):
            private = int((tmp_path / f"worker-{index}.port").read_text())
            for method, path in [("GET", "status"), ("POST", "reload"), ("GET", "livez")]:
                assert await ask(method, private, path) == (401, {"error": "unauthorized"})
                assert (await ask(method, private, path, "a-guess"))[0] == 401
            assert made_before_any_port[-1]
            assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
            assert (await ask("GET", private, "status", secret_file.read_text()))[0] == 200
        code, merged = await ask("GET", status_port, "metrics")  # open pages: no key
        assert code == 200
        assert 'worker="0"' in merged and 'worker="1"' in merged  # peers show the secret
    finally:
        for worker in workers:
            await worker.stopService()
        await sim.stop()


@pytest_twisted.ensureDeferred
async def test_no_key_shows_anywhere_an_admin_or_a_client_can_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secrets = {
        "route": "rk-3f9a1c7e",
        "other": "rk2-77d1e0a4",
        "status": "sk-51b0c2d9",
        "host": "hk-9c1e4b22",
        "client": "wrong-0e8b1f3a",
    }
    monkeypatch.setenv("CROSSBAR_ROUTE_KEY", secrets["route"])
    monkeypatch.setenv("CROSSBAR_HOST_KEY", secrets["host"])
    dead = free_port()

    def from_yaml(made: Config) -> Config:
        urls = {name: host.url for name, host in made.hosts.items()}
        return parse_config(
            {
                "listen": made.listen,
                "poll_interval": "60s",
                "connect_timeout": "1s",
                "api_keys": ["${CROSSBAR_ROUTE_KEY}", secrets["other"]],
                "status_keys": [secrets["status"]],
                "hosts": {
                    "gpu-a": {"url": urls["gpu-a"], "api_key": "${CROSSBAR_HOST_KEY}"},
                    "gpu-b": urls["gpu-b"],
                    "gpu-x": {"url": f"http://127.0.0.1:{dead}", "api_key": "${CROSSBAR_HOST_KEY}"},
                },
                "routes": {
                    "lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "tiny-a"},
                    "merged": {"hosts": ["gpu-a"], "list_models": "merged"},
                    "dead": {"hosts": ["gpu-x"]},
                },
            },
            "lab.yaml",
        )

    hosts: dict[str, SimulatedHost | str] = {**sims(), "gpu-x": f"http://127.0.0.1:{dead}"}
    async with rigs() as make:
        rig = await make(hosts, adjust=from_yaml, up=("gpu-a", "gpu-b"))
        await all_polled(rig.crossbar.table)
        route = {"Authorization": f"Bearer {secrets['route']}"}
        answers = []
        for method, path, headers in [
            ("POST", "/lab/v1/chat/completions", {}),
            ("POST", "/lab/v1/chat/completions", {"X-Api-Key": secrets["client"]}),
            ("POST", f"/lab/v1/chat/completions?api_key={secrets['client']}", {}),
            ("POST", "/lab/v1/chat/completions", route),
            ("POST", "/lab/v1/chat/completions", {"X-Api-Key": secrets["other"]}),
            ("GET", "/merged/v1/models", route),
            ("POST", "/dead/v1/chat/completions", route),
            ("POST", "/nope/v1/chat/completions", route),
            ("GET", "/lab/v2/nothing", route),
            ("GET", "/_crossbar/status", route),
            ("GET", "/_crossbar/metrics", {"Authorization": f"Bearer {secrets['client']}"}),
        ]:
            response, body = await request(rig, method, path, headers, data=b"{}")
            answers.append((response.code, body))
        codes = [code for code, _ in answers]
        assert codes == [401, 401, 401, 200, 200, 200, 503, 404, 404, 401, 401]
        status = {"Authorization": f"Bearer {secrets['status']}"}
        pages = [
            (await request(rig, "GET", "/_crossbar/" + path, status))[1]
            for path in ("", "status", "status/gpu-a", "status/gpu-x", "metrics", "readyz")
        ]
        assert b"gpu-x" in pages[1] and b"crossbar_requests_total" in pages[4]
        seen = [*rig.logs.lines, repr(rig.logs.events), *(body for _, body in answers), *pages]
        text = "\n".join(s.decode() if isinstance(s, bytes) else s for s in seen)
        assert "route lab: http://127.0.0.1" in text and "a key is required" in text
        for name, value in secrets.items():
            assert value not in text, f"the {name} key shows"
        # and what a host is sent is its own key alone
        sent = [r.headers.get("authorization") for r in rig.sims["gpu-a"].requests]
        assert f"Bearer {secrets['host']}" in sent
        assert not any(secrets["route"] in str(r.headers) for r in rig.sims["gpu-b"].requests)


def test_a_secret_prints_masked_in_the_config_it_came_from() -> None:
    secret = expand("${CROSSBAR_X}", {"CROSSBAR_X": "hidden-value"})
    config = keyed_config(status_keys=(secret,))
    assert "hidden-value" not in repr(config) and "hidden-value" not in str(config)


# -- pages without status_keys, routes with keys (audit 3, finding 7) ------------------------


@pytest.mark.parametrize(
    "path", [b"/_crossbar/", b"/_crossbar/status", b"/_crossbar/metrics", b"/_crossbar/usage"]
)
def test_without_status_keys_the_pages_take_any_route_s_key_and_refuse_a_stranger(
    path: bytes,
) -> None:
    for pages in ("all", "only"):
        keys = KeyGuard.for_config(keyed_config(status_keys=()), pages)  # type: ignore[arg-type]
        assert keys(path, []) == PAGES_UNAUTHORIZED
        assert keys(path, auth(b"Bearer a-guess")) == PAGES_UNAUTHORIZED
        assert keys(path, auth(b"Bearer lab-key-b")) is None
        assert keys(path, api_key(b"team")) is None
        assert keys(b"/_crossbar/livez", []) is None
    open_routes = keyed_config(routes={"open": RouteConfig("open", (), None)}, status_keys=())
    assert KeyGuard.for_config(open_routes)(path, []) is None  # no key anywhere: open


@pytest_twisted.ensureDeferred
async def test_with_route_keys_and_no_status_keys_a_stranger_reads_no_page(
    tmp_path: Path,
) -> None:
    def with_usage(config: Config) -> Config:
        return attrs.evolve(config, usage_db=str(tmp_path / "usage.db"))

    async with rigs() as make:
        rig = await make(sims(), lab(lab=(KEY_A,)), adjust=with_usage)
        for path in ("/_crossbar/", "/_crossbar/status", "/_crossbar/metrics", "/_crossbar/usage"):
            for shown in ({}, {"Authorization": "Bearer a-guess"}):
                response, body = await request(rig, "GET", path, shown)
                assert response.code == 401, path
                assert json.loads(body) == PAGES_REFUSED
            response, _ = await request(rig, "GET", path, {"X-Api-Key": "lab-key-a"})
            assert response.code == 200, path
        for probe in ("/_crossbar/livez", "/_crossbar/readyz"):
            response, _ = await request(rig, "GET", probe)
            assert response.code == 200
        # Route keys do not reload the config: that stays an admin's.
        response, _ = await request(rig, "POST", "/_crossbar/reload", {"X-Api-Key": "lab-key-a"})
        assert response.code == 403
        assert rig.logs.matching(
            "status pages: http://", "any route's key is required, since status_keys is empty"
        )
