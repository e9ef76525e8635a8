"""An upgrade with no refused connection: with ``listen_reuse_port: true`` a new crossbar
opens the same port while the old one still runs; SIGTERM to the old one then lets its
streams finish while the new one takes every new connection.

A connection the kernel is still queueing on the old socket as it closes is handed to the
new one only with ``net.ipv4.tcp_migrate_req`` on (Linux 5.14+); without it the kernel
resets it before crossbar reads a byte of it, and its client may send it again. The test
turns the setting on where it may (as root), and then counts any reset as a failure."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import Daemon, free_port, start_daemon, start_simulator
from tests.support.plain_host import PlainHost, serve_plain

CHAT = "/lab/v1/chat/completions"
ASK = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
STREAM = {**ASK, "max_tokens": 40, "stream": True}


def _config(port: int, sim: Daemon) -> str:
    return (
        f'listen: "tcp:{port}:interface=127.0.0.1"\n'
        "listen_reuse_port: true\n"
        f"hosts:\n  gpu-a: {sim.url}\n"
        "routes:\n  lab: {hosts: [gpu-a], default_model: tiny-a}\n"
    )


MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")
RESETS = ("ConnectionResetError", "BrokenPipeError")
"""How a client sees a connection reset before crossbar read any of it."""


def _ask(port: int, body: dict[str, object]) -> str:
    """One request on a connection of its own: ``200``, another status, or the error."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        connection.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
        answer = connection.getresponse()
        data = answer.read()
        if answer.status == 200 and body.get("stream") and b"data: [DONE]" not in data:
            return "200 cut short"
        return str(answer.status)
    except OSError as e:
        return type(e).__name__
    finally:
        connection.close()


class Load:
    """Plain requests from ``clients`` threads, each request on a new connection, back to
    back until stopped. ``retry_reset``: a request whose connection is reset is sent once
    more on a new one (counted in ``resets``), as a client does."""

    def __init__(self, port: int, clients: int = 4, retry_reset: bool = False) -> None:
        self.port = port
        self.retry_reset = retry_reset
        self.resets = 0
        self.outcomes: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            outcome = _ask(self.port, ASK)
            if outcome in RESETS and self.retry_reset:
                with self._lock:
                    self.resets += 1
                outcome = _ask(self.port, ASK)
            with self._lock:
                self.outcomes[outcome] += 1

    def stop(self) -> Counter[str]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=20)
        return self.outcomes


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Daemon]:
    daemon = start_simulator(
        tmp_path, "--chunks", "40", "--chunk-interval", "0.05", "--slots", "16"
    )
    yield daemon
    daemon.stop()


@pytest.fixture
def migrate_req() -> Iterator[bool]:
    """``net.ipv4.tcp_migrate_req`` on, where the kernel has it and it may be set here
    (root), and as it was afterwards; whether it is on."""
    try:
        before = MIGRATE_REQ.read_text()
        if before.strip() != "1":
            MIGRATE_REQ.write_text("1\n")
    except OSError:  # not Linux 5.14+, or not root
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            MIGRATE_REQ.write_text(before)


def test_a_new_crossbar_takes_over_the_port_and_nothing_is_refused(
    tmp_path: Path, sim: Daemon, migrate_req: bool
) -> None:
    port = free_port()
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = start_daemon(tmp_path / "old", _config(port, sim), port=port)
    new: Daemon | None = None
    try:
        assert old.wait(lambda: "host gpu-a is up" in old.output(), 10), old.log()
        load = Load(port, retry_reset=not migrate_req)
        with ThreadPoolExecutor(4) as pool:
            streams: list[Future[str]] = [pool.submit(_ask, port, STREAM) for _ in range(4)]
            assert old.wait(lambda: sum(load.outcomes.values()) >= 20, 10), old.log()

            new = start_daemon(tmp_path / "new", _config(port, sim), port=port)
            assert new.wait(lambda: "host gpu-a is up" in new.output(), 10), new.log()
            old.proc.terminate()
            assert old.proc.wait(timeout=15) == 0
            served_before = new.output().count("lab gpu-a POST")

            def new_serves() -> bool:
                return new is not None and new.output().count("lab gpu-a POST") >= (
                    served_before + 20
                )

            assert new.wait(new_serves, 10), new.log()
            outcomes = load.stop()
            assert [f.result(timeout=15) for f in streams] == ["200"] * 4
        assert set(outcomes) == {"200"}, outcomes
        assert outcomes["200"] >= 40
        assert "stopped: " in old.output()
        assert "address already in use" not in new.output()
    finally:
        old.stop()
        if new is not None:
            assert new.stop() == 0


def test_without_the_flag_a_second_crossbar_cannot_open_the_port(
    tmp_path: Path, sim: Daemon
) -> None:
    port = free_port()
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    yaml = _config(port, sim).replace("listen_reuse_port: true\n", "")
    first = start_daemon(tmp_path / "first", yaml, port=port)
    try:
        second = start_daemon(tmp_path / "second", yaml, port=port, wait=False)
        assert second.proc.wait(timeout=20) == 1
        assert "cannot listen on tcp:" in second.output()
        assert "address already in use" in second.output()
    finally:
        first.stop()


class _SlowPolls(PlainHost):
    """A host whose polls take half a second each: crossbar's first poll of it is slow."""

    model = "tiny-a"
    poll_delay = 0.5
    received: list[bytes] = []


def test_a_shared_port_takes_no_request_before_the_first_poll(tmp_path: Path) -> None:
    """Its share of new connections waits in the backlog until the hosts are known:
    answered then, not refused with 503 for want of a healthy host."""
    slow = serve_plain(_SlowPolls)
    port = free_port()
    yaml = (
        f'listen: "tcp:{port}:interface=127.0.0.1"\nlisten_reuse_port: true\n'
        f"hosts:\n  slow: {slow.url}\n"
        "routes:\n  lab: {hosts: [slow], default_model: tiny-a}\n"
    )
    daemon = start_daemon(tmp_path, yaml, port=port)  # returns once the port accepts
    try:
        assert _ask(port, ASK) == "200"
        assert daemon.wait(lambda: "lab slow POST" in daemon.output(), 5), daemon.log()
        log = daemon.output()
        assert log.index("host slow is up") < log.index("lab slow POST"), log
    finally:
        daemon.stop()
        slow.shutdown()
