"""crossbar.pages.peers: how a worker finds the other workers' private ports (files in the
run directory) and gathers their metrics into one exposition. A fake HTTP client stands in
for the peers."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.logger import LogLevel

from crossbar.pages.peers import (
    SECRET_FILE,
    WorkerInfo,
    gather_metrics,
    peer_ports,
    peer_secret,
    publish_port,
    relay_reload,
)
from crossbar.testing import LogCapture


class FakePort:
    """An ``IListeningPort`` as far as ``publish_port`` looks."""

    def __init__(self, number: int) -> None:
        self.number = number

    def getHost(self) -> IPv4Address:
        return IPv4Address("TCP", "127.0.0.1", self.number)


def publish(number: int, path: Path) -> None:
    publish_port(FakePort(number), path)  # type: ignore[arg-type]


def test_port_file_is_named_by_the_worker_index() -> None:
    info = WorkerInfo(index=1, count=3, run_dir="/run/crossbar")
    assert info.port_file(2) == Path("/run/crossbar/worker-2.port")
    assert info.port_file(1) == Path("/run/crossbar/worker-1.port")


def test_publish_port_writes_the_number_and_leaves_no_scratch_file(tmp_path: Path) -> None:
    path = WorkerInfo(0, 2, str(tmp_path)).port_file(0)
    publish(40123, path)
    assert path.read_text() == "40123"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0.port"]


def test_publish_port_replaces_the_file_rather_than_rewriting_it(tmp_path: Path) -> None:
    """A peer reading at that moment sees the old number or the new, never half of one."""
    path = tmp_path / "worker-0.port"
    publish(40123, path)
    with path.open() as reader:  # a peer that opened the old file
        publish(51234, path)
        assert reader.read() == "40123"
    assert path.read_text() == "51234"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0.port"]


def test_peer_ports_skips_itself_and_files_missing_or_unreadable(tmp_path: Path) -> None:
    info = WorkerInfo(index=1, count=6, run_dir=str(tmp_path))
    info.port_file(0).write_text("40100")
    info.port_file(1).write_text("40101")  # its own
    # worker 2 has not written its file yet
    info.port_file(3).write_text("4o1o3")  # not a number
    info.port_file(4).mkdir()  # cannot be read as a file
    info.port_file(5).write_text("40105\n")
    info.port_file(6).write_text("40106")  # not one of the workers
    assert peer_ports(info) == {0: 40100, 5: 40105}


def test_peer_ports_of_a_lone_worker_is_empty(tmp_path: Path) -> None:
    info = WorkerInfo(index=0, count=1, run_dir=str(tmp_path))
    info.port_file(0).write_text("40100")
    assert peer_ports(info) == {}


# -- gather_metrics ---------------------------------------------------------------------------


def exposition(requests: int) -> bytes:
    return (
        b"# HELP crossbar_requests_total Requests proxied.\n"
        b"# TYPE crossbar_requests_total counter\n"
        b'crossbar_requests_total{route="chat"} %d.0\n' % requests
    )


class FakeResponse:
    def __init__(self, body: bytes, code: int = 200) -> None:
        self.code = code
        self._body = body

    def content(self) -> Deferred[bytes]:
        return succeed(self._body)


class FakeClient:
    """Answers ``get`` per port: a response, or an exception as a failed Deferred."""

    def __init__(self, answers: Mapping[int, FakeResponse | Exception]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, float]] = []
        self.headers: list[Any] = []

    def post(self, url: str, *, timeout: float, headers: Any = None) -> Deferred[Any]:
        return self.get(url, timeout=timeout, headers=headers)

    def get(self, url: str, *, timeout: float, headers: Any = None) -> Deferred[Any]:
        self.asked.append((url, timeout))
        self.headers.append(headers)
        port = int(url.split(":")[2].split("/")[0])
        answer = self.answers[port]
        return fail(answer) if isinstance(answer, Exception) else succeed(answer)


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    yield capture
    capture.close()


def workers(tmp_path: Path, ports: Mapping[int, int]) -> WorkerInfo:
    """Worker 1 of 4, with the given peers' ports published."""
    info = WorkerInfo(index=1, count=4, run_dir=str(tmp_path))
    for index, port in ports.items():
        publish(port, info.port_file(index))
    return info


@pytest_twisted.ensureDeferred
async def test_gather_merges_its_own_metrics_with_the_peers(tmp_path: Path) -> None:
    info = workers(tmp_path, {0: 40100, 3: 40103})
    client = FakeClient({40100: FakeResponse(exposition(5)), 40103: FakeResponse(exposition(7))})
    merged = await gather_metrics(info, exposition(3), client)
    assert client.asked == [
        ("http://127.0.0.1:40100/_crossbar/metrics?local=1", 2.0),
        ("http://127.0.0.1:40103/_crossbar/metrics?local=1", 2.0),
    ]
    assert merged == (
        b"# HELP crossbar_requests_total Requests proxied.\n"
        b"# TYPE crossbar_requests_total counter\n"
        b'crossbar_requests_total{route="chat",worker="1"} 3.0\n'
        b'crossbar_requests_total{route="chat",worker="0"} 5.0\n'
        b'crossbar_requests_total{route="chat",worker="3"} 7.0\n'
    )


@pytest_twisted.ensureDeferred
async def test_the_run_s_secret_is_shown_to_every_peer(tmp_path: Path) -> None:
    """A peer's private port wants the run's secret, whatever keys the config has."""
    info = workers(tmp_path, {0: 40100, 3: 40103})
    client = FakeClient({40100: FakeResponse(exposition(5)), 40103: FakeResponse(exposition(7))})
    await gather_metrics(info, exposition(3), client)
    secret = (tmp_path / SECRET_FILE).read_bytes()
    assert client.headers == [{b"Authorization": [b"Bearer " + secret]}] * 2


def test_the_secret_is_made_once_for_the_run_and_only_its_user_reads_it(tmp_path: Path) -> None:
    """Audit finding 11: the file the private ports' secret is read from, made by the
    first worker to ask (worker 0, before any port opens), the others reading it."""
    first = peer_secret(WorkerInfo(0, 3, str(tmp_path)))
    path = tmp_path / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first.value) >= 40  # 32 random bytes, as URL-safe text
    assert peer_secret(WorkerInfo(2, 3, str(tmp_path))) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [SECRET_FILE]  # no scratch file left
    assert first.value.decode() not in repr(first)
    other = tmp_path / "other"
    other.mkdir()
    assert peer_secret(WorkerInfo(0, 3, str(other))) != first  # a run of its own


def test_a_secret_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("known-to-someone-else")
    os.symlink(tmp_path / "elsewhere", tmp_path / SECRET_FILE)
    with pytest.raises(OSError):
        peer_secret(WorkerInfo(1, 2, str(tmp_path)))


@pytest_twisted.ensureDeferred
async def test_a_reload_asked_of_another_worker_is_worker_0_s(tmp_path: Path) -> None:
    """Audit finding 9: the answer is worker 0's (which reloads them all), asked on its
    private port with the run's secret, not a yes for having passed the request on."""
    info = workers(tmp_path, {0: 40100, 3: 40103})
    refused = {"error": "reload refused", "reason": "reload refused, ...: unknown host 'gpu-x'"}
    client = FakeClient({40100: FakeResponse(json.dumps(refused).encode(), code=400)})
    assert await relay_reload(info, client) == (400, refused)
    assert client.asked == [("http://127.0.0.1:40100/_crossbar/reload", 10.0)]
    secret = (tmp_path / SECRET_FILE).read_bytes()
    assert client.headers == [{b"Authorization": [b"Bearer " + secret]}]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            ConnectionRefusedError(),
            "worker 0, which reloads every worker, did not answer: connection refused",
        ),
        (FakeResponse(b"<html>"), "worker 0 answered something other than a JSON object"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_reload_worker_0_does_not_confirm_says_so(
    tmp_path: Path, answer: Any, reason: str
) -> None:
    client = FakeClient({40100: answer})
    not_confirmed = {"error": "reload not confirmed", "reason": reason}
    assert await relay_reload(workers(tmp_path, {0: 40100}), client) == (502, not_confirmed)
    unpublished = await relay_reload(workers(tmp_path / "x", {}), FakeClient({}))
    assert unpublished == (
        503,
        {"error": "reload not confirmed", "reason": "worker 0 has not published its port yet"},
    )


@pytest_twisted.ensureDeferred
async def test_with_no_peer_published_only_its_own_metrics_are_labelled(tmp_path: Path) -> None:
    client = FakeClient({})
    merged = await gather_metrics(workers(tmp_path, {}), exposition(3), client)
    assert client.asked == []
    assert merged.endswith(b'crossbar_requests_total{route="chat",worker="1"} 3.0\n')


@pytest_twisted.ensureDeferred
async def test_a_peer_that_fails_is_left_out_with_a_warning(
    tmp_path: Path, logs: LogCapture
) -> None:
    info = workers(tmp_path, {0: 40100, 3: 40103})
    client = FakeClient({40100: ConnectionRefusedError(), 40103: FakeResponse(exposition(7))})
    merged = await gather_metrics(info, exposition(3), client)
    assert b'worker="0"' not in merged
    assert merged.endswith(
        b'crossbar_requests_total{route="chat",worker="1"} 3.0\n'
        b'crossbar_requests_total{route="chat",worker="3"} 7.0\n'
    )
    warnings = [e for e in logs.events if e.get("log_level") == LogLevel.warn]
    assert logs.matching("metrics of worker") == [
        "metrics of worker 0 unavailable: connection refused"
    ]
    assert len(warnings) == 1


@pytest_twisted.ensureDeferred
async def test_a_peer_answering_an_error_is_left_out(tmp_path: Path, logs: LogCapture) -> None:
    info = workers(tmp_path, {0: 40100})
    page = b"<html><title>500 - Internal Server Error</title></html>"
    client = FakeClient({40100: FakeResponse(page, code=500)})
    merged = await gather_metrics(info, exposition(3), client)
    assert merged.endswith(b'crossbar_requests_total{route="chat",worker="1"} 3.0\n')
    assert len(logs.matching("metrics of worker 0 unavailable")) == 1
