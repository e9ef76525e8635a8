"""Every model server's slots on one simulated host, and the requests waiting for one.

A llama-server with every slot busy keeps a new request in its queue until a slot is free;
the simulator does the same, first come first served, so that a host given more
conversations than slots is slower as well as forgetful.  Each model server (in router mode
each loaded model is a child process of its own) has its own ``PromptCache``; it starts empty
again when the model restarts or its number of slots changes, as a real one would.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from twisted.internet.defer import CancelledError, Deferred

from crossbar.testing.simulator.cache import Prefill, PromptCache, Tokens


class Settings(Protocol):
    """The host's flags, read at every request: tests change them at any time."""

    slots: int
    cache_ram: int
    slot_similarity: float


@dataclass
class _Server:
    started: tuple[int, int]  # the model server's port and its number of slots
    cache: PromptCache
    waiting: deque[Deferred[None]] = field(default_factory=deque)


class ModelSlots:
    """The prompt caches of one host, by model."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._servers: dict[str, _Server] = {}
        self.most_waiting = 0
        """The most requests that ever waited at once in one model server's own queue."""

    def cache(self, model: str) -> PromptCache | None:
        server = self._servers.get(model)
        return None if server is None else server.cache

    def running(self, model: str, port: int) -> PromptCache:
        """The cache of ``model``'s server, listening on ``port`` (started afresh if need be)."""
        return self._server(model, port).cache

    async def take(self, model: str, port: int, tokens: Tokens) -> tuple[PromptCache, Prefill]:
        """A slot for ``tokens`` on ``model``'s server (listening on ``port``), once one is free."""
        while True:
            server = self._server(model, port)
            prefill = server.cache.start(tokens)
            if prefill is not None:
                return server.cache, prefill
            turn: Deferred[None] = Deferred()
            server.waiting.append(turn)
            self.most_waiting = max(self.most_waiting, len(server.waiting))
            try:
                await turn
            except CancelledError:
                if turn in server.waiting:
                    server.waiting.remove(turn)
                raise

    def give_back(self, cache: PromptCache, prefill: Prefill, tokens: Tokens) -> None:
        """The request is over: its slot keeps ``tokens`` and the next waiting request runs."""
        cache.finish(prefill.slot, tokens)
        server = self._servers.get(prefill.model)
        if server is not None and server.cache is cache and server.waiting:
            server.waiting.popleft().callback(None)

    def _server(self, model: str, port: int) -> _Server:
        settings = self._settings
        started = (port, settings.slots)
        server = self._servers.get(model)
        if server is None or server.started != started:
            cache = PromptCache(model, settings.slots, settings.cache_ram)
            old, server = server, _Server(started, cache)
            self._servers[model] = server
            while old is not None and old.waiting:
                old.waiting.popleft().callback(None)  # they try again on the new server
        server.cache.cache_ram = settings.cache_ram
        server.cache.similarity = settings.slot_similarity
        return server
