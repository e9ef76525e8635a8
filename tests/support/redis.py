"""A real Redis server for the tests of the shared store (``shared_state``): Debian's
``redis-server`` on a free loopback port, its data in memory only. Without it the tests
are skipped, except in CI, which must run them (``.ci/run`` installs it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest

START_TIMEOUT = 10.0


def redis_binary() -> str:
    """``redis-server``'s path; the test is skipped without it (failed when CI is set)."""
    found = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin:/usr/sbin")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed, and CI must run this test")
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    return found


@attrs.define
class RedisServer:
    """One running redis-server; :meth:`stop` and :meth:`start` again on the same port."""

    binary: str
    folder: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if not self.port:
            self.port = _free_port()
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise AssertionError(f"redis-server did not listen on {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def running_redis(folder: Path) -> Iterator[RedisServer]:
    """A redis-server for the block, stopped after it."""
    server = RedisServer(redis_binary(), folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()
