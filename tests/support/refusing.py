"""Two crossbars that answer each of their own errors, for the tests that run a client
against them and read what it prints (the agents, OpenCode, the OpenAI Node SDK).

One crossbar has no keys: route ``nope`` does not exist (404), route ``lab``'s one host,
``gpu-c``, is down (503: ``no healthy host for route lab: gpu-c down (health: connection
refused)``), route ``broken``'s host answers what is not HTTP (502) and route ``slow``'s
never answers (504). The other wants the key ``right-key`` and takes bodies up to 1 KiB
(401 with another key, 413 with a longer body). The hosts that answer wrong are named
``gpu-a`` and ``gpu-b`` in the config, the names docs/clients.md shows in the errors.
Each is ready once its hosts' first polls are in: the words of each error are known.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support import free_port, http_status, start_daemon

READY_TIMEOUT = 30.0


class _Host(BaseHTTPRequestHandler):
    """A host that is healthy to polls and answers requests wrong: ``hang`` never answers
    (crossbar: 504), ``bad`` answers what is not HTTP (crossbar: 502)."""

    server: _HostServer

    def do_GET(self) -> None:
        body = b'{"status":"ok"}' if self.path == "/health" else b'{"data":[],"object":"list"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.server.mode == "hang":
            self.server.stopping.wait(60)
        else:
            self.wfile.write(b"HTTP/1.1 999 Nonsense\r\n\r\n")
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class _HostServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Host)
        self.mode = mode
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def refusing_crossbars(folder: Callable[[], Path]) -> Iterator[dict[str, str]]:
    """By status, the base URL (without ``/v1``) and the key with which crossbar answers
    that error itself: ``"401": "http://127.0.0.1:40123/lab wrong-key"``. ``folder``
    makes an empty folder for each crossbar."""
    hosts = [_HostServer("hang"), _HostServer("bad")]
    for server in hosts:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    hang, bad = hosts
    down = f"http://127.0.0.1:{free_port()}"
    plain = keyed = None
    try:
        plain = start_daemon(
            folder(),
            f"poll_interval: 250ms\nhosts:\n  gpu-c: {down}\n"
            f"  gpu-a: {{url: {bad.url}, max_fails: 1000}}\n"
            f"  gpu-b: {{url: {hang.url}, header_timeout: 1s, max_fails: 1000}}\n"
            "routes:\n  lab: {hosts: [gpu-c]}\n  broken: {hosts: [gpu-a]}\n"
            "  slow: {hosts: [gpu-b]}\n",
        )
        keyed = start_daemon(
            folder(),
            f"max_body: 1KiB\napi_keys: [right-key]\nhosts:\n  gpu-c: {down}\n"
            "routes:\n  lab: {hosts: [gpu-c]}\n",
        )
        for route in ("slow", "broken"):
            ready = plain.wait(
                lambda r=route: http_status(f"{plain.url}/{r}/v1/models") == 200, READY_TIMEOUT
            )
            assert ready, plain.log()
        down_said = plain.wait(lambda: "host gpu-c is down" in plain.output(), READY_TIMEOUT)
        assert down_said, plain.log()
        yield {
            "401": f"{keyed.url}/lab wrong-key",
            "413": f"{keyed.url}/lab right-key",
            "404": f"{plain.url}/nope unused",
            "503": f"{plain.url}/lab unused",
            "502": f"{plain.url}/broken unused",
            "504": f"{plain.url}/slow unused",
        }
    finally:
        for daemon in (plain, keyed):
            if daemon is not None:
                daemon.stop()
        for server in hosts:
            server.stopping.set()
            server.shutdown()
            server.server_close()
