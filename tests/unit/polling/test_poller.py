"""crossbar.polling.poller: every host's ``/health`` and ``/v1/models`` polled into the health
table, in memory: StubTreq for HTTP and a Clock for time."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web import server
from twisted.web.resource import Resource

from crossbar.config import HostSettings
from crossbar.config.secrets import Secret
from crossbar.polling import poller as poller_module
from crossbar.polling.health import HealthTable, HostState
from crossbar.polling.poller import MAX_POLL_BODY, Poller
from tests.support import ROUTER_LISTING

ROUTER_MODELS = {
    "object": "list",
    "data": [
        *ROUTER_LISTING["data"],
        {"id": "tiny-a", "object": "model", "status": {"value": "loaded"}},  # listed twice
        {"id": "", "object": "model", "status": {"value": "loaded"}},  # no id: skipped
    ],
}


ROUTER_PROPS = {"role": "router", "max_instances": 2, "models_autoload": True}
NOT_LOADED = (400, b'{"error":{"code":400,"message":"model is not loaded"}}')


def props(slots: object) -> tuple[int, bytes]:
    """A loaded model's /props answer, as its own server gives it."""
    return 200, json.dumps({"total_slots": slots, "model_alias": "m", "build_info": "b1"}).encode()


class FakeHost(Resource):
    """Answers /health and /v1/models as told; records every path it is asked. The one
    ask that loads nothing, ``/props?model=X&autoload=false``, is answered from ``props``
    (a model without an answer is not loaded: 400) and recorded apart, in ``asks``."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[bytes] = []
        self.authorization: list[bytes | None] = []
        self.health: tuple[int, bytes] = (200, b'{"status":"ok"}')
        self.models: tuple[int, bytes] = (200, json.dumps(ROUTER_MODELS).encode())
        self.props: dict[str, tuple[int, bytes]] = {}
        self.asks: list[str] = []  # models asked for their slots, in order
        self.ask_authorization: list[bytes | None] = []
        self.hang_asks = False
        self.hang = False
        self.hanging: list[server.Request] = []
        self.room: tuple[int, bytes] = (200, json.dumps(ROUTER_PROPS).encode())
        self.room_asks = 0  # plain /props asks (the router's room), counted apart

    def render(self, request: server.Request) -> Any:
        assert request.uri is not None
        args = request.args
        if request.uri == b"/props":
            self.room_asks += 1
            request.setResponseCode(self.room[0])
            return self.room[1]
        if request.path == b"/props" and args.get(b"autoload") == [b"false"] and len(args) == 2:
            return self.ask(request, args[b"model"][0].decode())
        self.paths.append(request.uri)
        self.authorization.append(request.getHeader(b"authorization"))
        if self.hang:
            self.hanging.append(request)
            return server.NOT_DONE_YET
        code, body = {b"/health": self.health, b"/v1/models": self.models}.get(
            request.uri, (404, b"{}")
        )
        request.setResponseCode(code)
        return body

    def ask(self, request: server.Request, model: str) -> Any:
        self.asks.append(model)
        self.ask_authorization.append(request.getHeader(b"authorization"))
        if self.hang_asks:
            self.hanging.append(request)
            return server.NOT_DONE_YET
        code, body = self.props.get(model, NOT_LOADED)
        request.setResponseCode(code)
        return body


class Fleet(Resource):
    """Dispatches StubTreq's requests to a FakeHost by the Host header."""

    isLeaf = True

    def __init__(self, *names: str) -> None:
        super().__init__()
        self.hosts = {name: FakeHost() for name in names}

    def render(self, request: server.Request) -> Any:
        name = (request.getHeader("host") or "").split(":")[0]
        return self.hosts[name].render(request)


@attrs.define
class Rig:
    fleet: Fleet
    client: StubTreq
    clock: Clock
    table: HealthTable
    poller: Poller

    def poll(self, name: str) -> Deferred[None]:
        d = self.poller.poll_now(name)
        self.client.flush()
        return d

    def state(self, name: str) -> HostState:
        state = self.table.get(name)
        assert state is not None
        return state


def make_rig(
    *names: str,
    interval: float = 5.0,
    timeout: float = 5.0,
    keys: dict[str, Secret] | None = None,
) -> Rig:
    fleet = Fleet(*names)
    client = StubTreq(fleet)
    clock = Clock()
    clock.advance(1000)
    settings = {n: HostSettings(poll_interval=interval, poll_timeout=timeout) for n in names}
    table = HealthTable({n: f"http://{n}:8080" for n in names}, clock, settings)
    poller = Poller(table, client, clock, keys)
    return Rig(fleet, client, clock, table, poller)


def test_good_poll_records_loaded_and_known_models() -> None:
    rig = make_rig("gpu-a")
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert state.healthy
    assert state.loaded == ("tiny-a", "tiny-b")  # sorted, unique, non-empty, only "loaded"
    assert state.known == ("tiny-a", "tiny-b", "tiny-c", "tiny-d")
    assert state.consecutive == 1
    assert state.last_ok == 1000.0
    assert state.last_err == ""
    assert rig.fleet.hosts["gpu-a"].paths == [b"/health", b"/v1/models"]


def test_health_failure_skips_models() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.health = (503, b'{"error":{"code":503,"message":"Loading model"}}')
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err == "health: HTTP 503"
    assert host.paths == [b"/health"]


@pytest.mark.parametrize(
    ("models", "error"),
    [
        ((500, b"{}"), "models: HTTP 500"),
        ((200, b"not json"), "models: bad answer"),
        ((200, b'{"models": []}'), "models: bad answer"),
        ((200, b'{"data": [1]}'), "models: bad answer"),
        ((200, b'{"data": [], "pad": "' + b"x" * MAX_POLL_BODY + b'"}'), "models: "),
    ],
)
def test_models_failures(models: tuple[int, bytes], error: str) -> None:
    rig = make_rig("gpu-a")
    rig.fleet.hosts["gpu-a"].models = models
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err.startswith(error), state.last_err


def test_body_over_eight_mib_fails_and_exactly_eight_mib_passes() -> None:
    assert MAX_POLL_BODY == 8 * 1024 * 1024
    rig = make_rig("gpu-a")
    base = b'{"data": [], "pad": ""}'
    exact = base.replace(b'""', b'"' + b"x" * (MAX_POLL_BODY - len(base)) + b'"')
    assert len(exact) == MAX_POLL_BODY
    rig.fleet.hosts["gpu-a"].models = (200, exact)
    rig.poll("gpu-a")
    assert rig.state("gpu-a").healthy
    rig.fleet.hosts["gpu-a"].models = (200, exact[:-1] + b" }")
    rig.poll("gpu-a")
    assert rig.state("gpu-a").last_err == "models: answer larger than 8 MiB"


KEY = Secret(b"sk-lab-7f3a9c", "${GPU_A_KEY}")


def test_a_host_with_a_key_gets_it_on_every_poll_and_others_get_none() -> None:
    rig = make_rig("gpu-a", "gpu-b", keys={"gpu-a": KEY})
    rig.poll("gpu-a")
    rig.poll("gpu-b")
    assert rig.fleet.hosts["gpu-a"].authorization == [b"Bearer sk-lab-7f3a9c"] * 2
    assert rig.fleet.hosts["gpu-b"].authorization == [None, None]
    assert rig.state("gpu-a").healthy and rig.state("gpu-b").healthy


@pytest.mark.parametrize(
    ("which", "code", "keys", "error"),
    [
        (
            "models",
            401,
            {"gpu-a": KEY},
            "model list refused: 401 unauthorized — check the host's api_key",
        ),
        (
            "health",
            403,
            {"gpu-a": KEY},
            "health check refused: 403 forbidden — check the host's api_key",
        ),
        ("models", 401, None, "model list refused: 401 unauthorized — the host needs an api_key"),
    ],
)
def test_a_host_refusing_a_poll_is_down_saying_so_without_the_key(
    which: str, code: int, keys: dict[str, Secret] | None, error: str
) -> None:
    rig = make_rig("gpu-a", keys=keys)
    body = b'{"error":{"code":%d,"message":"Invalid API Key"}}' % code
    setattr(rig.fleet.hosts["gpu-a"], which, (code, body))
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert not state.healthy
    assert state.last_err == error
    assert "sk-lab" not in repr(state)


def test_failure_then_recovery_needs_two_good_polls() -> None:
    rig = make_rig("gpu-a")
    rig.poll("gpu-a")
    rig.poll("gpu-a")
    assert rig.state("gpu-a").consecutive == 2
    loaded_before = rig.state("gpu-a").loaded

    rig.fleet.hosts["gpu-a"].health = (500, b"")
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert (state.healthy, state.consecutive) == (False, 0)
    assert state.loaded == loaded_before  # stays as last seen

    rig.fleet.hosts["gpu-a"].health = (200, b"{}")
    rig.poll("gpu-a")
    assert (rig.state("gpu-a").healthy, rig.state("gpu-a").consecutive) == (False, 1)
    rig.poll("gpu-a")
    assert (rig.state("gpu-a").healthy, rig.state("gpu-a").consecutive) == (True, 2)


def test_poll_times_out() -> None:
    rig = make_rig("gpu-a", timeout=5.0)
    rig.fleet.hosts["gpu-a"].hang = True
    d = rig.poll("gpu-a")
    rig.clock.advance(4.9)
    assert rig.state("gpu-a").last_err == ""
    rig.clock.advance(0.2)
    rig.client.flush()
    assert d.called
    assert rig.state("gpu-a").last_err == "health: timed out after 5s"


def test_stopping_cancels_polls_and_records_nothing() -> None:
    rig = make_rig("gpu-a")
    rig.fleet.hosts["gpu-a"].hang = True
    rig.poller.startService()
    rig.client.flush()
    assert rig.fleet.hosts["gpu-a"].paths == [b"/health"]
    stopped = rig.poller.stopService()
    rig.client.flush()
    assert stopped.called
    assert rig.state("gpu-a") == HostState(name="gpu-a", url="http://gpu-a:8080")


def test_looping_call_polls_all_at_start_then_every_interval_without_doubling() -> None:
    rig = make_rig("gpu-a", "gpu-b", interval=5.0, timeout=60.0)
    slow = rig.fleet.hosts["gpu-b"]
    slow.hang = True
    rig.poller.startService()
    rig.client.flush()
    assert rig.fleet.hosts["gpu-a"].paths == [b"/health", b"/v1/models"]
    assert slow.paths == [b"/health"]
    assert rig.state("gpu-a").healthy  # the slow host did not delay the other

    rig.clock.advance(5.0)
    rig.client.flush()
    assert len(rig.fleet.hosts["gpu-a"].paths) == 4
    assert slow.paths == [b"/health"]  # still running: not polled twice

    slow.hang = False
    for request in slow.hanging:
        request.setResponseCode(503)
        request.finish()
    rig.client.flush()
    assert rig.state("gpu-b").last_err == "health: HTTP 503"
    rig.clock.advance(5.0)
    rig.client.flush()
    assert slow.paths == [b"/health", b"/health", b"/v1/models"]
    assert rig.state("gpu-b").consecutive == 1
    rig.poller.stopService()


def test_never_asks_paths_that_load_models() -> None:
    rig = make_rig("gpu-a")
    rig.poller.startService()
    for _ in range(20):
        rig.clock.advance(5.0)
        rig.client.flush()
    rig.poller.stopService()
    asked = set(rig.fleet.hosts["gpu-a"].paths)
    assert asked == {b"/health", b"/v1/models"}


# -- a reload: set_hosts and forget -------------------------------------------------------------


def add_host(rig: Rig, name: str, interval: float = 5.0) -> None:
    """The table (and the fleet) gain ``name``, as a reload applies it to the table."""
    rig.fleet.hosts[name] = FakeHost()
    urls = {n: rig.table.view[n].url for n in rig.table.names}
    settings = {**rig.table.settings, name: HostSettings(poll_interval=interval)}
    rig.table.set_hosts({**urls, name: f"http://{name}:8080"}, settings)


def test_a_host_added_by_a_reload_is_polled_at_once() -> None:
    rig = make_rig("gpu-a")
    rig.poller.startService()
    rig.client.flush()
    add_host(rig, "gpu-b")
    rig.poller.set_hosts(rig.client, {})
    rig.client.flush()
    assert rig.fleet.hosts["gpu-b"].paths == [b"/health", b"/v1/models"]  # no clock moved
    assert rig.state("gpu-b").healthy
    assert len(rig.fleet.hosts["gpu-a"].paths) == 2  # the others wait for their tick
    rig.clock.advance(5.0)
    rig.client.flush()
    assert len(rig.fleet.hosts["gpu-b"].paths) == 4
    rig.poller.stopService()


def test_a_host_removed_from_the_table_is_no_longer_polled() -> None:
    rig = make_rig("gpu-a", "gpu-b")
    rig.poller.startService()
    rig.client.flush()
    rig.table.set_hosts({"gpu-a": "http://gpu-a:8080"}, rig.table.settings)
    rig.poller.set_hosts(rig.client, {})
    for _ in range(3):
        rig.clock.advance(5.0)
        rig.client.flush()
    assert len(rig.fleet.hosts["gpu-b"].paths) == 2  # the first poll only
    assert len(rig.fleet.hosts["gpu-a"].paths) == 8
    rig.poller.stopService()


def test_a_forgotten_host_s_poll_under_way_is_cancelled_and_not_recorded() -> None:
    rig = make_rig("gpu-a", "gpu-b", timeout=5.0)
    rig.fleet.hosts["gpu-b"].hang = True
    rig.poller.startService()
    rig.client.flush()
    assert rig.fleet.hosts["gpu-b"].paths == [b"/health"]
    rig.poller.forget("gpu-b")  # still in the table: what it records would show
    rig.client.flush()
    for _ in range(2):  # past the poll timeout, and two more ticks
        rig.clock.advance(5.0)
        rig.client.flush()
    assert rig.state("gpu-b") == HostState(name="gpu-b", url="http://gpu-b:8080")
    assert rig.fleet.hosts["gpu-b"].paths == [b"/health"]
    assert len(rig.fleet.hosts["gpu-a"].paths) == 6  # the others go on
    rig.poller.stopService()


def test_a_restarted_host_is_polled_at_once_on_its_new_interval() -> None:
    rig = make_rig("gpu-a", "gpu-b", interval=5.0)
    rig.poller.startService()
    rig.client.flush()
    urls = {n: f"http://{n}:8080" for n in ("gpu-a", "gpu-b")}
    settings = {**rig.table.settings, "gpu-a": HostSettings(poll_interval=2.0)}
    rig.table.set_hosts(urls, settings)
    rig.poller.set_hosts(rig.client, {}, restart=["gpu-a"])
    rig.client.flush()
    assert len(rig.fleet.hosts["gpu-a"].paths) == 4
    assert len(rig.fleet.hosts["gpu-b"].paths) == 2
    rig.clock.advance(2.0)
    rig.client.flush()
    assert len(rig.fleet.hosts["gpu-a"].paths) == 6
    assert len(rig.fleet.hosts["gpu-b"].paths) == 2
    rig.poller.stopService()


def test_a_restart_during_a_poll_drops_it_unrecorded_and_polls_anew() -> None:
    rig = make_rig("gpu-a", timeout=60.0)
    host = rig.fleet.hosts["gpu-a"]
    host.hang = True
    rig.poller.startService()
    rig.client.flush()
    rig.poller.set_hosts(rig.client, {}, restart=["gpu-a"])
    rig.client.flush()
    assert host.paths == [b"/health", b"/health"]
    assert rig.state("gpu-a").state == "unknown"  # the dropped poll is no failure
    host.hang = False
    current = host.hanging[-1]
    current.setResponseCode(200)
    current.finish()
    rig.client.flush()
    assert rig.state("gpu-a").healthy
    rig.clock.advance(5.0)
    rig.client.flush()
    assert host.paths == [b"/health", b"/health", b"/v1/models", b"/health", b"/v1/models"]
    rig.poller.stopService()


def test_a_re_addressed_host_is_polled_through_the_new_client() -> None:
    rig = make_rig("gpu-a")
    rig.poller.startService()
    rig.client.flush()
    moved = Fleet("gpu-a2")
    client = StubTreq(moved)
    rig.table.set_hosts({"gpu-a": "http://gpu-a2:8080"}, rig.table.settings, fresh=["gpu-a"])
    rig.poller.set_hosts(client, {}, restart=["gpu-a"])
    client.flush()
    assert moved.hosts["gpu-a2"].paths == [b"/health", b"/v1/models"]
    assert rig.state("gpu-a").healthy
    assert len(rig.fleet.hosts["gpu-a"].paths) == 2  # the old address: not asked again
    rig.poller.stopService()


def test_new_keys_go_out_on_the_next_polls() -> None:
    rig = make_rig("gpu-a", "gpu-b", keys={"gpu-a": KEY})
    rig.poller.startService()
    rig.client.flush()
    new = Secret(b"sk-lab-new-1", "literal")
    rig.poller.set_hosts(rig.client, {"gpu-b": new})
    rig.clock.advance(5.0)
    rig.client.flush()
    assert rig.fleet.hosts["gpu-a"].authorization == [b"Bearer sk-lab-7f3a9c"] * 2 + [None] * 2
    assert rig.fleet.hosts["gpu-b"].authorization == [None] * 2 + [b"Bearer sk-lab-new-1"] * 2
    rig.poller.stopService()


def test_set_hosts_on_a_stopped_poller_polls_nothing_until_it_starts() -> None:
    rig = make_rig("gpu-a")
    add_host(rig, "gpu-b")
    rig.poller.set_hosts(rig.client, {"gpu-b": KEY})
    rig.client.flush()
    assert rig.fleet.hosts["gpu-b"].paths == []
    rig.poller.startService()
    rig.client.flush()
    assert rig.fleet.hosts["gpu-b"].authorization == [b"Bearer sk-lab-7f3a9c"] * 2
    assert rig.state("gpu-a").healthy
    rig.poller.stopService()


def test_a_list_the_same_to_the_byte_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27 (3): a long list was read again on every poll, and held the reactor."""
    read: list[bytes] = []
    real = poller_module.read_models

    def counted(body: bytes) -> Any:
        read.append(body)
        return real(body)

    monkeypatch.setattr(poller_module, "read_models", counted)
    rig = make_rig("gpu-a")
    for _ in range(3):
        rig.poll("gpu-a")
    assert len(read) == 1 and rig.state("gpu-a").polls == 3
    assert rig.state("gpu-a").known == ("tiny-a", "tiny-b", "tiny-c", "tiny-d")

    rig.fleet.hosts["gpu-a"].models = (200, b'{"data": [{"id": "tiny-z"}]}')
    rig.poll("gpu-a")
    rig.poll("gpu-a")
    assert len(read) == 2
    assert rig.state("gpu-a").known == ("tiny-z",)


def test_ids_with_control_characters_are_dropped_and_said_so() -> None:
    """Issue 27 (14): raw ESC and CR reached the page, the status JSON and /metrics."""
    rig = make_rig("gpu-a")
    ids = ["\x1b[2J\x1b[31mgpu-a is fine", "tiny-a\r\nX-Evil: 1", "tiny-a"]
    rig.fleet.hosts["gpu-a"].models = (200, json.dumps({"data": [{"id": i} for i in ids]}).encode())
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert state.healthy and state.known == ("tiny-a",) and state.loaded == ("tiny-a",)
    doc = state.to_json()
    assert doc["models_note"] == (
        "2 model ids dropped (over 256 bytes, with a control character, or one of crossbar's"
        " own names: (other), (none))"
    )
    assert doc["models_listed"] == 3
    assert not any(c in json.dumps(doc, ensure_ascii=False) for c in "\x1b\r")


def test_a_long_list_that_changes_is_read_at_most_once_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading 8 MiB of tiny entries holds the reactor for up to a second: a host that
    sends a new long list on every poll gets it read once in ``REREAD_SECONDS``."""
    read: list[bytes] = []
    real = poller_module.read_models
    monkeypatch.setattr(poller_module, "read_models", lambda body: read.append(body) or real(body))
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    pad = "x" * poller_module.REREAD_BYTES

    def answer(model: str) -> tuple[int, bytes]:
        return 200, json.dumps({"data": [{"id": model}], "pad": pad}).encode()

    host.models = answer("m0")
    rig.poll("gpu-a")
    for n in range(1, 5):
        host.models = answer(f"m{n}")
        rig.clock.advance(5)
        rig.poll("gpu-a")
    assert len(read) == 1 and rig.state("gpu-a").known == ("m0",)
    assert rig.state("gpu-a").healthy and rig.state("gpu-a").polls == 5
    rig.clock.advance(poller_module.REREAD_SECONDS)
    rig.poll("gpu-a")
    assert len(read) == 2 and rig.state("gpu-a").known == ("m4",)

    host.models = (200, b'{"data": [1]}' + b" " * 100)  # short: read when it changes
    rig.poll("gpu-a")
    assert rig.state("gpu-a").last_err == "models: bad answer: a data entry is not an object"
    rig.poll("gpu-a")  # the same bad answer: not read again, the same reason
    assert len(read) == 3
    assert rig.state("gpu-a").last_err == "models: bad answer: a data entry is not an object"


# -- slots: /props?model=X&autoload=false for the models a host lists as loaded ------------------


def listing(**statuses: str) -> tuple[int, bytes]:
    data = [{"id": m, "object": "model", "status": {"value": s}} for m, s in statuses.items()]
    return 200, json.dumps({"object": "list", "data": data}).encode()


def test_learns_the_slots_of_the_loaded_models_only() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.props = {"tiny-a": props(4), "tiny-b": props(2), "tiny-c": props(4), "tiny-d": props(4)}
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert sorted(host.asks) == ["tiny-a", "tiny-b"]  # tiny-c is loading, tiny-d unloaded
    assert host.paths == [b"/health", b"/v1/models"]  # nothing else, nothing that loads
    assert state.slots == {"tiny-a": 4, "tiny-b": 2}
    assert (state.capacity("tiny-a"), state.capacity("tiny-c")) == (4, None)
    assert state.to_json()["slots"] == {"tiny-a": 4, "tiny-b": 2}
    assert state.healthy and state.last_err == ""
    rig.clock.advance(5)
    rig.poll("gpu-a")
    assert len(host.asks) == 2  # known: not asked again on the next poll


def test_a_model_id_is_sent_url_encoded_as_one_value() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    odd = "org/m x&autoload=true#1"
    host.models = listing(**{odd: "loaded"})
    host.props = {odd: props(3)}
    rig.poll("gpu-a")
    assert host.asks == [odd]  # else FakeHost would have recorded it among the paths
    assert rig.state("gpu-a").slots == {odd: 3}


def test_at_most_four_asks_a_poll_and_many_models_are_learned_over_several() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    names = [f"m{n:02}" for n in range(10)]
    host.models = listing(**dict.fromkeys(names, "loaded"))
    host.props = {m: props(n + 1) for n, m in enumerate(names)}
    asked = []
    for _ in range(4):
        rig.poll("gpu-a")
        asked.append(len(host.asks))
        rig.clock.advance(5)
    assert asked == [4, 8, 10, 10]
    assert rig.state("gpu-a").slots == {m: n + 1 for n, m in enumerate(names)}


def test_a_model_unloaded_is_forgotten_and_asked_again_once_loaded_again() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models, host.props = listing(**{"tiny-a": "loaded"}), {"tiny-a": props(4)}
    rig.poll("gpu-a")
    assert rig.state("gpu-a").slots == {"tiny-a": 4}

    host.models, host.props = listing(**{"tiny-a": "unloaded"}), {}
    rig.poll("gpu-a")
    assert rig.state("gpu-a").slots == {} and "slots" not in rig.state("gpu-a").to_json()
    assert host.asks == ["tiny-a"]  # not asked while unloaded

    host.models, host.props = listing(**{"tiny-a": "loaded"}), {"tiny-a": props(8)}  # -np 8 now
    rig.poll("gpu-a")
    assert host.asks == ["tiny-a", "tiny-a"]
    assert rig.state("gpu-a").slots == {"tiny-a": 8}


def test_a_model_is_asked_again_after_a_minute() -> None:
    """Unloaded and loaded again between two polls, a model may run another ``-np``."""
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models, host.props = listing(**{"tiny-a": "loaded"}), {"tiny-a": props(4)}
    rig.poll("gpu-a")
    host.props = {"tiny-a": props(2)}
    rig.clock.advance(59)
    rig.poll("gpu-a")
    assert host.asks == ["tiny-a"] and rig.state("gpu-a").slots == {"tiny-a": 4}
    rig.clock.advance(1)
    rig.poll("gpu-a")
    assert host.asks == ["tiny-a", "tiny-a"] and rig.state("gpu-a").slots == {"tiny-a": 2}


@pytest.mark.parametrize(
    "answer",
    [
        (500, b'{"error":{"code":500,"message":"boom"}}'),
        NOT_LOADED,
        (200, b"not json"),
        (200, b"[4]"),
        (200, b"{}"),
        props(10**30),
        props(-4),
        props(0),
        props(4097),
        props("4"),
        props(4.0),
        props(True),
        props(None),
        (200, b'{"total_slots": 4, "pad": "' + b"x" * 256 * 1024 + b'"}'),
    ],
)
def test_a_hostile_answer_leaves_the_slots_unknown_and_the_host_up(
    answer: tuple[int, bytes],
) -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models, host.props = listing(**{"tiny-a": "loaded"}), {"tiny-a": props(4)}
    rig.poll("gpu-a")
    assert rig.state("gpu-a").slots == {"tiny-a": 4}
    host.props = {"tiny-a": answer}
    rig.clock.advance(60)
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert len(host.asks) == 2
    assert state.slots == {} and state.capacity("tiny-a") is None  # no longer vouched for
    assert state.healthy and state.last_err == "" and state.consecutive == 2


def test_four_thousand_and_ninety_six_slots_are_believed() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models, host.props = listing(**{"tiny-a": "loaded"}), {"tiny-a": props(4096)}
    rig.poll("gpu-a")
    assert rig.state("gpu-a").slots == {"tiny-a": 4096}


def test_an_ask_that_never_answers_ends_with_the_poll_timeout_and_marks_nothing_down() -> None:
    rig = make_rig("gpu-a", timeout=5.0)
    host = rig.fleet.hosts["gpu-a"]
    host.hang_asks = True
    d = rig.poll("gpu-a")
    assert rig.state("gpu-a").healthy and not d.called  # up at once, asks under way
    rig.clock.advance(5.1)
    rig.client.flush()
    assert d.called  # both asks at once: one timeout, not one each
    state = rig.state("gpu-a")
    assert state.healthy and state.last_err == "" and state.slots == {}


def test_stopping_during_an_ask_records_nothing() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.hang_asks = True
    rig.poller.startService()
    rig.client.flush()
    assert sorted(host.asks) == ["tiny-a", "tiny-b"]
    before = rig.state("gpu-a")
    stopped = rig.poller.stopService()
    rig.client.flush()
    assert stopped.called and rig.state("gpu-a") == before


def test_the_host_s_key_goes_with_every_ask() -> None:
    rig = make_rig("gpu-a", "gpu-b", keys={"gpu-a": KEY})
    for name in ("gpu-a", "gpu-b"):
        rig.fleet.hosts[name].props = {"tiny-a": props(4)}
        rig.poll(name)
    assert rig.fleet.hosts["gpu-a"].ask_authorization == [b"Bearer sk-lab-7f3a9c"] * 2
    assert rig.fleet.hosts["gpu-b"].ask_authorization == [None, None]
    assert rig.state("gpu-a").slots == rig.state("gpu-b").slots == {"tiny-a": 4}


def test_a_host_that_failed_is_asked_again_once_it_answers() -> None:
    """It may have restarted, its models with another ``-np``."""
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models, host.props = listing(**{"tiny-a": "loaded"}), {"tiny-a": props(4)}
    rig.poll("gpu-a")
    host.health = (500, b"")
    rig.poll("gpu-a")
    assert rig.state("gpu-a").slots == {"tiny-a": 4}  # down: kept as last seen
    host.health, host.props = (200, b"{}"), {"tiny-a": props(6)}
    rig.poll("gpu-a")
    assert host.asks == ["tiny-a", "tiny-a"] and rig.state("gpu-a").slots == {"tiny-a": 6}


def test_a_single_model_server_s_slots_are_learned_once() -> None:
    """A single-model server lists its one model without a status and answers ``/props``
    (the query is ignored) with its own ``total_slots``."""
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models = (200, json.dumps({"data": [{"id": "models/tiny-a.gguf"}]}).encode())
    host.props = {"models/tiny-a.gguf": props(2)}
    for _ in range(3):
        rig.poll("gpu-a")
        rig.clock.advance(5)
    assert host.asks == ["models/tiny-a.gguf"]
    assert rig.state("gpu-a").slots == {"models/tiny-a.gguf": 2}


# -- room: the router's own /props, asked without ?model= ---------------------------------------


def test_a_router_s_room_is_read_from_its_own_props_now_and_then() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    rig.poller.startService()
    rig.client.flush()
    state = rig.state("gpu-a")
    assert (state.max_instances, state.autoload) == (2, True) and host.room_asks == 1
    for _ in range(11):  # 55 s: not asked again yet
        rig.clock.advance(5.0)
        rig.client.flush()
    assert host.room_asks == 1
    host.room = (200, json.dumps({**ROUTER_PROPS, "max_instances": 3}).encode())
    rig.clock.advance(5.0)
    rig.client.flush()
    assert host.room_asks == 2 and rig.state("gpu-a").max_instances == 3
    rig.poller.stopService()


@pytest.mark.parametrize(
    "answer",
    [
        (200, b'{"total_slots": 4}'),  # a single-model server: no role
        (500, b"{}"),
        (200, b"not json"),
        (200, b'{"role": "router", "max_instances": 0}'),
    ],
)
def test_a_room_not_told_stays_unknown_and_the_host_up(answer: tuple[int, bytes]) -> None:
    rig = make_rig("gpu-a")
    rig.fleet.hosts["gpu-a"].room = answer
    rig.poller.startService()
    rig.client.flush()
    state = rig.state("gpu-a")
    assert state.healthy and state.max_instances is None
    rig.poller.stopService()


def test_models_max_in_the_config_overrides_what_the_router_says() -> None:
    rig = make_rig("gpu-a")
    rig.table.set_hosts({"gpu-a": "http://gpu-a:8080"}, {"gpu-a": HostSettings(models_max=1)})
    rig.poller.startService()
    rig.client.flush()
    assert rig.state("gpu-a").max_instances == 1
    assert rig.state("gpu-a").to_json()["max_instances"] == 1
    rig.poller.stopService()


def test_models_listed_as_loading_are_kept() -> None:
    rig = make_rig("gpu-a")
    listing = {"data": [{"id": "a", "status": {"value": "loading"}}, {"id": "b"}]}
    rig.fleet.hosts["gpu-a"].models = (200, json.dumps(listing).encode())
    rig.poller.startService()
    rig.client.flush()
    assert rig.state("gpu-a").loading == ("a",) and rig.state("gpu-a").loaded == ("b",)
    rig.poller.stopService()


# -- windows: a slot's n_ctx from the same /props ask, the training context from the list ------


def props_with_window(slots: object, window: object) -> tuple[int, bytes]:
    """A loaded model's /props answer with its slot window, as llama-server gives it."""
    settings = {"id": 0, "n_ctx": window, "params": {}}
    body = {"default_generation_settings": settings, "total_slots": slots, "model_alias": "m"}
    return 200, json.dumps(body).encode()


def test_learns_each_loaded_model_s_slot_window_from_the_same_ask() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.props = {"tiny-a": props_with_window(4, 16384), "tiny-b": props_with_window(2, 2048)}
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert sorted(host.asks) == ["tiny-a", "tiny-b"]  # one ask each, as before
    assert state.windows == {"tiny-a": 16384, "tiny-b": 2048}
    assert (state.window("tiny-a"), state.window("tiny-c")) == (16384, None)
    assert state.to_json()["windows"] == {"tiny-a": 16384, "tiny-b": 2048}


def test_a_single_model_server_s_window_comes_from_its_own_props() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    entry = {"id": "models/tiny-a.gguf", "meta": {"n_ctx_train": 32768, "n_vocab": 289}}
    host.models = (200, json.dumps({"data": [entry]}).encode())
    host.props = {"models/tiny-a.gguf": props_with_window(2, 8192)}
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert state.windows == {"models/tiny-a.gguf": 8192}
    assert state.trained == {"models/tiny-a.gguf": 32768}
    assert state.window_bound("models/tiny-a.gguf") == 8192  # the slot's, not the training's


@pytest.mark.parametrize("window", [0, -1, 1 << 25, "4096", 4096.0, True, None, [4096]])
def test_a_hostile_window_is_unknown_and_the_slots_still_learned(window: object) -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models, host.props = listing(**{"tiny-a": "loaded"}), {"tiny-a": props(4)}
    host.props = {"tiny-a": props_with_window(4, window)}
    rig.poll("gpu-a")
    state = rig.state("gpu-a")
    assert state.windows == {} and state.window("tiny-a") is None
    assert state.slots == {"tiny-a": 4} and state.healthy


def test_a_window_is_forgotten_when_its_model_is_unloaded() -> None:
    rig = make_rig("gpu-a")
    host = rig.fleet.hosts["gpu-a"]
    host.models = listing(**{"tiny-a": "loaded"})
    host.props = {"tiny-a": props_with_window(4, 4096)}
    rig.poll("gpu-a")
    assert rig.state("gpu-a").windows == {"tiny-a": 4096}
    host.models = listing(**{"tiny-a": "unloaded"})
    rig.poll("gpu-a")
    assert rig.state("gpu-a").windows == {} and "windows" not in rig.state("gpu-a").to_json()
