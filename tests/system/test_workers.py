"""``workers: N``: several processes share the port, and metrics gather them all."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from zope.interface import implementer

from crossbar.config import ConfigError, parse_config, tcp_address
from crossbar.pages.peers import WorkerInfo
from crossbar.stats.metrics import merge_workers
from crossbar.testing import SimulatedHost
from crossbar.workers import WorkerProcesses
from crossbar.workers.supervisor import STOP_GRACE
from tests.support import free_port, guard, start_daemon
from tests.support.processes import alive, beside, children, fetch, wait_until


def test_tcp_address() -> None:
    assert tcp_address("tcp:7777") == ("", 7777, 1024)
    assert tcp_address("tcp:7777:interface=127.0.0.1:backlog=50") == ("127.0.0.1", 7777, 50)
    with pytest.raises(ValueError, match="need a plain tcp: port"):
        tcp_address("unix:/tmp/x.sock")
    with pytest.raises(ValueError, match="cannot use"):
        tcp_address("tcp:7777:reuse=true")


def test_workers_need_a_tcp_listen_address() -> None:
    doc: dict[str, Any] = {
        "listen": "unix:/tmp/crossbar.sock",
        "workers": 2,
        "hosts": {"a": "http://127.0.0.1:1"},
        "routes": {"r": {"hosts": ["a"]}},
    }
    with pytest.raises(ConfigError, match=r"listen: workers and listen_reuse_port need a plain"):
        parse_config(doc)
    doc["workers"] = 0
    with pytest.raises(ConfigError, match="workers: must be a whole number"):
        parse_config(doc)
    doc["listen"], doc["workers"] = 7777, 2
    assert parse_config(doc).workers == 2


def test_merge_labels_every_sample_by_worker() -> None:
    one = b'# HELP x_total Things.\n# TYPE x_total counter\nx_total{host="a"} 3.0\n'
    two = b'# HELP x_total Things.\n# TYPE x_total counter\nx_total{host="a"} 4.0\n'
    merged = merge_workers({"0": one, "1": two}).decode()
    assert merged.count("# TYPE x_total counter") == 1
    assert 'x_total{host="a",worker="0"} 3.0' in merged
    assert 'x_total{host="a",worker="1"} 4.0' in merged


def run_two_workers(tmp_path: Path, sim_url: str) -> dict[str, Any]:
    daemon = start_daemon(
        tmp_path,
        "workers: 2\npoll_interval: 200ms\n"
        f"hosts:\n  gpu-a: {sim_url}\nroutes:\n  lab:\n    hosts: [gpu-a]\n",
    )
    result: dict[str, Any] = {}
    try:
        base = daemon.url
        first = wait_until(lambda: children(daemon.proc.pid), "worker 1 to start")
        wait_until(lambda: b'worker="1"' in fetch(base + "/_crossbar/metrics"), "worker 1")

        def served() -> bool:
            for _ in range(10):  # each a new connection, spread by the kernel
                with contextlib.suppress(OSError):
                    fetch(base + "/lab/v1/models")
            metrics = fetch(base + "/_crossbar/metrics").decode()
            lines = [line for line in metrics.splitlines() if "crossbar_requests_total{" in line]
            return all(any(f'worker="{w}"' in line for line in lines) for w in "01")

        result["both_served"] = wait_until(served, "both workers to serve requests")
        (child,) = first
        os.kill(child, signal.SIGKILL)
        result["restarted"] = wait_until(
            lambda: children(daemon.proc.pid) - {child}, "worker 1 to be started again"
        )
    finally:
        result["code"] = daemon.terminate()  # SIGTERM alone: a worker left over is seen
        result["output"] = daemon.output()
        result["left"] = {pid for pid in result.get("restarted", set()) if alive(pid)}
        daemon.stop()
    return result


@pytest_twisted.ensureDeferred
async def test_two_workers_share_the_port_and_stop_together(tmp_path: Path) -> None:
    result = await beside(SimulatedHost({"m1": "loaded"}), run_two_workers, tmp_path)
    assert result["code"] == 0, result["output"]
    assert result["both_served"]
    assert result["restarted"]  # a worker that died was started again
    assert "worker-1 was killed by SIGKILL; starting it again" in result["output"]
    assert result["left"] == set()  # no worker outlives crossbar


@implementer(ILogObserver)
class LogLines:
    """This process's log lines as they come, and a Deferred for the next one that matches."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._wanted: list[tuple[tuple[str, ...], Deferred[str]]] = []
        globalLogPublisher.addObserver(self)

    def __call__(self, event: LogEvent) -> None:
        line = formatEvent(event) or ""
        self.lines.append(line)
        for wanted in list(self._wanted):
            if all(part in line for part in wanted[0]):
                self._wanted.remove(wanted)
                wanted[1].callback(line)

    def next(self, *parts: str) -> Deferred[str]:
        """Fires with the next line that contains every one of ``parts``."""
        d: Deferred[str] = Deferred()
        self._wanted.append((parts, d))
        return d

    def close(self) -> None:
        globalLogPublisher.removeObserver(self)


def worker_pid(workers: WorkerProcesses, name: str) -> int:
    pid: int = workers.monitor.protocols[name].transport.pid  # type: ignore[union-attr]
    return pid


@pytest_twisted.ensureDeferred
async def test_a_worker_killed_with_sigkill_is_started_again(tmp_path: Path, reactor: Any) -> None:
    """Real children of this process: killed, started again, then stopped and waited for."""
    sim = SimulatedHost({"m1": "loaded"})
    await sim.listen(0, "127.0.0.1")
    config = tmp_path / "crossbar.yaml"
    config.write_text(
        f'listen: "tcp:{free_port()}:interface=127.0.0.1"\nworkers: 2\n'
        f"hosts:\n  gpu-a: {sim.url}\nroutes:\n  lab:\n    hosts: [gpu-a]\n"
    )
    workers = WorkerProcesses(reactor, str(config), WorkerInfo(0, 2, str(tmp_path)))
    log = LogLines()
    up = log.next("[worker-1] host gpu-a is up")
    workers.startService()
    try:
        await guard(up, 30, "worker 1 to start")
        first = worker_pid(workers, "worker-1")
        ended = log.next("worker-1 was killed by SIGKILL; starting it again in 1s")
        up = log.next("[worker-1] host gpu-a is up")
        os.kill(first, signal.SIGKILL)
        await guard(ended, 10, "worker 1's end to be seen")
        await guard(up, 30, "worker 1 to start again")
        second = worker_pid(workers, "worker-1")
        assert second != first
    finally:
        await guard(workers.stopService(), STOP_GRACE + 5, "the workers to stop")
        log.close()
        await sim.stop()
    assert not alive(second)  # stop waited for it
    assert "worker-1 exited with code 0" in log.lines  # SIGTERM: a clean stop
    assert log.lines.count("[worker-1] host gpu-a is up") == 2  # one line per output line
