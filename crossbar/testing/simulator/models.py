"""A router's models over time: which run, which load, which get evicted, and who waits.

This is the state crossbar polls and routes by, so it follows the real router's timing:
loads take ``load_time``, a stopped model stays listed as ``loaded`` until its process has
exited, and loading beyond ``models_max`` evicts the least recently used *idle* model (as
llama.cpp does since PR 26572): while every loaded model has requests in flight, a request
for another model waits until one is idle, then evicts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from crossbar.testing.simulator.replies import STATUSES, HttpError

# A model's own server listens on the router's port + 1, + 2, ...; which ports they are does
# not matter here, only that they show in the listing and change when a model restarts.
_FIRST_CHILD_PORT = 40001


@dataclass
class Model:
    """Router-side state of one model."""

    id: str
    status: str
    failed: bool = False
    last_used: int = 0
    in_flight: int = 0  # requests being answered by the model's server now
    port: int = 0  # of the model's own server while it runs (0 when unloaded)
    load_call: IDelayedCall | None = None
    waiters: list[Deferred[None]] = field(default_factory=list)
    unload_call: IDelayedCall | None = None  # stopping: still listed as loaded until it fires
    unload_waiters: list[Deferred[None]] = field(default_factory=list)


class ModelLimits(Protocol):
    """The host's settings for loading, read at every load: tests change them at any time."""

    load_time: float
    unload_time: float
    models_max: int
    fail_loads: set[str]


def check_status(status: str, what: str = "status") -> None:
    if status not in STATUSES:
        raise ValueError(f"{what} must be one of {STATUSES}")


class ModelTable:
    """Every model of one host, in the order given, and their loads and unloads."""

    def __init__(
        self, clock: IReactorTime, limits: ModelLimits, statuses: Mapping[str, str]
    ) -> None:
        for model_id, status in statuses.items():
            check_status(status, f"model {model_id!r}: status")
        self.models = {m: Model(m, "unloaded") for m in statuses}
        self._clock = clock
        self._limits = limits
        self._uses = 0
        self._child_ports = 0
        self._room_waiters: list[Deferred[None]] = []
        self.loads: dict[str, int] = {}  # loads started, by model
        self.evictions: dict[str, int] = {}  # models stopped to make room, by model
        self.room_waits = 0  # requests that waited because every loaded model was busy
        for model_id, status in statuses.items():
            self.set_status(model_id, status)

    def set_status(self, model_id: str, status: str) -> None:
        """Force a model's status (adding the model if new), as if changed behind our back."""
        check_status(status)
        model = self.models.setdefault(model_id, Model(model_id, "unloaded"))
        self.unload(model)
        if status == "loaded":
            model.status, model.failed = "loaded", False
            model.port = self._next_child_port()
            self._touch(model)
        elif status == "loading":
            self.start_load(model)

    async def ready(self, name: str, *, autoload: bool, touch: bool) -> None:
        """Validate a model name the way the router does, loading the model if needed."""
        if not name:
            raise HttpError(400, "model name is missing from the request")
        model = self.models.get(name)
        if model is None:
            raise HttpError(400, f"model '{name}' not found")
        if model.unload_call is not None:
            stopped: Deferred[None] = Deferred()
            model.unload_waiters.append(stopped)
            await stopped
        waited = False
        while model.status != "loaded":
            if model.status == "unloaded":
                if not autoload:
                    raise HttpError(400, "model is not loaded")
                if not self._has_room(model):
                    self.room_waits += not waited  # once a request
                    waited = True
                    room: Deferred[None] = Deferred()
                    self._room_waiters.append(room)
                    await room  # a model went idle or away: look again
                    continue
            waiter: Deferred[None] = Deferred()
            model.waiters.append(waiter)  # before the load: one of no time ends at once
            if model.status == "unloaded":
                self.start_load(model)
            await waiter
        if touch:
            self._touch(model)

    def begin(self, model: Model) -> None:
        """A request is being answered by ``model``: it cannot be evicted meanwhile."""
        model.in_flight += 1

    def end(self, model: Model) -> None:
        """A request of ``model`` is over; once it has none, a waiting load may evict it."""
        model.in_flight = max(0, model.in_flight - 1)
        if not model.in_flight:
            self._room_freed()

    def control(self, name: str, *, load: bool) -> None:
        """``POST /models/load`` or ``/models/unload``, with the router's errors."""
        model = self.models.get(name)
        if model is None:
            # sic: loading an unknown model is the HTTP layer's plain 404
            raise HttpError(404, "File Not Found") if load else HttpError(400, "model is not found")
        if load and model.status != "unloaded":
            raise HttpError(400, "model is already running")
        if not load and (model.status == "unloaded" or model.unload_call is not None):
            raise HttpError(400, "model is not running")
        if load:
            self.start_load(model)
        else:
            self.stop(model)

    def _running(self, model: Model) -> list[Model]:
        return [
            m
            for m in self.models.values()
            if m is not model and m.status != "unloaded" and m.unload_call is None
        ]

    def _has_room(self, model: Model) -> bool:
        """Whether ``model`` can start loading now: a free instance, or an idle one to evict."""
        running = self._running(model)
        models_max = self._limits.models_max
        if models_max <= 0 or len(running) < models_max:
            return True
        return any(m.status == "loaded" and not m.in_flight for m in running)

    def _room_freed(self) -> None:
        waiters, self._room_waiters = self._room_waiters, []
        for d in waiters:
            if not d.called:
                d.callback(None)

    def start_load(self, model: Model) -> None:
        """Begin loading, first evicting the least recently used idle models beyond
        models_max (a busy model is never evicted: an explicit load then goes past it)."""
        running = self._running(model)
        models_max = self._limits.models_max
        while models_max > 0 and len(running) >= models_max:
            loaded = [m for m in running if m.status == "loaded" and not m.in_flight]
            if not loaded:
                break
            victim = min(loaded, key=lambda m: m.last_used)
            self.evictions[victim.id] = self.evictions.get(victim.id, 0) + 1
            self.stop(victim)
            running.remove(victim)
        model.status = "loading"
        self.loads[model.id] = self.loads.get(model.id, 0) + 1
        model.port = self._next_child_port()
        if self._limits.load_time > 0:
            model.load_call = self._clock.callLater(
                self._limits.load_time, self._finish_load, model
            )
        else:
            self._finish_load(model)

    def stop(self, model: Model) -> None:
        """Stop a loaded model's server the way the router does.

        The real router answers at once but keeps listing the model as ``loaded`` until the
        model's process has exited (``unload_time``; about 50 ms for a tiny model); a request for
        it meanwhile waits for the exit, then loads the model again.
        """
        unload_time = self._limits.unload_time
        if model.status != "loaded" or unload_time <= 0:
            self.unload(model)
        elif model.unload_call is None:
            model.unload_call = self._clock.callLater(unload_time, self.unload, model)

    def unload(self, model: Model) -> None:
        """Unload at once, failing whoever waits for the model to load."""
        if model.load_call is not None and model.load_call.active():
            model.load_call.cancel()
        model.load_call = None
        if model.unload_call is not None and model.unload_call.active():
            model.unload_call.cancel()
        model.unload_call = None
        model.status, model.port = "unloaded", 0
        waiters, model.waiters = model.waiters, []
        for d in waiters:
            d.errback(HttpError(500, f"model name={model.id} failed to load"))
        gone, model.unload_waiters = model.unload_waiters, []
        for d in gone:
            d.callback(None)
        self._room_freed()

    def cancel_pending(self) -> None:
        """Unload the models still loading or stopping, so that no timer is left behind."""
        for model in self.models.values():
            if model.status == "loading" or model.unload_call is not None:
                self.unload(model)

    def _finish_load(self, model: Model) -> None:
        model.load_call = None
        waiters, model.waiters = model.waiters, []
        if model.id in self._limits.fail_loads:
            model.status, model.failed, model.port = "unloaded", True, 0
            for d in waiters:
                d.errback(HttpError(500, f"model name={model.id} failed to load"))
            return
        model.status, model.failed = "loaded", False
        self._touch(model)
        for d in waiters:
            d.callback(None)

    def _touch(self, model: Model) -> None:
        self._uses += 1
        model.last_used = self._uses

    def _next_child_port(self) -> int:
        self._child_ports += 1
        return _FIRST_CHILD_PORT + self._child_ports
