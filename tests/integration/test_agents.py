"""Claude Code and Codex through crossbar against the real llama-server router.

One ``claude -p`` and one ``codex exec`` each talk to a real router (tiny random model,
``-c 32768``: Codex sends about 20,000 prompt tokens for "say hi", Claude Code about 16,000)
through crossbar, via a relay on loopback that records the bytes both ways. Every request must
be answered 200, in crossbar's access log and in the recording, by a stream that ends
properly: ``message_stop`` last for Anthropic's Messages API, ``response.completed`` for
Responses. The pinned agents are installed as in the default run (``tests/support/agents.py``).

A tiny random model rarely samples its end token, so an answer runs to its limit: the
router is started with ``-n 64`` (Codex names no limit), and Claude Code, which asks for
32,000 tokens, is told ``CLAUDE_CODE_MAX_OUTPUT_TOKENS=64``; it then exits 1, saying the
answer "exceeded the 64 output token maximum", after every request was answered. Codex
exits 0. This build skips Codex's tools other than ``function`` (llama.cpp issue 20156 was
a refusal of them): a refusal would show here as a request answered 400, named below.
About a minute each on two cores, most of it the prompt's processing.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.support import http_status
from tests.support.agents import claude, codex, install_claude, install_codex

pytestmark = pytest.mark.integration

MODEL = "tiny-a"
ROUTER_ARGS = ("-c", "32768", "--override-kv", "llama.context_length=int:32768", "-n", "64")
RUN_TIMEOUT = 300.0
READY_TIMEOUT = 30.0


# -- a relay that records ------------------------------------------------------------------------


class Recorder:
    """A loopback port that relays every connection to ``port`` and keeps its bytes."""

    def __init__(self, port: int) -> None:
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connections: list[tuple[bytearray, bytearray]] = []  # (asked, answered)
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            asked, answered = bytearray(), bytearray()
            self.connections.append((asked, answered))
            self._sockets += [client, upstream]
            for source, sink, kept in ((client, upstream, asked), (upstream, client, answered)):
                threading.Thread(target=_pump, args=(source, sink, kept), daemon=True).start()

    def exchanges(self) -> list[Exchange]:
        """Every request and its answer so far, in order per connection."""
        found = []
        for asked, answered in list(self.connections):
            requests = _messages(bytes(asked), request=True)
            answers = [a for a in _messages(bytes(answered), request=False) if a[0][9:10] != b"1"]
            found += [Exchange(q[0], a[0], a[2]) for q, a in zip(requests, answers, strict=False)]
        return found

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _pump(source: socket.socket, sink: socket.socket, kept: bytearray) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            kept += data
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)


@attrs.frozen
class Exchange:
    request: bytes  # the request line
    status: bytes  # the status line
    body: bytes  # de-chunked


def _messages(data: bytes, *, request: bool) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """HTTP/1.1 messages one after another in ``data``: (first line, headers, body)."""
    found = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        first, *lines = head.split(b"\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in lines)}
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while rest:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0] or b"0", 16)
                body, rest = body + rest[:size], rest[size + 2 :]
                if size == 0:
                    break
        elif b"content-length" in headers:
            size = int(headers[b"content-length"])
            body, rest = rest[:size], rest[size:]
        else:
            body, rest = (b"", rest) if request else (rest, b"")
        found.append((first, headers, body))
        data = rest
    return found


def last_event(body: bytes) -> str | None:
    """The name of an SSE stream's last ``event:``."""
    names = re.findall(rb"^event: (\S+)$", body, re.MULTILINE)
    return names[-1].decode() if names else None


# -- the fleet -------------------------------------------------------------------------------------


@pytest.fixture
def crossbar_url(
    tiny_models: Callable[..., Path],
    llama_router: Any,
    crossbar_process: Any,
) -> Iterator[tuple[Recorder, Any]]:
    """A real router with one tiny model behind crossbar's route ``lab``, and a recorder
    in front of crossbar."""
    router = llama_router(tiny_models(MODEL), extra_args=ROUTER_ARGS)
    proxy = crossbar_process(
        {
            "poll_interval": "250ms",
            "hosts": {"gpu": router.url},
            "routes": {"lab": {"hosts": ["gpu"], "default_model": MODEL}},
        }
    )
    ready = proxy.wait(lambda: http_status(f"{proxy.url}/lab/v1/models") == 200, READY_TIMEOUT)
    assert ready, proxy.log()
    recorder = Recorder(proxy.port)
    try:
        yield recorder, proxy
    finally:
        recorder.close()


def check_every_request(
    recorder: Recorder, proxy: Any, path: str, end: str, report: str
) -> list[Exchange]:
    """Every request to route ``lab``'s ``path`` answered 200 by a stream whose last event
    is ``end``, and logged so by crossbar; the exchanges."""
    asked = f"/lab{path}".encode()
    exchanges = [e for e in recorder.exchanges() if e.request.split()[1].split(b"?")[0] == asked]
    assert exchanges, f"no request to {path} was made\n{report}"
    for exchange in exchanges:
        why = f"{exchange.request!r} -> {exchange.status!r}: {exchange.body[:500]!r}\n{report}"
        assert exchange.status.split()[1] == b"200", why
        assert last_event(exchange.body) == end, why
    pattern = rf"lab gpu POST {re.escape(path)} (\d+) "

    def logged() -> list[str]:
        return re.findall(pattern, proxy.output())

    # A request's line is written within 0.1 s of its end (a batch at a time), and the
    # agent may exit sooner than that after its last answer.
    proxy.wait(lambda: len(logged()) >= len(exchanges), 5.0)
    # An agent may close its connection as soon as it has read the last event, before
    # llama-server's end of the chunked answer reaches crossbar: that answer was whole,
    # and is logged 200 like the others. Anything else is a failure.
    statuses = logged()
    assert len(statuses) == len(exchanges), f"{statuses}\n{proxy.log()}"
    assert set(statuses) == {"200"}, f"{statuses}\n{proxy.log()}"
    return exchanges


def test_claude_code_completes_every_request_against_a_real_router(
    crossbar_url: tuple[Recorder, Any], tmp_path: Path
) -> None:
    recorder, proxy = crossbar_url
    limit = {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64"}
    base = f"http://127.0.0.1:{recorder.port}/lab"
    run = claude(install_claude(), tmp_path, base, model=MODEL, extra=limit, timeout=RUN_TIMEOUT)
    report = f"{run.report()}\ncrossbar:\n{proxy.log()}"
    assert run.code is not None, f"claude -p did not end within {RUN_TIMEOUT:.0f} s\n{report}"
    exchanges = check_every_request(recorder, proxy, "/v1/messages", "message_stop", report)
    for exchange in exchanges:
        assert exchange.request.split()[1] == b"/lab/v1/messages?beta=true", exchange.request
    stops = re.findall(rb'"stop_reason":"(\w+)"', b"".join(e.body for e in exchanges))
    if run.code != 0:  # a random model's answer runs to the limit it was given
        assert set(stops) == {b"max_tokens"}, report
        assert "64 output token maximum" in run.out + run.err, report


def test_codex_completes_every_request_against_a_real_router(
    crossbar_url: tuple[Recorder, Any], tmp_path: Path
) -> None:
    recorder, proxy = crossbar_url
    base = f"http://127.0.0.1:{recorder.port}/lab/v1"
    run = codex(install_codex(), tmp_path, base, model=MODEL, timeout=RUN_TIMEOUT)
    report = f"{run.report()}\ncrossbar:\n{proxy.log()}"
    exchanges = check_every_request(recorder, proxy, "/v1/responses", "response.completed", report)
    assert run.code == 0, report
    done = json.loads(exchanges[-1].body.rsplit(b"data: ", 1)[1])
    usage = done["response"]["usage"]
    assert usage["input_tokens"] > 10_000 and "cached_tokens" in usage["input_tokens_details"]
