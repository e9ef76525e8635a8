"""Plain HTTP to real llama-server routers and the crossbar in front of them (the test
process talks to separate processes: no reactor needed), and a wait on what they say."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from tests.integration.conftest import CrossbarProcess, CrossbarStarter, RouterProcess

T = TypeVar("T")

POLL = "250ms"
SEEN_TIMEOUT = 10.0  # crossbar must notice a router's change within a few polls
REQUEST_TIMEOUT = 60.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def host(self) -> str | None:
        """The host crossbar chose (``X-Crossbar-Host``)."""
        return self.headers.get("x-crossbar-host")


def request(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = REQUEST_TIMEOUT,
    key: str | None = None,
) -> Answer:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            raw = response.read()
            return Answer(response.status, lowered(response.headers.items()), raw)
    except urllib.error.HTTPError as e:
        return Answer(e.code, lowered(e.headers.items()), e.read())


def lowered(items: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in items}


def models_of(router: RouterProcess) -> dict[str, dict[str, Any]]:
    """The router's own ``/v1/models``: model id -> its ``status`` object."""
    answer = request("GET", f"{router.url}/v1/models", timeout=10)
    assert answer.status == 200, answer
    return {entry["id"]: entry["status"] for entry in answer.json()["data"]}


def statuses_of(router: RouterProcess) -> dict[str, str]:
    """The router's own view: model id -> ``loaded`` / ``unloaded`` / ``loading`` / ..."""
    return {name: status["value"] for name, status in models_of(router).items()}


def crossbar_status(proxy: CrossbarProcess, key: str | None = None) -> dict[str, Any]:
    """crossbar's status JSON (``key``: a status key, where the pages want one)."""
    answer = request("GET", f"{proxy.url}/_crossbar/status", timeout=10, key=key)
    assert answer.status == 200, f"GET /_crossbar/status answered {answer.status}: {answer.body!r}"
    doc: dict[str, Any] = answer.json()
    return doc


def one_host_crossbar(
    crossbar_process: CrossbarStarter, router: RouterProcess, model: str
) -> tuple[CrossbarProcess, Callable[[], dict[str, Any]]]:
    """crossbar with ``router`` as its one host ``gpu-a`` (route ``lab`` defaulting to
    ``model``), and a reader of what its status says of that host."""
    proxy = crossbar_process(
        {
            "poll_interval": POLL,
            "hosts": {"gpu-a": router.url},
            "routes": {"lab": {"hosts": ["gpu-a"], "default_model": model}},
        }
    )

    def host() -> dict[str, Any]:
        doc: dict[str, Any] = crossbar_status(proxy)["hosts"]["gpu-a"]
        return doc

    return proxy, host


def wait_until(
    probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05
) -> T:
    """Call ``probe`` until it returns something other than None/False; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting until {what}", pytrace=False)
        time.sleep(interval)


def stream_raw(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """POST and read a whole streamed answer with http.client (status, headers, raw body)."""
    target = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", target.path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, lowered(response.getheaders()), response.read()
    finally:
        conn.close()
