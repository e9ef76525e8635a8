"""``SimulatedHost``: one simulated llama-server, what tests build, steer and inspect.

It decides every answer (which route, which model, which fault); ``replies`` says what the
answer looks like, ``completions`` what a model generates, ``serving`` sends it, and
``models`` keeps the router's models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IListeningPort
from twisted.internet.task import deferLater
from twisted.web.server import Request

from crossbar.testing.simulator import apis, serving, window
from crossbar.testing.simulator.apis import COUNT, GENERATE, Api
from crossbar.testing.simulator.cache import (
    SIMILARITY,
    CacheState,
    Prefill,
    prompt_tokens,
    tokenize,
)
from crossbar.testing.simulator.completions import Reply
from crossbar.testing.simulator.models import ModelTable
from crossbar.testing.simulator.recorded import Fault, RecordedRequest
from crossbar.testing.simulator.replies import (
    METRICS,
    HttpError,
    dumps,
    model_props,
    router_models,
    router_props,
    single_models,
)
from crossbar.testing.simulator.savedslots import SlotFiles, slots_listing
from crossbar.testing.simulator.slots import ModelSlots

ANSWER_KEPT = 65_536
"""Letters of an answer a slot keeps after the prompt: 16,384 of the simulator's tokens."""


class SimulatedHost:
    """One simulated llama-server host, in router mode unless ``router=False``.

    ``models`` maps model ids to ``loaded``, ``loading`` or ``unloaded``. Every setting below
    is an attribute a test may change at any time, from the next request (``chunk_interval``
    from the next token). An answer ends after ``chunks`` tokens, or with ``chunks=None`` after
    8 to 60 as seed and prompt decide (``completions.natural_length``), or at its limit.

    Each model server has ``slots`` slots of ``ctx`` tokens (see ``window``: a number, one
    per model, or ``None``: no limit) and a host-memory cache of ``cache_ram`` tokens (0:
    none), and reuses a prompt's cached prefix as llama-server does (see ``cache``); the rest
    of the prompt takes ``prefill_time`` seconds a token (0 by default) before the answer
    starts; a request waits while every slot is busy.  ``prefills`` records each. Slots are
    saved and restored once ``saved_slots.enabled`` (``--slot-save-path``).

    Loading past ``models_max`` evicts the least recently used idle model; a request for
    another model waits while every loaded one is busy (llama.cpp since PR 26572).
    """

    def __init__(
        self,
        models: Mapping[str, str] | None = None,
        *,
        router: bool = True,
        chunks: int | None = None,
        chunk_interval: float = 0.0,
        chunk_size: int = 1,
        load_time: float = 0.0,
        models_max: int = 4,
        reactor: Any = None,
        idle_timeout: float | None = 5.0,
        unload_time: float = 0.0,
        slots: int = 4,
        cache_ram: int = 262_144,
        prefill_time: float = 0.0,
        slot_similarity: float = SIMILARITY,
        ctx: window.Windows = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as _reactor

            reactor = _reactor
        models = {"tiny-a": "loaded"} if models is None else models
        if not router and len(models) != 1:
            raise ValueError("a single-model host serves exactly one model")
        self.router = router
        self.chunks = chunks  # tokens of an answer before its limit; None: natural
        self.chunk_interval = chunk_interval  # seconds a token
        self.chunk_size = chunk_size  # letters a token
        self.load_time = load_time
        self.unload_time = unload_time  # seconds a stopped model stays listed as loaded
        self.models_max = models_max
        self.close_completions = True  # as a router does; False to keep the connection
        self.fault: Fault = None
        self.error_status = 500
        self.reset_after = 2
        self.fail_loads: set[str] = set()
        self.saved_slots = SlotFiles()  # .enabled: started with --slot-save-path
        self.slots = slots  # -np; a new number starts every model's cache afresh
        self.cache_ram = cache_ram  # tokens of prompts kept in host memory (--cache-ram)
        self.prefill_time = prefill_time  # seconds a prompt token not found in the cache
        self.slot_similarity = slot_similarity  # --slot-prompt-similarity
        self.ctx = ctx  # a slot's window (-c / -np), for every model or per model
        # What happened, for tests to look at.
        self.requests: list[RecordedRequest] = []
        self.connections_closed = 0
        self.active_streams = 0
        self.chunks_sent = 0
        self.prefills: list[Prefill] = []
        self.resource = serving.SimResource(self._record, self._handle)
        self._reactor: Any = reactor
        self._table = ModelTable(reactor, self, models)
        self._slots = ModelSlots(self)
        self._port: IListeningPort | None = None
        self._port_number, self._interface = 0, "127.0.0.1"
        self._closed_waiters: list[Deferred[None]] = []
        self._request_waiters: list[Deferred[RecordedRequest]] = []
        site = serving.QuietSite(self.resource, timeout=idle_timeout, reactor=reactor)
        self._factory = serving.ConnectionTracker(site, self._connection_lost)

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
        return {m.id: m.status for m in self._table.models.values()}

    @property
    def loads(self) -> dict[str, int]:
        """Loads started (by a request, ``/models/load`` or a test), by model."""
        return dict(self._table.loads)

    @property
    def evictions(self) -> dict[str, int]:
        """Models stopped to make room for another (never a busy one), by model."""
        return dict(self._table.evictions)

    @property
    def room_waits(self) -> int:
        """Requests that waited for a model to load because every loaded one was busy."""
        return self._table.room_waits

    def counts(self) -> dict[str, object]:
        """Loads, evictions, room waits, most queued in the host: ``GET /_simulator/counts``."""
        return {"loads": self.loads, "evictions": self.evictions, "room_waits": self.room_waits,
                "most_waiting_in_host": self._slots.most_waiting}  # fmt: skip

    def status(self, model_id: str) -> str:
        return self._table.models[model_id].status

    def set_status(self, model_id: str, status: str) -> None:
        """Force a model's status (adding the model if new), as if changed behind our back."""
        self._table.set_status(model_id, status)

    def cache(self, model_id: str | None = None) -> CacheState | None:
        """What a model's server holds now (``None`` before its first completion)."""
        cache = self._slots.cache(model_id or next(iter(self._table.models)))
        return None if cache is None else cache.state

    def paths(self) -> list[str]:
        return [recorded.path for recorded in self.requests]

    def wait_connection_closed(self) -> Deferred[None]:
        """Fires when the next client connection closes."""
        self._closed_waiters.append(d := Deferred[None]())
        return d

    def wait_request(self) -> Deferred[RecordedRequest]:
        """Fires with the next request received (after it is recorded)."""
        self._request_waiters.append(d := Deferred[RecordedRequest]())
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
            self._table.cancel_pending()

    def _connection_lost(self) -> None:
        self.connections_closed += 1
        waiters, self._closed_waiters = self._closed_waiters, []
        for d in waiters:
            d.callback(None)

    def _record(self, request: Request) -> None:
        headers = {
            name.decode("latin-1").lower(): ", ".join(v.decode("latin-1") for v in values)
            for name, values in request.requestHeaders.getAllRawHeaders()
        }
        body = serving.request_body(request)
        recorded = RecordedRequest(request.method.decode(), request.uri.decode(), headers, body)
        self.requests.append(recorded)
        waiters, self._request_waiters = self._request_waiters, []
        for d in waiters:
            d.callback(recorded)

    # -- request handling --------------------------------------------------------------------

    async def _handle(self, request: Request) -> None:
        fault = self.fault
        if fault == "hang":
            await Deferred()  # only ever cancelled, when the client goes away
            return
        if fault in ("close", "die_in_prefill"):
            serving.unanswered(request, self._reactor, pinged=fault == "die_in_prefill")
            return
        if fault == "reset" and not serving.wants_stream(request):
            serving.transport(request).abortConnection()
            return
        try:
            if fault == "loading":
                raise HttpError(503, "Loading model")
            if fault == "error":
                raise HttpError(self.error_status, "simulated server error")
            await self._route(request, self.reset_after if fault == "reset" else None)
        except HttpError as e:
            serving.send(request, e.status, e.body())

    async def _route(self, request: Request, reset_after: int | None) -> None:
        method, path = request.method.decode(), request.path.decode()
        if method == "GET" and path in ("/health", "/v1/health"):
            serving.send(request, 200, dumps({"status": "ok"}))
        elif method == "GET" and path in ("/models", "/v1/models"):
            created = int(self._reactor.seconds())  # the time of the answer, not of the file
            meta = window.metas(self.ctx, self.slots)
            if self.router:
                listing = router_models(self._table.models.values(), created, meta)
            else:
                listing = single_models(self._single_model(), created, meta(self._single_model()))
            serving.send(request, 200, dumps(listing))
        elif method == "POST" and path in GENERATE:
            await self._completion(request, GENERATE[path], reset_after=reset_after)
        elif method == "POST" and path in COUNT:
            body = serving.json_body(request)
            await self._model(request, body)
            serving.send(request, 200, dumps(apis.counted(COUNT[path], body)))
        elif method == "POST" and path.startswith("/slots/"):
            name = await self._model(request, body := serving.json_body(request))
            server = self._table.models[name if self.router else self._single_model()]
            await self.saved_slots.act(self._slots.running(server.id, server.port), request, body)
        elif method == "GET" and path in ("/props", "/slots", "/metrics"):
            await self._info(request, path)
        elif method == "GET" and path == "/_simulator/counts":
            serving.send(request, 200, dumps(self.counts()))
        elif self.router and method == "POST" and path in ("/models/load", "/models/unload"):
            self._load_or_unload(request, load=path == "/models/load")
        else:
            raise HttpError(404, "File Not Found")

    def _single_model(self) -> str:
        (name,) = self._table.models
        return name

    async def _ready(self, request: Request, name: str, *, touch: bool) -> None:
        """The router's check of a requested model; it loads the model unless told not to
        (``autoload`` other than ``true`` or ``1``, as the router reads it)."""
        autoload = serving.query(request, "autoload") in ("", "true", "1")
        await self._table.ready(name, autoload=autoload, touch=touch)

    async def _info(self, request: Request, path: str) -> None:
        """/props, /slots, /metrics: in router mode ``?model=X`` loads X first (!), unless
        ``autoload=false``: then a model not loaded is ``400 model is not loaded``."""
        name = serving.query(request, "model")
        if not self.router:
            name = self._single_model()
        elif not name and path == "/props":
            serving.send(request, 200, dumps(router_props(self.models_max)))
            return
        else:
            await self._ready(request, name, touch=False)
        if path == "/props":
            ctx = window.props_window(window.window_of(self.ctx, name))
            started = self._table.models[name].port  # new at each load: a marker of the start
            serving.send(request, 200, dumps(model_props(name, self.slots, ctx, started)))
        elif path == "/slots":
            serving.send(request, 200, dumps(slots_listing(self._slots.cache(name))))
        else:
            serving.send(request, 200, METRICS, b"text/plain; version=0.0.4")

    def _load_or_unload(self, request: Request, *, load: bool) -> None:
        body = serving.json_body(request)
        self._table.control(str(body.get("model", "")), load=load)
        serving.send(request, 200, dumps({"success": True}))

    async def _model(self, request: Request, body: dict[str, Any]) -> str:
        """The model that serves ``body``: the one it names, ready, on a router."""
        requested = body.get("model")
        name = requested if isinstance(requested, str) else ""
        if not self.router:
            return name or self._single_model()  # any name is answered as it was asked
        await self._ready(request, name, touch=True)
        if self.close_completions:
            serving.close_after(request)
        return name

    async def _completion(self, request: Request, api: Api, *, reset_after: int | None) -> None:
        body = serving.json_body(request)
        name = await self._model(request, body)
        chat = apis.to_chat(api, body)
        tokens = prompt_tokens(chat, chat=api != "text")
        server = self._table.models[name if self.router else self._single_model()]
        chat = window.within_window(chat, len(tokens), window.window_of(self.ctx, server.id))
        self._table.begin(server)  # busy from now on: never evicted while it answers
        try:
            cache, prefill = await self._slots.take(server.id, server.port, tokens)
            self.prefills.append(prefill)
            kept = tokens[: prefill.cache_n]  # what the slot holds if the client goes away
            try:
                answer = await self._answer(request, api, body, chat, name, prefill, reset_after)
                if answer is not None:
                    kept = tokens + tokenize(answer)
            finally:
                self._slots.give_back(cache, prefill, kept)
        finally:
            self._table.end(server)

    async def _answer(
        self,
        request: Request,
        api: Api,
        body: dict[str, Any],
        chat: dict[str, Any],
        name: str,
        prefill: Prefill,
        reset_after: int | None,
    ) -> str | None:
        """Process the prompt, then send the answer; what a slot keeps of it once it is out."""
        if prefill.prompt_n * self.prefill_time > 0:
            await deferLater(self._reactor, prefill.prompt_n * self.prefill_time)
        reply = Reply.to(
            chat,
            chat=api != "text",
            model=name,
            created=int(self._reactor.seconds()),
            chunks=self.chunks,
            pace=self.chunk_interval,
            cache_n=prefill.cache_n,
            prompt_n=prefill.prompt_n,
            prompt_ms=prefill.prompt_n * max(self.prefill_time, 1e-6) * 1000,
        )
        shaped = apis.shape(api, body, reply, self.chunk_size)
        if body.get("stream") is True:
            request.setHeader(b"content-type", b"text/event-stream")
            request.setHeader(b"x-accel-buffering", b"no")
            request.setHeader(b"keep-alive", b"timeout=5, max=100")
            events = shaped.events()
            stream = serving.SSEStream(self, self._reactor, request, events, reset_after)
            stream.start()
            await stream.done
            return shaped.kept(ANSWER_KEPT) if request.finished else None
        if self.chunk_interval > 0 and shaped.tokens:
            await deferLater(self._reactor, self.chunk_interval * shaped.tokens)
        if self.router:
            # What the router relays from the model's server comes chunked, unbuffered.
            request.setHeader(b"x-accel-buffering", b"no")
        serving.send(request, 200, dumps(shaped.whole()), chunked=self.router)
        return shaped.kept(ANSWER_KEPT)
