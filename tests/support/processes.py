"""Other processes seen from a test: a process's children, whether one is alive, a bounded
wait for their state, and a plain HTTP GET (for tests that run in a thread)."""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from twisted.internet.threads import deferToThread

from crossbar.testing import SimulatedHost
from tests.support import Daemon, start_daemon

T = TypeVar("T")


def children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def wait_until(check: Any, what: str, limit: float = 20.0) -> Any:
    """Poll another process's state (a bounded wait, for work done outside this process)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        body: bytes = r.read()
        return body


async def beside(sim: SimulatedHost, work: Callable[[Path, str], T], tmp: Path) -> T:
    """``work(tmp, sim's URL)`` run in a thread (it starts and waits on other processes)
    while ``sim`` serves from this reactor; the host stopped after."""
    await sim.listen(0, "127.0.0.1")
    try:
        return await deferToThread(work, tmp, sim.url)
    finally:
        await sim.stop()


@contextmanager
def replicas(
    tmp_path: Path, config: str, ready: Callable[[Daemon], bool], what: str, count: int = 2
) -> Iterator[list[Daemon]]:
    """``count`` crossbars of one config, each in a folder of its own, once each is
    ``ready``; stopped after."""
    started: list[Daemon] = []
    try:
        for n in range(count):
            folder = tmp_path / f"replica-{n}"
            folder.mkdir()
            started.append(start_daemon(folder, config))
        for replica in started:
            wait_until(lambda r=replica: ready(r), what)
        yield started
    finally:
        for replica in started:
            replica.stop()
