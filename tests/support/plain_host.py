"""A host in this process, plain HTTP with no simulator: for tests that need a host
whose timings or memory they control exactly."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time


class PlainHost(http.server.BaseHTTPRequestHandler):
    """A host in this process: lists one model, answers polls after ``poll_delay`` for
    each of its two requests, and a completion as soon as it has read the request's body
    (the simulator would read a 15 MiB body with json.loads, and take a CPU for a second
    from the processes measured)."""

    protocol_version = "HTTP/1.1"
    model = "tiny-b"
    poll_delay = 0.0
    received: list[bytes] = []
    """The SHA-256 of every request body it read (a subclass keeps a list of its own
    by setting one)."""

    def do_GET(self) -> None:
        time.sleep(self.poll_delay)
        if self.path == "/health":
            self.answer({"status": "ok"})
        else:
            self.answer({"data": [{"id": self.model, "status": {"value": "loaded"}}]})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(hashlib.sha256(body).digest())
        message = {"role": "assistant", "content": "ok"}
        self.answer({"model": self.model, "choices": [{"index": 0, "message": message}]})

    def answer(self, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class PlainHosts(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # crossbar closing a kept-alive connection is no error

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def serve_plain(handler: type[PlainHost]) -> PlainHosts:
    server = PlainHosts(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
