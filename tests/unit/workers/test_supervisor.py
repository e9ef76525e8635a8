"""``WorkerProcesses`` on a fake reactor: back-off, output lines, and a stop that waits.

The fake reactor is a ``Clock`` whose ``spawnProcess`` hands back a ``FakeChild``;
a test ends a child, writes its output or checks the signals it got.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import IProcessProtocol
from twisted.internet.task import Clock
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from crossbar.http.listener import INTERNAL_LISTENER
from crossbar.pages.peers import WorkerInfo
from crossbar.workers import WorkerProcesses
from crossbar.workers.__main__ import print_event
from crossbar.workers.supervisor import (
    LINE_LIMIT,
    MAX_RESTART_DELAY,
    STOP_GRACE,
    THRESHOLD,
    describe_end,
)
from tests.support import LogCapture


class FakeChild:
    """A child process that does what the test says."""

    def __init__(self, protocol: IProcessProtocol, args: list[str], env: dict[str, str]) -> None:
        self.protocol = protocol
        self.args = args
        self.env = env
        self.signals: list[str] = []
        self.ended = False
        self.pid = 4242

    def signalProcess(self, name: str) -> None:
        if self.ended:
            raise ProcessExitedAlready()
        self.signals.append(name)

    def print(self, data: bytes, fd: int = 1) -> None:
        self.protocol.childDataReceived(fd, data)

    def end(self, reason: Exception) -> None:
        self.ended = True
        self.protocol.processEnded(Failure(reason))


class FakeReactor(Clock):
    """A Clock that records the processes it is asked to start."""

    def __init__(self) -> None:
        super().__init__()
        self.children: list[FakeChild] = []

    def spawnProcess(self, protocol: IProcessProtocol, executable: str, args: list[str],
                     env: dict[str, str], *rest: Any) -> FakeChild:  # fmt: skip
        assert executable == args[0]
        child = FakeChild(protocol, args, env)
        protocol.makeConnection(child)  # type: ignore[arg-type]
        self.children.append(child)
        return child

    def of(self, index: int) -> list[FakeChild]:
        """The children started for worker ``index``, oldest first."""
        return [c for c in self.children if c.args[c.args.index("--index") + 1] == str(index)]


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    yield capture
    capture.close()


def started(count: int = 2) -> tuple[FakeReactor, WorkerProcesses]:
    clock = FakeReactor()
    workers = WorkerProcesses(clock, "/etc/crossbar.yaml", WorkerInfo(0, count, "/run/x"))
    workers.startService()
    return clock, workers


CRASH = ProcessTerminated(exitCode=1)


def test_workers_1_to_n_are_started_as_python_m_crossbar_workers() -> None:
    clock, _ = started(count=3)
    assert [c.args for c in clock.children] == [
        [sys.executable, "-m", "crossbar.workers", "--config", "/etc/crossbar.yaml",
         "--index", str(i), "--count", "3", "--run-dir", "/run/x"]
        for i in (1, 2)
    ]  # fmt: skip
    # ProcessMonitor's default environment is empty: the children need ours (PATH, venv).
    assert all(c.env["PATH"] == os.environ["PATH"] for c in clock.children)


def test_a_worker_that_keeps_dying_waits_twice_as_long_each_time(logs: LogCapture) -> None:
    clock, workers = started()
    expected = [1, 2, 4, 8, 16, 32, 60, 60]
    assert expected[-1] == MAX_RESTART_DELAY
    for n, delay in enumerate(expected, start=1):
        clock.advance(THRESHOLD - 1)  # dies while starting (a start takes seconds)
        clock.of(1)[-1].end(CRASH)
        lines = logs.matching("worker-1 exited with code 1")
        assert len(lines) == n  # one line per death, no more
        assert lines[-1] == f"worker-1 exited with code 1; starting it again in {delay}s"
        clock.advance(delay - 0.5)
        assert len(clock.of(1)) == n
        clock.advance(0.5)
        assert len(clock.of(1)) == n + 1
    workers.stopService()


def test_a_worker_that_ran_long_enough_is_started_again_at_once(logs: LogCapture) -> None:
    clock, workers = started()
    for delay in (1, 2, 4):
        clock.of(1)[-1].end(CRASH)
        clock.advance(delay)
    clock.advance(THRESHOLD)  # this one ran long enough: its start went well
    clock.of(1)[-1].end(ProcessTerminated(signal=9))
    assert logs.matching("worker-1")[-1] == "worker-1 was killed by SIGKILL; starting it again now"
    clock.advance(0)
    assert len(clock.of(1)) == 5
    clock.of(1)[-1].end(CRASH)  # the back-off starts again from 1 s
    assert logs.matching("worker-1")[-1].endswith("starting it again in 1s")
    workers.stopService()


def test_output_lines_are_logged_one_by_one_with_the_worker_name(logs: LogCapture) -> None:
    clock, workers = started(count=3)
    one, two = clock.children
    one.print(b"host gpu-a is up\nlisten")
    two.print(b"Traceback (most recent call last):\n", fd=2)
    one.print(b"ing on 7777\n\n")
    one.print(b"no newline at the end")
    one.end(CRASH)
    output = [e for e in logs.events if "stream" in e]
    assert [logs.lines[logs.events.index(e)] for e in output] == [
        "[worker-1] host gpu-a is up",
        "[worker-2] Traceback (most recent call last):",
        "[worker-1] listening on 7777",
        "[worker-1] no newline at the end",
    ]  # and no blank line for the empty one, nor for each stream at the end
    assert {e["log_namespace"] for e in output} == {"crossbar.workers"}
    assert [e["log_level"] for e in output] == [LogLevel.info] * 4
    workers.stopService()


def test_a_line_too_long_for_the_line_reader_is_cut_not_fatal(logs: LogCapture) -> None:
    clock, workers = started()
    (child,) = clock.children
    child.print(b"x" * (LINE_LIMIT - 10))
    child.print(b"y" * (LINE_LIMIT + 20) + b"\nafter\n")
    lines = logs.matching("[worker-1]")
    assert [len(line) for line in lines[:3]] == [len("[worker-1] ") + LINE_LIMIT] * 2 + [21]
    assert lines[0].endswith("x" * (LINE_LIMIT - 10) + "y" * 10)
    assert lines[3] == "[worker-1] after"
    assert not [e for e in logs.events if e.get("log_failure") or e.get("isError")]
    workers.stopService()


def test_stop_sends_term_then_kill_after_the_grace_and_waits_for_every_child() -> None:
    clock, workers = started(count=3)
    one, two = clock.children
    stopped = workers.stopService()
    assert one.signals == two.signals == ["TERM"]
    clock.advance(STOP_GRACE - 0.5)
    assert one.signals == ["TERM"]
    clock.advance(0.5)
    assert one.signals == two.signals == ["TERM", "KILL"]
    fired: list[object] = []
    stopped.addCallback(fired.append)
    one.end(ProcessTerminated(signal=9))
    assert not fired  # worker 2 still runs
    two.end(ProcessTerminated(signal=9))
    assert fired == [None]
    assert clock.getDelayedCalls() == []  # no restart after a stop
    assert len(clock.children) == 2


def test_a_child_that_exits_on_term_is_not_killed(logs: LogCapture) -> None:
    clock, workers = started()
    (child,) = clock.children
    stopped = workers.stopService()
    fired: list[object] = []
    stopped.addCallback(fired.append)
    child.end(ProcessDone(0))
    assert fired == [None]
    assert clock.getDelayedCalls() == []  # the KILL is called off
    assert child.signals == ["TERM"]
    assert logs.matching("worker-1") == ["worker-1 exited with code 0"]


def test_stop_between_a_death_and_the_restart_fires_at_once() -> None:
    clock, workers = started()
    clock.children[0].end(CRASH)
    fired: list[object] = []
    workers.stopService().addCallback(fired.append)
    assert fired == [None]
    assert clock.getDelayedCalls() == []  # the restart is called off
    clock.advance(MAX_RESTART_DELAY)
    assert len(clock.children) == 1


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        (ProcessDone(0), "exited with code 0"),
        (ProcessTerminated(exitCode=2), "exited with code 2"),
        (ProcessTerminated(signal=15), "was killed by SIGTERM"),
        (ProcessTerminated(signal=200), "was killed by signal 200"),
        (OSError("no such file"), "ended: no such file"),
    ],
)
def test_how_a_worker_ended_in_words(reason: Exception, words: str) -> None:
    assert describe_end(Failure(reason)) == words


def test_a_worker_prints_its_events_without_twisted_chatter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def event(namespace: str, level: LogLevel, text: str, **more: Any) -> dict[str, Any]:
        return {"log_namespace": namespace, "log_level": level, "log_format": text, **more}

    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        failure = Failure()
    print_event(event("twisted.web.server", LogLevel.info, "Site starting on 7777"))
    print_event(event("crossbar.service", LogLevel.info, "host {h} is up", h="gpu-a"))
    print_event(event("twisted.internet.defer", LogLevel.critical, "Unhandled error"))
    print_event(event("crossbar.pages", LogLevel.error, "broken", log_failure=failure))
    # tcp.Port's own line for an internal port (legacy log.msg), as twistd's log leaves out
    internal = f"{INTERNAL_LISTENER} starting on 40123"
    print_event({"log_namespace": "log_legacy", "message": (internal,), "log_format": internal})
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["host gpu-a is up", "Unhandled error", "broken"]
    assert out[-1] == "builtins.ZeroDivisionError: division by zero"
