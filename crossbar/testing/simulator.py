"""A simulated llama-server, so crossbar can be tested without models or GPUs.

It answers the way a real ``llama-server`` does (router mode by default, or single-model
mode): the same status codes, JSON shapes, error shapes, headers and SSE framing.  On top of
that it records every request and can be told to misbehave (``fault``), so tests can prove
how crossbar reacts to slow, broken or vanishing hosts.  Run it by hand with
``python -m crossbar.testing.simulator --listen 8081 --models tiny-a=loaded,tiny-b=unloaded``.

It follows llama.cpp 0c1e57098 as observed (``tests/integration`` runs crossbar against that
real server): a router's own answers carry ``Keep-Alive: timeout=5, max=100`` and a length,
every error closes the connection, the completions it relays come chunked with
``Connection: close``, ``/v1/models`` gives ``meta`` for loaded models only, and an unloaded
model stays listed as ``loaded`` until its process has exited (``unload_time``). What it does
not copy: the real router sometimes puts several SSE events into one HTTP chunk (the
simulator writes one event per chunk), and its token counts are not a tokenizer's.
"""

from __future__ import annotations

import argparse
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from twisted.internet.defer import CancelledError, Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IListeningPort, IPushProducer
from twisted.internet.protocol import connectionDone
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

Fault = Literal["loading", "error", "hang", "reset", "close"] | None

# llama-server's build number and short commit, as it reports them in "system_fingerprint" and
# "build_info" (llama.cpp 0c1e57098 built from the llama-cpp-python 0.3.36 sdist says this).
BUILD_INFO = "b1-0c1e570"
MAX_TOKENS = 100_000
_STATUSES = ("loaded", "loading", "unloaded")
_COMPLETIONS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_FIRST_CHILD_PORT = 40001
_JSON = b"application/json; charset=utf-8"
_log = Logger()


def _dumps(value: object) -> bytes:
    """Compact JSON, as llama-server writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _text(start: int, size: int) -> str:
    """Deterministic generated text: ``size`` letters starting at offset ``start``."""
    offset = start % len(_ALPHABET)
    return (_ALPHABET * ((offset + size) // len(_ALPHABET) + 1))[offset : offset + size]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the simulated host received it."""

    method: str
    path: str  # including the query string
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Model:
    """Router-side state of one model."""

    id: str
    status: str
    failed: bool = False
    last_used: int = 0
    port: int = 0  # of the model's own server while it runs (0 when unloaded)
    load_call: IDelayedCall | None = None
    waiters: list[Deferred[None]] = field(default_factory=list)
    unload_call: IDelayedCall | None = None  # stopping: still listed as loaded until it fires
    unload_waiters: list[Deferred[None]] = field(default_factory=list)


class _HttpError(Exception):
    """An answer in llama-server's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Site(Site):
    """A Site that keeps quiet: the real router does not log routine requests either."""

    noisy = False

    def log(self, request: http.Request) -> None:
        pass


class _Connection(ProtocolWrapper):
    """One client connection; tells the host once it is completely gone."""

    factory: _Tracker

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.factory.host._connection_lost()


class _Tracker(WrappingFactory):
    """Keeps the open connections, so tests can count, await and abort them."""

    noisy = False
    protocol = _Connection

    def __init__(self, site: Site, host: SimulatedHost) -> None:
        super().__init__(site)
        self.host = host


class _SimResource(Resource):
    """The single leaf resource: every path goes to the host's handler."""

    isLeaf = True

    def __init__(self, host: SimulatedHost) -> None:
        super().__init__()
        self._host = host

    def render(self, request: Request) -> int:
        self._host._record(request)
        request.setHeader(b"server", b"llama.cpp")
        request.setHeader(b"access-control-allow-origin", b"")  # sic: empty unless --api-key/CORS
        finished: Deferred[None] = request.notifyFinish()
        handling = Deferred.fromCoroutine(self._host._handle(request))
        finished.addErrback(lambda _: handling.cancel())
        handling.addErrback(self._host._unexpected, request)
        return NOT_DONE_YET


@implementer(IPushProducer)
class _SSEStream:
    """Writes SSE events one by one, paced by the reactor and paused by backpressure.

    Events marked as paced wait ``chunk_interval`` before being written (that is token
    generation); the others follow at once.  ``done`` fires when the stream ends for any
    reason; cancelling it stops generation.
    """

    def __init__(
        self,
        host: SimulatedHost,
        request: Request,
        events: Iterator[tuple[bool, bytes]],
        reset_after: int | None,
    ) -> None:
        self.done: Deferred[None] = Deferred(lambda _: self.stopProducing())
        self._host = host
        self._request = request
        self._events = events
        self._reset_after = reset_after
        self._pending: tuple[bool, bytes] | None = None
        self._waited = False
        self._paused = False
        self._stopped = False
        self._call: IDelayedCall | None = None
        self._sent = 0

    def start(self) -> None:
        self._host.active_streams += 1
        self._request.registerProducer(self, True)
        self._run()

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self._call is None and not self._stopped:
            self._run()

    def stopProducing(self) -> None:
        self._end()

    def _end(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._host.active_streams -= 1
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        if not self.done.called:
            self.done.callback(None)

    def _waited_interval(self) -> None:
        self._call = None
        self._waited = True
        self._run()

    def _run(self) -> None:
        self._call = None
        budget = 256  # yield to the reactor now and then when not paced
        while not (self._paused or self._stopped):
            if self._pending is None:
                self._pending = next(self._events, None)
                if self._pending is None:
                    self._request.unregisterProducer()
                    self._request.finish()
                    self._end()
                    return
            paced, data = self._pending
            if paced and not self._waited:
                interval = self._host.chunk_interval
                budget -= 1
                if interval > 0 or budget <= 0:
                    self._call = self._host._reactor.callLater(
                        max(interval, 0.0), self._waited_interval
                    )
                    return
            self._pending, self._waited = None, False
            self._request.write(data)
            if paced:
                self._sent += 1
                self._host.chunks_sent += 1
                if self._reset_after is not None and self._sent >= self._reset_after:
                    # Give the chunks time to leave: an abort drops whatever is still buffered.
                    delay = max(self._host.chunk_interval, 0.02)
                    self._call = self._host._reactor.callLater(delay, self._reset)
                    return

    def _reset(self) -> None:
        self._call = None
        _transport(self._request).abortConnection()
        self._end()


class SimulatedHost:
    """One simulated llama-server host, in router mode unless ``router=False``."""

    def __init__(
        self,
        models: Mapping[str, str] | None = None,
        *,
        router: bool = True,
        chunks: int = 8,
        chunk_interval: float = 0.0,
        chunk_size: int = 1,
        load_time: float = 0.0,
        models_max: int = 4,
        reactor: Any = None,
        idle_timeout: float | None = 5.0,
        unload_time: float = 0.0,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as _reactor

            reactor = _reactor
        models = {"tiny-a": "loaded"} if models is None else models
        if not router and len(models) != 1:
            raise ValueError("a single-model host serves exactly one model")
        for model_id, status in models.items():
            if status not in _STATUSES:
                raise ValueError(f"model {model_id!r}: status must be one of {_STATUSES}")
        self.router = router
        self.chunks = chunks
        self.chunk_interval = chunk_interval
        self.chunk_size = chunk_size
        self.load_time = load_time
        self.unload_time = unload_time
        self.models_max = models_max
        self.close_completions = True
        self.fault: Fault = None
        self.error_status = 500
        self.reset_after = 2
        self.fail_loads: set[str] = set()
        self.requests: list[RecordedRequest] = []
        self.connections_closed = 0
        self.active_streams = 0
        self.chunks_sent = 0
        self.resource = _SimResource(self)
        self._reactor: Any = reactor
        self._models = {m: _Model(m, "unloaded") for m in models}
        self._uses = 0
        self._child_ports = 0
        self._port: IListeningPort | None = None
        self._port_number = 0
        self._interface = "127.0.0.1"
        self._closed_waiters: list[Deferred[None]] = []
        self._request_waiters: list[Deferred[RecordedRequest]] = []
        self._factory = _Tracker(_Site(self.resource, timeout=idle_timeout, reactor=reactor), self)
        for model_id, status in models.items():
            if status == "loaded":
                self._touch(self._models[model_id])
                self._models[model_id].status = "loaded"
                self._models[model_id].port = self._next_child_port()
            elif status == "loading":
                self._start_load(self._models[model_id])

    # -- public API -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if not self._port_number:
            raise RuntimeError("the simulated host has never listened")
        return f"http://{self._interface}:{self._port_number}"

    @property
    def open_connections(self) -> int:
        return len(self._factory.protocols)

    @property
    def models(self) -> dict[str, str]:
        """A snapshot of every model's status value."""
        return {m.id: m.status for m in self._models.values()}

    def status(self, model_id: str) -> str:
        return self._models[model_id].status

    def set_status(self, model_id: str, status: str) -> None:
        """Force a model's status (adding the model if new), as if changed behind our back."""
        if status not in _STATUSES:
            raise ValueError(f"status must be one of {_STATUSES}")
        model = self._models.setdefault(model_id, _Model(model_id, "unloaded"))
        self._unload(model)
        if status == "loaded":
            model.status, model.failed = "loaded", False
            model.port = self._next_child_port()
            self._touch(model)
        elif status == "loading":
            self._start_load(model)

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def wait_connection_closed(self) -> Deferred[None]:
        """Fires when the next client connection closes."""
        d: Deferred[None] = Deferred()
        self._closed_waiters.append(d)
        return d

    def wait_request(self) -> Deferred[RecordedRequest]:
        """Fires with the next request received (after it is recorded)."""
        d: Deferred[RecordedRequest] = Deferred()
        self._request_waiters.append(d)
        return d

    def listen(
        self, port: int | None = None, interface: str | None = None
    ) -> Deferred[IListeningPort]:
        """Start listening; with no port, on the one used before (or any free one)."""
        if self._port is None:
            self._interface = interface or self._interface
            number = self._port_number if port is None else port
            self._port = self._reactor.listenTCP(number, self._factory, interface=self._interface)
            address: Any = self._port.getHost()
            self._port_number = address.port
        return succeed(self._port)

    def refuse(self) -> Deferred[None]:
        """Stop listening (new connections are refused) and abort the open ones."""
        return Deferred.fromCoroutine(self._close(cancel_loads=False))

    def stop(self) -> Deferred[None]:
        """Stop listening, abort every connection, unload loading models; idempotent."""
        return Deferred.fromCoroutine(self._close(cancel_loads=True))

    # -- lifecycle ---------------------------------------------------------------------------

    async def _close(self, *, cancel_loads: bool) -> None:
        if self._port is not None:
            port, self._port = self._port, None
            await maybeDeferred(port.stopListening)
        for protocol in list(self._factory.protocols):
            protocol.transport.abortConnection()
        while self._factory.protocols:
            await self.wait_connection_closed()
        if cancel_loads:
            for model in self._models.values():
                if model.status == "loading" or model.unload_call is not None:
                    self._unload(model)

    def _connection_lost(self) -> None:
        self.connections_closed += 1
        waiters, self._closed_waiters = self._closed_waiters, []
        for d in waiters:
            d.callback(None)

    def _record(self, request: Request) -> None:
        body = _body(request)
        headers = {
            name.decode("latin-1").lower(): ", ".join(v.decode("latin-1") for v in values)
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        recorded = RecordedRequest(request.method.decode(), request.uri.decode(), headers, body)
        self.requests.append(recorded)
        waiters, self._request_waiters = self._request_waiters, []
        for d in waiters:
            d.callback(recorded)

    # -- model loading -----------------------------------------------------------------------

    def _touch(self, model: _Model) -> None:
        self._uses += 1
        model.last_used = self._uses

    def _next_child_port(self) -> int:
        self._child_ports += 1
        return _FIRST_CHILD_PORT + self._child_ports

    def _start_load(self, model: _Model) -> None:
        """Begin loading, first evicting least recently used models beyond models_max."""
        running = [
            m
            for m in self._models.values()
            if m is not model and m.status != "unloaded" and m.unload_call is None
        ]
        while self.models_max > 0 and len(running) >= self.models_max:
            loaded = [m for m in running if m.status == "loaded"]
            if not loaded:
                break
            victim = min(loaded, key=lambda m: m.last_used)
            self._stop_model(victim)
            running.remove(victim)
        model.status = "loading"
        model.port = self._next_child_port()
        if self.load_time > 0:
            model.load_call = self._reactor.callLater(self.load_time, self._finish_load, model)
        else:
            self._finish_load(model)

    def _finish_load(self, model: _Model) -> None:
        model.load_call = None
        waiters, model.waiters = model.waiters, []
        if model.id in self.fail_loads:
            model.status, model.failed, model.port = "unloaded", True, 0
            for d in waiters:
                d.errback(_HttpError(500, f"model name={model.id} failed to load"))
            return
        model.status, model.failed = "loaded", False
        self._touch(model)
        for d in waiters:
            d.callback(None)

    def _stop_model(self, model: _Model) -> None:
        """Stop a loaded model's server the way the router does.

        The real router answers at once but keeps listing the model as ``loaded`` until the
        model's process has exited (``unload_time``; about 50 ms for a tiny model); a request for
        it meanwhile waits for the exit, then loads the model again.
        """
        if model.status != "loaded" or self.unload_time <= 0:
            self._unload(model)
        elif model.unload_call is None:
            model.unload_call = self._reactor.callLater(self.unload_time, self._unload, model)

    def _unload(self, model: _Model) -> None:
        if model.load_call is not None and model.load_call.active():
            model.load_call.cancel()
        model.load_call = None
        if model.unload_call is not None and model.unload_call.active():
            model.unload_call.cancel()
        model.unload_call = None
        model.status, model.port = "unloaded", 0
        waiters, model.waiters = model.waiters, []
        for d in waiters:
            d.errback(_HttpError(500, f"model name={model.id} failed to load"))
        gone, model.unload_waiters = model.unload_waiters, []
        for d in gone:
            d.callback(None)

    async def _ready(self, request: Request, name: str, *, touch: bool) -> None:
        """Validate a model name the way the router does, loading the model if needed."""
        if not name:
            raise _HttpError(400, "model name is missing from the request")
        model = self._models.get(name)
        if model is None:
            raise _HttpError(400, f"model '{name}' not found")
        if model.unload_call is not None:
            stopped: Deferred[None] = Deferred()
            model.unload_waiters.append(stopped)
            await stopped
        if model.status != "loaded":
            if _query(request, "autoload") in ("false", "0") and model.status == "unloaded":
                raise _HttpError(400, "model is not loaded")
            waiter: Deferred[None] = Deferred()
            model.waiters.append(waiter)
            if model.status == "unloaded":
                self._start_load(model)
            await waiter
        if touch:
            self._touch(model)

    # -- request handling --------------------------------------------------------------------

    async def _handle(self, request: Request) -> None:
        fault = self.fault
        if fault == "hang":
            await Deferred()  # only ever cancelled, when the client goes away
            return
        if fault == "close":
            _transport(request).loseConnection()
            return
        if fault == "reset" and not _wants_stream(request):
            _transport(request).abortConnection()
            return
        try:
            if fault == "loading":
                raise _HttpError(503, "Loading model")
            if fault == "error":
                raise _HttpError(self.error_status, "simulated server error")
            await self._route(request, self.reset_after if fault == "reset" else None)
        except _HttpError as e:
            self._send_error(request, e.status, e.message)

    def _send_error(self, request: Request, status: int, message: str) -> None:
        body = {"code": status, "message": message, "type": _error_type(status)}
        if status == 404:  # the HTTP layer's own 404 has its keys in another order
            body = {"message": message, "type": _error_type(status), "code": status}
        self._send(request, status, _dumps({"error": body}))

    def _unexpected(self, failure: Failure, request: Request) -> None:
        """Answer 500 for a bug in the simulator, and drop cancellations silently."""
        if failure.check(CancelledError):
            return
        _log.failure("crossbar simulator failed to answer", failure)
        if not request.startedWriting and not request.finished:
            self._send_error(request, 500, failure.getErrorMessage())

    async def _route(self, request: Request, reset_after: int | None) -> None:
        method, path = request.method.decode(), request.path.decode()
        if method == "GET" and path in ("/health", "/v1/health"):
            self._send(request, 200, _dumps({"status": "ok"}))
        elif method == "GET" and path in ("/models", "/v1/models"):
            self._send(request, 200, _dumps(self._models_body()))
        elif method == "POST" and path in _COMPLETIONS:
            await self._completion(request, chat="chat" in path, reset_after=reset_after)
        elif method == "GET" and path in ("/props", "/slots", "/metrics"):
            await self._info(request, path)
        elif self.router and method == "POST" and path in ("/models/load", "/models/unload"):
            self._load_or_unload(request, load=path == "/models/load")
        else:
            raise _HttpError(404, "File Not Found")

    def _send(
        self,
        request: Request,
        status: int,
        data: bytes,
        content_type: bytes = _JSON,
        *,
        chunked: bool = False,
    ) -> None:
        """Answer at once. Errors close the connection (``Connection: close``, no keep-alive);
        ``chunked`` answers have no Content-Length, like the completions a router proxies."""
        request.setResponseCode(status)
        request.setHeader(b"content-type", content_type)
        if not chunked:
            request.setHeader(b"content-length", b"%d" % len(data))
        if status >= 400:
            request.setHeader(b"connection", b"close")
            request.channel.persistent = False
        else:
            request.setHeader(b"keep-alive", b"timeout=5, max=100")
        request.write(data)
        request.finish()

    def _models_body(self) -> dict[str, Any]:
        created = int(self._reactor.seconds())  # the time of the answer, not of the file
        if not self.router:
            (name,) = self._models
            return {
                "models": [
                    {
                        "name": name,
                        "model": name,
                        "modified_at": "",
                        "size": "",
                        "digest": "",
                        "type": "model",
                        "description": "",
                        "tags": [""],
                        "capabilities": ["completion"],
                        "parameters": "",
                        "details": {
                            "parent_model": "",
                            "format": "gguf",
                            "family": "",
                            "families": [""],
                            "parameter_size": "",
                            "quantization_level": "",
                        },
                    }
                ],
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "aliases": [name],
                        "tags": [],
                        "object": "model",
                        "created": created,
                        "owned_by": "llamacpp",
                        "meta": _META,
                    }
                ],
            }
        data = []
        for model in self._models.values():
            path = f"/m/{model.id}.gguf"
            args = ["llama-server", "--host", "127.0.0.1", "--port", str(model.port)]
            status: dict[str, Any] = {
                "value": model.status,
                "args": [*args, "--alias", model.id, "--model", path],
                "preset": f"[{model.id}]\nmodel = {path}\n\n",
            }
            if model.failed:
                status |= {"exit_code": 1, "failed": True}
            entry: dict[str, Any] = {
                "id": model.id,
                "aliases": [],
                "tags": [],
                "object": "model",
                "owned_by": "llamacpp",
                "created": created,
                "status": status,
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": "models_dir",
                "can_remove": False,
            }
            if model.status == "loaded":  # only a running model can tell its metadata
                entry["meta"] = _META
            data.append(entry)
        return {"data": data, "object": "list"}

    async def _info(self, request: Request, path: str) -> None:
        """/props, /slots, /metrics: in router mode ``?model=X`` loads X first (!)."""
        name = _query(request, "model")
        if not self.router:
            (name,) = self._models
        elif not name and path == "/props":
            props = {
                "role": "router",
                "max_instances": self.models_max,
                "models_autoload": True,
                "model_alias": "llama-server",
                "model_path": "none",
                "default_generation_settings": {"params": None, "n_ctx": 0},
                "ui_settings": {},
                "build_info": BUILD_INFO,
                "cors_proxy_enabled": False,
            }
            self._send(request, 200, _dumps(props))
            return
        else:
            await self._ready(request, name, touch=False)
        if path == "/props":
            props = {
                "default_generation_settings": {"id": 0, "n_ctx": 4096, "params": {}},
                "total_slots": 1,
                "model_alias": name,
                "model_path": f"/m/{name}.gguf",
                "build_info": BUILD_INFO,
                "is_sleeping": False,
            }
            self._send(request, 200, _dumps(props))
        elif path == "/slots":
            slot = {"id": 0, "id_task": -1, "n_ctx": 4096, "is_processing": False}
            self._send(request, 200, _dumps([slot]))
        else:
            metrics = (
                b"# HELP llamacpp:requests_processing Number of requests processing.\n"
                b"# TYPE llamacpp:requests_processing gauge\n"
                b"llamacpp:requests_processing 0\n"
            )
            self._send(request, 200, metrics, b"text/plain; version=0.0.4")

    def _load_or_unload(self, request: Request, *, load: bool) -> None:
        body = _json_body(request)
        model = self._models.get(str(body.get("model", "")))
        if model is None:
            # sic: loading an unknown model is the HTTP layer's plain 404
            raise (
                _HttpError(404, "File Not Found") if load else _HttpError(400, "model is not found")
            )
        if load and model.status != "unloaded":
            raise _HttpError(400, "model is already running")
        if not load and (model.status == "unloaded" or model.unload_call is not None):
            raise _HttpError(400, "model is not running")
        if load:
            self._start_load(model)
        else:
            self._stop_model(model)
        self._send(request, 200, _dumps({"success": True}))

    async def _completion(self, request: Request, *, chat: bool, reset_after: int | None) -> None:
        body = _json_body(request)
        requested = body.get("model")
        name = requested if isinstance(requested, str) else ""
        if self.router:
            await self._ready(request, name, touch=True)
            if self.close_completions:
                request.setHeader(b"connection", b"close")
                request.channel.persistent = False
        else:
            name = name or next(iter(self._models))
        n, finish = self.chunks, "stop"
        for key in ("max_tokens", "max_completion_tokens", "n_predict"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                n, finish = min(value, MAX_TOKENS), "length"
                break
        prompt = max(1, len(json.dumps(body.get("messages", body.get("prompt", ""))).split()))
        usage = {
            "completion_tokens": n,
            "prompt_tokens": prompt,
            "total_tokens": n + prompt,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        ms = max(self.chunk_interval, 0.001) * 1000
        timings = {
            "cache_n": 0,
            "prompt_n": prompt,
            "prompt_ms": 1.0,
            "prompt_per_token_ms": 1.0 / prompt,
            "prompt_per_second": 1000.0 * prompt,
            "predicted_n": n,
            "predicted_ms": n * ms,
            "predicted_per_token_ms": ms,
            "predicted_per_second": 1000 / ms,
        }
        reply = _Reply(chat, name, int(self._reactor.seconds()), finish, usage, timings)
        if body.get("stream") is True:
            request.setHeader(b"content-type", b"text/event-stream")
            request.setHeader(b"x-accel-buffering", b"no")
            request.setHeader(b"keep-alive", b"timeout=5, max=100")
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and options.get("include_usage") is True
            stream = _SSEStream(
                self, request, reply.events(n, self.chunk_size, with_usage), reset_after
            )
            stream.start()
            await stream.done
            return
        if self.chunk_interval > 0 and n:
            await deferLater(self._reactor, self.chunk_interval * n)
        if self.router:
            # What the router relays from the model's server comes chunked, unbuffered.
            request.setHeader(b"x-accel-buffering", b"no")
        whole = _dumps(reply.whole(_text(0, n * self.chunk_size)))
        self._send(request, 200, whole, chunked=self.router)


@dataclass(frozen=True)
class _Reply:
    """The OpenAI-shaped pieces of one generated answer."""

    chat: bool
    model: str
    created: int
    finish: str
    usage: dict[str, Any]
    timings: dict[str, float]
    # "chatcmpl-" for text completions too: llama-server says so.
    id: str = field(
        default_factory=lambda: "chatcmpl-" + "".join(secrets.choice(_ID_CHARS) for _ in range(32))
    )

    def whole(self, content: str) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": content}
            choice = {"finish_reason": self.finish, "index": 0, "message": message}
        else:
            choice = {"text": content, "index": 0, "logprobs": None, "finish_reason": self.finish}
        return {
            "choices": [choice],
            "created": self.created,
            "model": self.model,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion" if self.chat else "text_completion",
            "usage": self.usage,
            "id": self.id,
            "timings": self.timings,
        }

    def events(self, n: int, size: int, with_usage: bool) -> Iterator[tuple[bool, bytes]]:
        """(paced, bytes) for every SSE event, generated lazily: streams may be huge.

        Chat chunks carry the id before the model; text completion chunks after the object,
        and their last chunk always has the usage (``include_usage`` adds nothing). A chat
        stream's finish chunk has the timings, unless ``include_usage`` asked for one more
        chunk with the usage: then that one has them.
        """

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            if self.chat:
                head = {"choices": choices, "created": self.created, "id": self.id}
                doc = head | {
                    "model": self.model,
                    "system_fingerprint": BUILD_INFO,
                    "object": "chat.completion.chunk",
                }
            else:
                doc = {
                    "choices": choices,
                    "created": self.created,
                    "model": self.model,
                    "system_fingerprint": BUILD_INFO,
                    "object": "text_completion",
                }
                usage = extra.pop("usage", None)
                if usage is not None:
                    doc["usage"] = usage
                doc["id"] = self.id
            return b"data: " + _dumps(doc | extra) + b"\n\n"

        def choice(finish: str | None, content: str | None) -> dict[str, Any]:
            if not self.chat:
                return {
                    "text": content or "",
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": finish,
                }
            return {
                "finish_reason": finish,
                "index": 0,
                "delta": {} if content is None else {"content": content},
            }

        if self.chat:
            role = {"role": "assistant", "content": None}
            yield False, event([{"finish_reason": None, "index": 0, "delta": role}])
        for i in range(n):
            yield True, event([choice(None, _text(i * size, size))])
        if not self.chat:
            yield False, event([choice(self.finish, None)], usage=self.usage, timings=self.timings)
        elif with_usage:
            yield False, event([choice(self.finish, None)])
            yield False, event([], usage=self.usage, timings=self.timings)
        else:
            yield False, event([choice(self.finish, None)], timings=self.timings)
        yield False, b"data: [DONE]\n\n"


_META = {
    "vocab_type": 1,
    "n_vocab": 289,
    "n_ctx": 2048,
    "n_ctx_train": 2048,
    "n_embd": 64,
    "n_params": 119232,
    "size": 476928,
    "ftype": "all F32",
}


def _transport(request: Request) -> Any:
    """The connection under a request (a TCP transport, or a test double)."""
    return request.transport


def _body(request: Request) -> bytes:
    content: Any = request.content
    content.seek(0)
    data: bytes = content.read()
    content.seek(0)
    return data


def _query(request: Request, name: str) -> str:
    values: Sequence[bytes] = request.args.get(name.encode(), [b""])
    return values[0].decode()


def _error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "server_error")


def _json_body(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; a parse error answers 500 like llama-server's."""
    try:
        body = json.loads(_body(request))
    except ValueError as e:
        raise _HttpError(500, f"[json.exception.parse_error.101] parse error: {e}") from None
    if not isinstance(body, dict):
        raise _HttpError(400, "request body must be a JSON object")
    return body


def _wants_stream(request: Request) -> bool:
    if request.method != b"POST" or request.path.decode() not in _COMPLETIONS:
        return False
    try:
        return _json_body(request).get("stream") is True
    except _HttpError:
        return False


# -- standalone ---------------------------------------------------------------------------------


def _parse_models(spec: str) -> dict[str, str]:
    """``tiny-a=loaded,tiny-b`` -> {"tiny-a": "loaded", "tiny-b": "unloaded"}."""
    models = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, status = item.partition("=")
        models[name] = status or "unloaded"
    return models


def main(argv: Sequence[str] | None = None) -> None:
    """Run simulated hosts until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m crossbar.testing.simulator", description=__doc__
    )
    parser.add_argument("--listen", type=int, default=8081, help="port of the host (default 8081)")
    parser.add_argument("--interface", default="127.0.0.1")
    parser.add_argument("--models", default="tiny-a=loaded,tiny-b=unloaded", help="id=status,...")
    parser.add_argument(
        "--host", action="append", default=[], metavar="PORT:MODELS", help="another host"
    )
    parser.add_argument("--single", action="store_true", help="single-model llama-server")
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--chunk-interval", type=float, default=0.05)
    parser.add_argument("--chunk-size", type=int, default=1)
    parser.add_argument("--load-time", type=float, default=2.0)
    parser.add_argument("--unload-time", type=float, default=0.1)
    parser.add_argument("--models-max", type=int, default=4)
    args = parser.parse_args(argv)
    specs = [(args.listen, args.models)]
    for extra in args.host:
        port, _, models = extra.partition(":")
        specs.append((int(port), models))

    from twisted.internet import reactor

    for port, spec in specs:
        host = SimulatedHost(
            _parse_models(spec),
            router=not args.single,
            chunks=args.chunks,
            chunk_interval=args.chunk_interval,
            chunk_size=args.chunk_size,
            load_time=args.load_time,
            unload_time=args.unload_time,
            models_max=args.models_max,
        )
        host.listen(port, args.interface)
        mode = "single-model" if args.single else "router"
        print(f"crossbar simulator ({mode}) listening on {host.url}: {spec}", flush=True)
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
