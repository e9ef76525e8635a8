"""Reloading the config in a running crossbar: new requests follow the new config at
once, requests and streams in flight finish where they were, hosts that stay keep
their state, a bad config is refused whole and the old one keeps serving."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq
from treq.testing import StubTreq

from crossbar.config import Config, ConfigError, HostConfig, RouteConfig, Secret, load_config
from crossbar.testing import Rig, RigMaker, SimulatedHost, broken, eventually, guard, rigs
from crossbar.testing.rig import wait_state
from tests.support import REPO, TWISTD, Daemon, free_port, start_daemon, start_simulator
from tests.support.errors import api_error
from tests.support.twistdenv import ENV

CHAT = "/lab/v1/chat/completions"
ASK = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**ASK, "stream": True}


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


def route(config: Config, *hosts: str, **changes: Any) -> Config:
    """``config`` with route ``lab`` over ``hosts`` (and other route settings)."""
    lab = attrs.evolve(config.routes["lab"], hosts=hosts, **changes)
    return attrs.evolve(config, routes={"lab": lab})


def hosts(config: Config, **urls: str) -> Config:
    """``config`` with exactly these hosts (name -> URL), settings kept where named."""
    old = config.hosts
    made = {
        n: HostConfig(n, u, old[n].settings if n in old else config.defaults)
        for n, u in urls.items()
    }
    return attrs.evolve(config, hosts=made)


def served_by(rig: Rig, name: str) -> int:
    return len(rig.completions(name))


@pytest_twisted.ensureDeferred
async def test_new_requests_follow_the_reloaded_route_at_once(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost(), "gpu-b": SimulatedHost()})
    config = route(rig.crossbar.config, "gpu-a")
    assert rig.reload(config).ok
    assert (await rig.post(CHAT, ASK))[0].code == 200
    result = rig.reload(route(config, "gpu-b"))
    assert result.ok
    assert result.message == "reloaded crossbar.yaml: routes changed: lab"
    for _ in range(3):
        assert (await rig.post(CHAT, ASK))[0].code == 200
    assert (served_by(rig, "gpu-a"), served_by(rig, "gpu-b")) == (1, 3)
    assert rig.logs.matching("reloaded crossbar.yaml: routes changed: lab")


@pytest_twisted.ensureDeferred
async def test_a_stream_finishes_on_a_host_the_reload_removed(make: RigMaker) -> None:
    slow = SimulatedHost(chunks=30, chunk_interval=0.02)
    rig = await make({"gpu-a": slow, "gpu-b": SimulatedHost()})
    config = route(rig.crossbar.config, "gpu-a")
    rig.reload(config)
    response, reader = await rig.stream(CHAT, STREAM)
    await guard(reader.bytes(1), 2, "first chunk")

    gone = hosts(route(config, "gpu-b"), **{"gpu-b": rig.sims["gpu-b"].url})
    assert rig.reload(gone).message == (
        "reloaded crossbar.yaml: hosts removed: gpu-a; routes changed: lab"
    )
    assert rig.logs.matching("host gpu-a left the config: kept until its 1 request in flight end")
    # Still in the table while its stream runs: never chosen, since no route names it.
    assert rig.crossbar.table.get("gpu-a") is not None
    status = json.loads((await rig.get("/_crossbar/status"))[1])
    assert (status["hosts"]["gpu-a"]["leaving"], status["hosts"]["gpu-b"]["leaving"]) == (
        True,
        False,
    )
    assert "(left the config)" in (await rig.get("/_crossbar/"))[1].decode()
    assert (await rig.post(CHAT, ASK))[0].code == 200
    assert served_by(rig, "gpu-b") == 1

    assert not broken(await reader.end(5))
    assert b"data: [DONE]" in reader.data
    assert response.code == 200
    await eventually(lambda: rig.crossbar.table.get("gpu-a") is None, 2, "gpu-a forgotten")
    assert "gpu-a" not in rig.crossbar.traffic.in_flight
    assert rig.logs.matching("host gpu-a removed: its last request has ended")
    status = json.loads((await rig.get("/_crossbar/status"))[1])
    assert list(status["hosts"]) == ["gpu-b"]


@pytest_twisted.ensureDeferred
async def test_an_idle_host_removed_is_forgotten_at_once(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost(), "gpu-b": SimulatedHost()})
    config = rig.crossbar.config
    rig.reload(hosts(route(config, "gpu-b"), **{"gpu-b": config.hosts["gpu-b"].url}))
    assert rig.crossbar.table.names == ["gpu-b"]
    metrics = (await rig.get("/_crossbar/metrics"))[1].decode()
    assert 'crossbar_host_up{host="gpu-a"}' not in metrics
    assert 'crossbar_host_up{host="gpu-b"} 1.0' in metrics


@pytest_twisted.ensureDeferred
async def test_an_added_host_starts_unknown_and_is_polled_at_once(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    extra = SimulatedHost()
    await extra.listen(0, "127.0.0.1")
    try:
        config = rig.crossbar.config
        urls = {"gpu-a": config.hosts["gpu-a"].url, "gpu-c": extra.url}
        rig.reload(route(hosts(config, **urls), "gpu-c", "gpu-a"))
        assert rig.state("gpu-c").state == "unknown"
        # FAST settings poll once at start and then not for a long time: only the
        # reload's own poll can make it healthy.
        await wait_state(rig, "gpu-c", healthy=True, seconds=5)
        assert (await rig.post(CHAT, ASK))[0].code == 200
        assert len([r for r in extra.requests if r.path.endswith("/completions")]) == 1
    finally:
        await extra.stop()


@pytest_twisted.ensureDeferred
async def test_a_host_that_stays_keeps_its_state(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost(), "gpu-b": SimulatedHost()})
    rig.crossbar.table.mark_down("gpu-b", "test")
    before = rig.state("gpu-a"), rig.state("gpu-b")
    config = rig.crossbar.config
    rig.reload(attrs.evolve(config, drain_timeout=5.0))
    assert (rig.state("gpu-a"), rig.state("gpu-b")) == before
    assert rig.state("gpu-b").last_err == "marked down: test"


@pytest_twisted.ensureDeferred
async def test_a_host_given_a_new_address_is_a_new_host(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    moved = SimulatedHost()
    await moved.listen(0, "127.0.0.1")
    try:
        result = rig.reload(hosts(rig.crossbar.config, **{"gpu-a": moved.url}))
        assert result.message == "reloaded crossbar.yaml: hosts with a new address: gpu-a"
        assert rig.state("gpu-a").state == "unknown"
        await wait_state(rig, "gpu-a", healthy=True)
        assert (await rig.post(CHAT, ASK))[0].code == 200
        assert len(rig.completions("gpu-a")) == 0  # the old address got nothing
        assert len([r for r in moved.requests if r.path.endswith("/completions")]) == 1
    finally:
        await moved.stop()


@pytest_twisted.ensureDeferred
async def test_a_config_that_fails_to_load_is_refused_whole(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    before = rig.crossbar.config

    def broken_file() -> Config:
        raise ConfigError("crossbar.yaml", "routes.lab.hosts", "names unknown host gpu-x")

    result = rig.reload(broken_file)
    assert not result.ok
    reason = (
        "reload refused, the config in force stays: "
        "crossbar.yaml: routes.lab.hosts: names unknown host gpu-x"
    )
    assert result.message == reason
    assert rig.logs.matching(reason)
    assert rig.crossbar.config is before
    assert (await rig.post(CHAT, ASK))[0].code == 200

    status = json.loads((await rig.get("/_crossbar/status"))[1])
    assert status["reloads"]["refused"] == 1
    assert status["reloads"]["last_refused"]["reason"] == (
        "crossbar.yaml: routes.lab.hosts: names unknown host gpu-x"
    )
    page = (await rig.get("/_crossbar/"))[1].decode()
    assert "names unknown host gpu-x" in page
    metrics = (await rig.get("/_crossbar/metrics"))[1].decode()
    assert 'crossbar_config_reloads_total{result="refused"} 1.0' in metrics
    assert 'crossbar_config_reloads_total{result="ok"} 0.0' in metrics

    loaded_before = rig.crossbar.reloads.loaded_at
    assert rig.reload(before).ok  # a good one clears the mark and moves the time
    status = json.loads((await rig.get("/_crossbar/status"))[1])
    assert status["reloads"]["last_refused"] is None
    assert rig.crossbar.reloads.loaded_at >= loaded_before


@pytest_twisted.ensureDeferred
async def test_what_a_reload_cannot_change_is_said_and_the_rest_applied(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost(), "gpu-b": SimulatedHost()})
    port = rig.port
    config = attrs.evolve(route(rig.crossbar.config, "gpu-b"), listen="tcp:1:interface=127.0.0.1")
    result = rig.reload(config)
    assert result.ok
    assert result.ignored == (
        "listen changed from tcp:0:interface=127.0.0.1 to tcp:1:interface=127.0.0.1: "
        "a reload cannot apply it, restart crossbar for that",
    )
    assert rig.logs.matching("reload: listen changed from")
    assert rig.port == port
    assert (await rig.post(CHAT, ASK))[0].code == 200
    assert served_by(rig, "gpu-b") == 1


@pytest_twisted.ensureDeferred
async def test_a_reloaded_route_key_replaces_the_old_one(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    old, new = Secret(b"old-key"), Secret(b"new-key")
    rig.reload(route(rig.crossbar.config, "gpu-a", api_keys=(old,)))

    async def code(key: bytes) -> int:
        headers = {b"Authorization": [b"Bearer " + key]}
        answer = await rig.client.post(rig.base + CHAT, json=ASK, headers=headers)
        await treq.content(answer)
        return int(answer.code)

    assert await code(b"old-key") == 200
    rig.reload(route(rig.crossbar.config, "gpu-a", api_keys=(new,)))
    assert (await code(b"old-key"), await code(b"new-key")) == (401, 200)


@pytest_twisted.ensureDeferred
async def test_post_reload_is_only_for_an_admin(make: RigMaker) -> None:
    key = Secret(b"status-key")

    def with_status_key(config: Config) -> Config:
        return attrs.evolve(config, status_keys=(key,))

    rig = await make({"gpu-a": SimulatedHost()}, adjust=with_status_key)
    rig.crossbar.load = lambda: route(rig.crossbar.config, "gpu-a")
    pages = StubTreq(rig.crossbar.status.resource())
    url = "http://crossbar/reload"
    answer = await rig.client.post(rig.base + "/_crossbar/reload")
    assert answer.code == 401
    await treq.content(answer)
    answer = await rig.client.post(
        rig.base + "/_crossbar/reload", headers={b"Authorization": [b"Bearer status-key"]}
    )
    assert answer.code == 200
    assert json.loads(await treq.content(answer)) == {
        "reloaded": True,
        "changes": "reloaded crossbar.yaml: nothing changed",
        "ignored": [],
    }

    rig.crossbar.status.config = attrs.evolve(rig.crossbar.config, status_keys=())
    open_pages = await pages.post(url)
    assert open_pages.code == 403
    assert json.loads(await treq.content(open_pages)) == {
        "error": "reload over HTTP needs status_keys or status_listen"
    }
    got = await pages.get(url)
    assert got.code == 405
    assert got.headers.getRawHeaders(b"allow") == [b"POST"]


@pytest_twisted.ensureDeferred
async def test_a_refused_post_reload_says_why(make: RigMaker) -> None:
    rig = await make(
        {"gpu-a": SimulatedHost()},
        adjust=lambda c: attrs.evolve(c, status_keys=(Secret(b"k"),)),
    )

    def bad() -> Config:
        raise ConfigError("crossbar.yaml", "listen", "port must be 1-65535, not 0")

    rig.crossbar.load = bad
    pages = StubTreq(rig.crossbar.status.resource())
    answer = await pages.post("http://crossbar/reload")
    assert answer.code == 400
    assert json.loads(await treq.content(answer)) == {
        "error": "reload refused",
        "reason": "reload refused, the config in force stays: "
        "crossbar.yaml: listen: port must be 1-65535, not 0",
    }
    rig.crossbar.load = None
    answer = await pages.post("http://crossbar/reload")
    assert answer.code == 409


@pytest_twisted.ensureDeferred
async def test_no_reload_while_stopping(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    rig.crossbar.status.draining = True
    result = rig.reload(route(rig.crossbar.config, "gpu-a"))
    assert (result.ok, result.message) == (False, "reload refused: crossbar is stopping")
    rig.crossbar.status.draining = False


@pytest_twisted.ensureDeferred
async def test_a_new_route_is_served_and_a_removed_one_is_not(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    config = rig.crossbar.config
    code = RouteConfig("code", ("gpu-a",), "tiny-a")
    rig.reload(attrs.evolve(config, routes={"code": code}))
    assert (await rig.post("/code/v1/chat/completions", ASK))[0].code == 200
    answer, body = await rig.post(CHAT, ASK)
    assert (answer.code, json.loads(body)) == (404, api_error(404, "unknown route"))
    status = json.loads((await rig.get("/_crossbar/status"))[1])
    assert list(status["routes"]) == ["code"]


# -- a real crossbar under twistd, its real file and SIGHUP --------------------------------


def _fleet_yaml(host_a: str, host_b: str, route_hosts: str, workers: int = 1) -> str:
    return (
        f"workers: {workers}\n"
        "hosts:\n"
        f"  gpu-a: {{url: '{host_a}'}}\n"
        f"  gpu-b: {{url: '{host_b}'}}\n"
        "routes:\n"
        f"  lab: {{hosts: [{route_hosts}], default_model: tiny-a}}\n"
    )


def _post(base: str, path: str, body: dict[str, Any], timeout: float = 10) -> tuple[int, bytes]:
    request = urllib.request.Request(
        base + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _rewrite(path: Path, yaml: str) -> None:
    """Replace the file in one rename, as an editor or a deploy tool does."""
    fresh = path.with_suffix(".new")
    fresh.write_text(yaml)
    fresh.replace(path)


def _served(daemon: Daemon, host: str) -> int:
    """Requests crossbar's access log says went to ``host`` (any worker's)."""
    line = f"lab {host} POST /v1/chat/completions 200 "
    return daemon.output().count(line)


@attrs.frozen
class _Fleet:
    """A crossbar under twistd in front of the two hosts, and how to write its file."""

    daemon: Daemon
    port: int
    head: str
    """The file's first lines (``listen`` and any more), kept by every rewrite."""
    urls: tuple[str, str]
    workers: int

    def yaml(self, route_hosts: str) -> str:
        return self.head + _fleet_yaml(*self.urls, route_hosts, self.workers)


def _start_fleet(
    tmp_path: Path, hosts: tuple[Daemon, Daemon], workers: int = 1, more: str = ""
) -> _Fleet:
    """The crossbar of :func:`_fleet_yaml`, route ``lab`` on gpu-a, started."""
    port = free_port()
    head = f'listen: "tcp:{port}:interface=127.0.0.1"\n{more}'
    a, b = hosts
    yaml = head + _fleet_yaml(a.url, b.url, "gpu-a", workers)
    return _Fleet(start_daemon(tmp_path, yaml, port=port), port, head, (a.url, b.url), workers)


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    slow = ("--chunks", "30", "--chunk-interval", "0.05")
    a = start_simulator(tmp_path, "--models", "tiny-a=loaded", *slow)
    (tmp_path / "b").mkdir()
    b = start_simulator(tmp_path / "b", "--models", "tiny-a=loaded")
    yield a, b
    a.stop()
    b.stop()


def test_sighup_reloads_the_file_and_a_stream_in_flight_finishes(
    tmp_path: Path, two_hosts: tuple[Daemon, Daemon]
) -> None:
    fleet = _start_fleet(tmp_path, two_hosts)
    daemon = fleet.daemon
    try:
        assert daemon.wait(lambda: "host gpu-a is up" in daemon.output(), 10), daemon.log()
        stream = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=10)
        stream.request("POST", CHAT, json.dumps(STREAM), {"Content-Type": "application/json"})
        answer = stream.getresponse()
        assert answer.status == 200
        first = answer.readline()  # the stream is under way on gpu-a
        assert first.startswith(b"data: ")

        _rewrite(tmp_path / "crossbar.yaml", fleet.yaml("gpu-b"))
        os.kill(daemon.proc.pid, signal.SIGHUP)
        reloaded = "reloaded crossbar.yaml: routes changed: lab"
        assert daemon.wait(lambda: reloaded in daemon.output(), 10), daemon.log()
        assert _post(daemon.url, CHAT, ASK)[0] == 200
        rest = answer.read()
        stream.close()
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert rest.count(b"data: ") == 32  # the events after the first: none lost
        # Log lines reach the file a batch at a time (within 0.1 s).
        lines = lambda: (_served(daemon, "gpu-a"), _served(daemon, "gpu-b"))  # noqa: E731
        assert daemon.wait(lambda: lines() == (1, 1), 5), daemon.log()

        _rewrite(tmp_path / "crossbar.yaml", fleet.head + "routes: [not, a, mapping]\n")
        os.kill(daemon.proc.pid, signal.SIGHUP)
        assert daemon.wait(lambda: "reload refused" in daemon.output(), 10), daemon.log()
        refused = [line for line in daemon.output().splitlines() if "reload refused" in line]
        assert len(refused) == 1
        assert "the config in force stays: crossbar.yaml: " in refused[0]
        assert _post(daemon.url, CHAT, ASK)[0] == 200  # still serving, on gpu-b
        assert daemon.wait(lambda: _served(daemon, "gpu-b") == 2, 5), daemon.log()
    finally:
        assert daemon.stop() == 0


def test_one_sighup_reloads_every_worker(tmp_path: Path, two_hosts: tuple[Daemon, Daemon]) -> None:
    fleet = _start_fleet(tmp_path, two_hosts, workers=2)
    daemon = fleet.daemon
    try:
        assert daemon.wait(lambda: "[worker-1]" in daemon.output(), 20), daemon.log()
        _rewrite(tmp_path / "crossbar.yaml", fleet.yaml("gpu-b"))
        os.kill(daemon.proc.pid, signal.SIGHUP)

        def both_reloaded() -> bool:
            return daemon.output().count("crossbar.yaml: routes changed: lab") == 2

        assert daemon.wait(both_reloaded, 15), daemon.log()
        assert "[worker-1] reloaded /" in daemon.output()
        # New connections are spread over both workers by the kernel: all go to gpu-b.
        for _ in range(20):
            assert _post(daemon.url, CHAT, ASK)[0] == 200
        assert daemon.wait(lambda: _served(daemon, "gpu-b") == 20, 5), daemon.log()
        assert _served(daemon, "gpu-a") == 0
    finally:
        assert daemon.stop() == 0


def test_the_units_reload_checks_the_file_before_the_signal(
    tmp_path: Path, two_hosts: tuple[Daemon, Daemon]
) -> None:
    """``systemctl reload`` runs the unit's ExecReload lines in order and stops at the first
    that fails: a bad file fails the reload command, and crossbar never sees a SIGHUP."""
    unit = (REPO / "contrib" / "crossbar.service").read_text()
    commands = [
        line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecReload=")
    ]
    assert len(commands) == 2
    fleet = _start_fleet(tmp_path, two_hosts)
    daemon = fleet.daemon
    config = tmp_path / "crossbar.yaml"

    def systemctl_reload() -> int:
        for command in commands:
            command = command.replace("/opt/crossbar/.venv/bin/twistd", TWISTD)
            command = command.replace("/etc/crossbar/crossbar.yaml", str(config))
            command = command.replace("$MAINPID", str(daemon.proc.pid))
            done = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, env=ENV)
            if done.returncode:
                return done.returncode
        return 0

    try:
        _rewrite(config, fleet.head + "routes: {lab: {hosts: [gpu-x]}}\n")
        assert systemctl_reload() == 2
        _rewrite(config, fleet.yaml("gpu-b"))
        assert systemctl_reload() == 0
        reloaded = "reloaded crossbar.yaml: routes changed: lab"
        assert daemon.wait(lambda: reloaded in daemon.output(), 10), daemon.log()
        assert "reload refused" not in daemon.output()  # the bad file never reached it
    finally:
        assert daemon.stop() == 0


def test_a_post_to_any_worker_reloads_every_worker(
    tmp_path: Path, two_hosts: tuple[Daemon, Daemon]
) -> None:
    fleet = _start_fleet(tmp_path, two_hosts, workers=2, more="status_keys: [admin-key]\n")
    daemon = fleet.daemon
    try:
        assert daemon.wait(lambda: "[worker-1]" in daemon.output(), 20), daemon.log()
        _rewrite(tmp_path / "crossbar.yaml", fleet.yaml("gpu-b"))
        answers = []
        for _ in range(8):  # new connections: the kernel spreads them over both workers
            request = urllib.request.Request(
                daemon.url + "/_crossbar/reload",
                data=b"",
                headers={"Authorization": "Bearer admin-key"},
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                answers.append(json.loads(answer.read()))
        assert all(answer["reloaded"] for answer in answers), answers

        def both_reloaded() -> bool:
            text = daemon.output()
            return "[worker-1] reloaded /" in text and "reloaded crossbar.yaml: routes" in text

        assert daemon.wait(both_reloaded, 15), daemon.log()
        for _ in range(6):
            assert _post(daemon.url, CHAT, {**ASK, "max_tokens": 1})[0] == 200
        assert daemon.wait(lambda: _served(daemon, "gpu-b") == 6, 5), daemon.log()
        assert _served(daemon, "gpu-a") == 0
    finally:
        assert daemon.stop() == 0


@pytest_twisted.ensureDeferred
async def test_reloaded_limits_hold_for_the_next_request(make: RigMaker) -> None:
    rig = await make({"gpu-a": SimulatedHost()})
    config = rig.crossbar.config
    assert (await rig.post(CHAT, ASK))[0].code == 200
    rig.reload(attrs.evolve(config, limits=attrs.evolve(config.limits, max_body=10)))
    answer, body = await rig.post(CHAT, ASK)
    assert (answer.code, json.loads(body)) == (413, api_error(413, "body too large"))


@pytest_twisted.ensureDeferred
async def test_a_refused_reload_never_shows_a_url_password(make: RigMaker, tmp_path: Path) -> None:
    """Audit finding 10: a password holding ``/``, ``?``, ``#`` or ``@`` in a reloaded
    file's host ``url`` reached the log line, the POST's answer and the status page."""
    rig = await make(
        {"gpu-a": SimulatedHost()},
        adjust=lambda c: attrs.evolve(c, status_keys=(Secret(b"k"),)),
    )
    path = tmp_path / "crossbar.yaml"
    path.write_text(
        "hosts: {gpu-a: {url: 'https://admin:Zq7/Wv9?K#x@y@gpu-a.lab:8443'}}\n"
        "routes: {lab: {hosts: [gpu-a]}}\n"
    )
    rig.crossbar.load = lambda: load_config(path)
    reason = (
        f"{path}: hosts.gpu-a.url: must not carry credentials (give the host an api_key): "
        "'https://admin:****@gpu-a.lab:8443'"
    )
    pages = StubTreq(rig.crossbar.status.resource())
    answer = await pages.post("http://crossbar/reload")
    body = (await treq.content(answer)).decode()
    assert answer.code == 400
    assert json.loads(body)["reason"] == f"reload refused, the config in force stays: {reason}"
    status = (await pages.get("http://crossbar/status")).content
    shown = {
        "answer": body,
        "log": "\n".join(rig.logs.lines),
        "status": (await status()).decode(),
        "page": (await treq.content(await pages.get("http://crossbar/"))).decode(),
    }
    assert reason in shown["log"]
    assert json.loads(shown["status"])["reloads"]["last_refused"]["reason"] == reason
    assert "must not carry credentials" in shown["page"]
    for where, text in shown.items():
        assert not any(part in text for part in ("Zq7", "Wv9", "K#x")), where


def test_a_refused_file_is_refused_by_whichever_worker_takes_the_post(
    tmp_path: Path, two_hosts: tuple[Daemon, Daemon]
) -> None:
    """Audit finding 9: a worker other than worker 0 passed the request on and answered
    200 ``"reloaded": true`` for a file that worker 0 then refused (2 of 6 times)."""
    fleet = _start_fleet(tmp_path, two_hosts, workers=2, more="status_keys: [admin-key]\n")
    daemon = fleet.daemon
    try:
        assert daemon.wait(lambda: "[worker-1]" in daemon.output(), 20), daemon.log()
        _rewrite(tmp_path / "crossbar.yaml", fleet.yaml("gpu-x"))
        answers = []
        for _ in range(12):  # new connections: the kernel spreads them over both workers
            request = urllib.request.Request(
                daemon.url + "/_crossbar/reload",
                data=b"",
                headers={"Authorization": "Bearer admin-key"},
            )
            try:
                with urllib.request.urlopen(request, timeout=15) as answer:
                    answers.append((answer.status, json.loads(answer.read())))
            except urllib.error.HTTPError as e:
                answers.append((e.code, json.loads(e.read())))
        reason = (
            "reload refused, the config in force stays: crossbar.yaml: "
            "routes.lab.hosts: item 0: unknown host 'gpu-x'"
        )
        assert answers == [(400, {"error": "reload refused", "reason": reason})] * 12
        assert _post(daemon.url, CHAT, ASK)[0] == 200  # the config in force serves
    finally:
        assert daemon.stop() == 0
