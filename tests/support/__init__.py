"""Helpers only crossbar's own tests need: crossbar and llama-server as real processes
(``twistd``), their memory, a port that never accepts, hand-written requests, npm packages
(the clients the tests run) installed once into a cache.

The helpers anyone testing against crossbar may want (the in-process rig, the streaming
reader, log capture, bounded waits) are public in :mod:`crossbar.testing`; they are
re-exported here for the tests that import them from this module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from shutil import which
from typing import Any, Self

import attrs
from twisted.internet.interfaces import IPushProducer
from twisted.web.iweb import IResponse
from zope.interface import implementer

from crossbar.testing import (
    FAST,
    LogCapture,
    Reader,
    Rig,
    RigMaker,
    all_polled,
    broken,
    build,
    eventually,
    fast,
    guard,
    rigs,
    teardown,
    turns,
    wait_state,
)

__all__ = [
    "FAST",
    "REPO",
    "TWISTD",
    "Blackhole",
    "Daemon",
    "LogCapture",
    "Reader",
    "Rig",
    "RigMaker",
    "accepts",
    "all_polled",
    "broken",
    "build",
    "eventually",
    "fast",
    "free_port",
    "guard",
    "header",
    "http_status",
    "memory",
    "raw_request",
    "rigs",
    "start_daemon",
    "teardown",
    "turns",
    "wait_state",
]

REPO = Path(__file__).resolve().parents[2]
_NEXT_TO_PYTHON = Path(sys.executable).with_name("twistd")
TWISTD = str(_NEXT_TO_PYTHON if _NEXT_TO_PYTHON.exists() else which("twistd") or _NEXT_TO_PYTHON)
"""``twistd`` of the running interpreter's environment."""


def header(response: IResponse, name: str) -> str | None:
    """The first value of a response header, if any."""
    values = response.headers.getRawHeaders(name.encode())
    return values[0].decode() if values else None


def raw_request(port: int, path: str, body: bytes, extra: bytes = b"") -> bytes:
    """The bytes of a POST request, written by hand."""
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), port, len(body), extra, body)
    )


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


# -- servers as separate processes ------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return None


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
    """A server this test run started on 127.0.0.1 (crossbar under ``twistd``, a real
    ``llama-server``), with its output in a file."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @classmethod
    def start(
        cls,
        args: Sequence[str],
        port: int,
        log_path: Path,
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> Self:
        """Run ``args`` in a session of its own, so that :meth:`stop` can end whatever it
        started too (a router's model servers, crossbar's workers); ``fields`` are a
        subclass's own."""
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                list(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        return cls(proc, port, log_path, **fields)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123`` (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        """Its whole log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    log_text = output  # the name the integration tests read it by

    def log(self, lines: int = 40) -> str:
        """The last lines of its log, for a failure message."""
        return "\n".join(self.output().splitlines()[-lines:]) or "(no log)"

    def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Poll ``ready()`` until it holds; False if the process exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if ready():
                return True
            time.sleep(0.05)
        return False

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM it and wait, as a service manager stops it; its exit code. What it started
        is left alone, for a test to see whether anything outlives it (:meth:`stop` ends that)."""
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM it, then SIGKILL its whole session, so nothing outlives the test;
        idempotent. Its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=timeout)


def demo_route_ready(daemon: Daemon) -> bool:
    """Whether ``crossbar --demo``'s route lists its models (its hosts' first polls are in)."""
    return http_status(f"{daemon.url}/opencode/v1/models") == 200


PORT_TAKEN = "address already in use"
"""What crossbar's log says when its port was taken (by another process, or by its own
simulated fleet, which listens on ports the kernel picks) between the choice and the listen."""


def start_daemon(
    tmp: Path,
    yaml: str | None,
    *,
    port: int | None = None,
    timeout: float = 30.0,
    args: Sequence[str] = (),
    twistd_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    ready: Callable[[Daemon], bool] | None = None,
) -> Daemon:
    """Start ``twistd -n [twistd_args] crossbar -c crossbar.yaml [args]`` with ``yaml`` as
    its config, in ``tmp``, and wait for its port (unless ``wait`` is false: a start meant
    to fail), then for ``ready``, if given, within ``timeout``. Unless ``port`` says which
    one it listens on, it listens on a free port (``listen`` added to ``yaml``, or
    ``--listen`` to ``args`` when ``yaml`` is None: no config file, as with ``--demo``),
    chosen again, up to three times, when it was taken before crossbar listened on it.
    ``env`` is added to this process's environment. This checkout's crossbar runs,
    installed or not."""
    for attempt in range(3):
        daemon = _start_daemon(tmp, yaml, port, args, twistd_args, env)
        if not wait:
            return daemon
        up = _started(daemon, ready, timeout)
        if up and PORT_TAKEN not in daemon.output():
            return daemon
        code = daemon.stop()
        if port is None and PORT_TAKEN in daemon.output() and attempt < 2:
            continue
        raise AssertionError(
            f"crossbar did not get ready on port {daemon.port} (exit code {code}):\n"
            + daemon.output()
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _started(daemon: Daemon, ready: Callable[[Daemon], bool] | None, timeout: float) -> bool:
    if not daemon.wait(lambda: accepts(daemon.port), timeout):
        return False
    return ready is None or daemon.wait(lambda: ready(daemon), timeout)


def _start_daemon(
    tmp: Path,
    yaml: str | None,
    port: int | None,
    args: Sequence[str],
    twistd_args: Sequence[str],
    env: Mapping[str, str] | None,
) -> Daemon:
    crossbar = list(args)
    if port is None:
        port = free_port()
        listen = f"tcp:{port}:interface=127.0.0.1"
        if yaml is None:
            crossbar += ["--listen", listen]
        else:
            yaml = f'listen: "{listen}"\n{yaml}'
    if yaml is not None:
        (tmp / "crossbar.yaml").write_text(yaml)
        crossbar = ["-c", "crossbar.yaml", *crossbar]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    argv = [TWISTD, "-n", "--pidfile=", *twistd_args, "crossbar", *crossbar]
    environ = {**os.environ, **(env or {}), "PYTHONPATH": path}
    return Daemon.start(argv, port, tmp / "crossbar.log", cwd=tmp, env=environ)


@implementer(IPushProducer)
class RecordingProducer:
    """A push producer that records what it is asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")

    def stopProducing(self) -> None:
        self.calls.append("stop")


ROUTER_LISTING = {
    "object": "list",
    "data": [
        {"id": "tiny-b", "object": "model", "status": {"value": "loaded", "args": []}},
        {"id": "tiny-a", "object": "model", "status": {"value": "loaded", "args": []}},
        {"id": "tiny-c", "object": "model", "status": {"value": "loading", "args": []}},
        {"id": "tiny-d", "object": "model", "status": {"value": "unloaded", "failed": True}},
    ],
}
"""A router's /v1/models: two models loaded, one loading, one that failed to load."""


def start_simulator(tmp: Path, *options: str, timeout: float = 20.0) -> Daemon:
    """``python -m crossbar.testing.simulator`` as a process of its own on a free port, for a
    crossbar daemon to stand in front of when the test process is busy being a client."""
    port = free_port()
    args = [sys.executable, "-m", "crossbar.testing.simulator", "--listen", str(port), *options]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    daemon = Daemon.start(args, port, tmp / "simulator.log", cwd=tmp, env=env)
    if not daemon.wait(lambda: accepts(port), timeout):
        code = daemon.stop()
        raise AssertionError(f"the simulator did not listen (exit code {code}):\n{daemon.output()}")
    return daemon
