"""The health poller: ``GET /health`` then ``GET /v1/models`` of every host, on a
``LoopingCall`` per host, with treq.

It never asks ``/slots``, ``/metrics`` or a plain ``/props?model=``: in router mode those
make llama-server load a model. After a good list it asks a few models the host lists as
loaded for their slots with ``/props?model=X&autoload=false``, which a router answers
for a loaded X only and loads nothing for (see :mod:`crossbar.polling.slots`; the same
answer tells a slot's window, ``default_generation_settings.n_ctx``), and now
and then the router's own ``/props``, without ``?model=``, for its room
(:mod:`crossbar.polling.routerprops`); an answer it cannot use leaves either unknown and
the host up.
What it learns goes into the :class:`HealthTable`. A host with an ``api_key`` gets it on
every poll (``llama-server --api-key`` refuses ``/v1/models`` without it); the client it
is given asks for no compression.

A model list is digested as it arrives, and read only when it differs from the host's
last one: a list does not change between most polls, and reading a long one costs more
than a poll should take on the reactor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from hashlib import blake2b
from typing import Any, Protocol

import attrs
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.web.http import RESPONSES

from crossbar.config import Secret
from crossbar.polling.health import HealthTable
from crossbar.polling.listreader import ListUnread
from crossbar.polling.modellist import ModelList, read_models
from crossbar.polling.responses import Digest, PollError, discard, read_limited
from crossbar.polling.routerprops import ROOM_PATH, RoomAsks, read_room
from crossbar.polling.slots import MAX_PROPS_BODY, ModelProps, SlotAsks, props_path, read_props
from crossbar.upstream import describe, is_cancellation

MAX_POLL_BODY = 8 * 1024 * 1024
"""Largest answer a poll reads: a model list is a few KiB (100,000 models, about 5 MiB)."""
REREAD_BYTES = 1024 * 1024
REREAD_SECONDS = 60.0
"""A model list answer over :data:`REREAD_BYTES` (a lab's is tens of KiB) that changed is
read at most once in this time: reading 8 MiB of tiny entries holds the reactor for up
to a second, and a host could send a new one on every poll."""
_CHECKS = {"health": "health check", "models": "model list", "props": "slot count"}


_Headers = dict[bytes | str, list[bytes | str]]
"""Request headers as treq takes them."""


class _HTTPGetter(Protocol):
    """The part of treq's ``HTTPClient`` (or ``StubTreq``) the poller uses."""

    def get(
        self,
        url: str,
        /,
        *,
        allow_redirects: bool = ...,
        headers: _Headers | None = ...,
    ) -> Deferred[Any]: ...


async def _read_here(body: bytes) -> ModelList:
    return read_models(body)


def _authorization(keys: Mapping[str, Secret] | None) -> dict[str, _Headers]:
    return {
        name: {b"Authorization": [b"Bearer " + key.value]} for name, key in (keys or {}).items()
    }


@attrs.frozen
class _Read:
    """One host's model list answer as last read: its digest, when, and what it gave."""

    digest: bytes
    at: float
    models: ModelList | None
    error: str = ""


class Poller(Service):
    """Polls every host of a table at start and then every ``poll_interval`` of that host.

    Each host has its own ``LoopingCall``, so hosts are polled concurrently and
    independently: a slow host delays no other, and a host whose previous poll is
    still running is skipped on that tick rather than polled twice. ``keys`` (host name
    -> key) go out as ``Authorization: Bearer`` on that host's polls. ``client`` is
    one client for every host, or one per host name (each with that host's own TLS
    trust: two hosts may share an address and not a CA).
    """

    def __init__(
        self,
        table: HealthTable,
        client: _HTTPGetter | Mapping[str, _HTTPGetter],
        clock: IReactorTime,
        keys: Mapping[str, Secret] | None = None,
        read: Callable[[bytes], Awaitable[ModelList]] | None = None,
    ) -> None:
        self.table = table
        self._client = client
        self._clock = clock
        self._headers = _authorization(keys)
        self._read = read or _read_here
        """Reads a model list answer (a :class:`ListReader`'s, to read long ones aside)."""
        self._lists: dict[str, _Read] = {}
        """What each host's last model list read gave, by the digest of its answer."""
        self._asks: dict[str, SlotAsks] = {}
        """Which of each host's loaded models were asked for their slots, and when."""
        self._room_asks = RoomAsks()
        self._running: dict[str, Deferred[None]] = {}
        self._loops: dict[str, LoopingCall] = {}
        self._stopping = False
        self.first_round: Deferred[None] = Deferred()
        """Fires once every host's first poll has ended, well or not (set at start)."""

    def startService(self) -> None:
        super().startService()
        self._stopping = False
        for name in self.table.names:
            self._watch(name)
        first = [d for d in self._running.values() if not d.called]
        self.first_round = DeferredList(first, consumeErrors=True).addCallback(lambda _: None)

    def set_hosts(
        self,
        client: _HTTPGetter | Mapping[str, _HTTPGetter],
        keys: Mapping[str, Secret],
        restart: Iterable[str] = (),
    ) -> None:
        """Follow the table after a reload: ``client`` knows the hosts' new addresses;
        hosts new to the table are polled at once, those in ``restart`` (a new address or
        poll interval) too, on a new loop, and those gone from it are no longer polled
        (a poll of theirs under way is dropped unrecorded)."""
        self._client = client
        self._headers = _authorization(keys)
        if not self.running:
            return
        names = set(self.table.names)
        for name in [n for n in self._loops if n not in names or n in restart]:
            self.forget(name)
        for name in self.table.names:
            if name not in self._loops:
                self._watch(name)

    def forget(self, name: str) -> None:
        """Stop polling a host; a poll of it under way is cancelled and not recorded."""
        self._lists.pop(name, None)
        self._asks.pop(name, None)
        self._room_asks.forget(name)
        loop = self._loops.pop(name, None)
        if loop is not None and loop.running:
            loop.stop()
        running = self._running.pop(name, None)
        if running is not None:
            running.cancel()

    def _watch(self, name: str) -> None:
        loop = LoopingCall(self.tick, name)
        loop.clock = self._clock
        self._loops[name] = loop
        loop.start(self.table.settings[name].poll_interval, now=True)

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        self._stopping = True
        for loop in self._loops.values():
            if loop.running:
                loop.stop()
        self._loops.clear()
        running = list(self._running.values())
        for d in running:
            d.cancel()
        return DeferredList(running, consumeErrors=True)

    def tick(self, name: str) -> None:
        """Start a poll of one host unless one is running."""
        if name not in self._running:
            self.poll_now(name)

    def poll_now(self, name: str) -> Deferred[None]:
        d = Deferred.fromCoroutine(self.poll(name))
        if not d.called:
            self._running[name] = d
            d.addBoth(self._done, name)
        return d

    def _done(self, result: object, name: str) -> object:
        self._running.pop(name, None)
        return result

    async def poll(self, name: str) -> None:
        """Poll one host and record the outcome; never raises except on cancellation."""
        state = self.table.get(name)
        if state is None:
            return
        settings = self.table.settings[name]
        timeout = settings.poll_timeout
        try:
            await self._get(name, state.url + settings.health_path, "health", timeout)
            digest = blake2b(digest_size=16)
            body = await self._get(name, state.url + "/v1/models", "models", timeout, digest)
            models = await self._models(name, body, digest.digest())
        except CancelledError:
            if self._stopping or name not in self._loops:  # stopping, or forgotten
                return
            self._failed(name, "poll cancelled")
        except PollError as e:
            self._failed(name, str(e))
        except Exception as e:  # a failing host must never stop the poller
            self._failed(name, f"poll: {describe(e)}")
        else:
            listed, note = models.listed, models.note
            loading, trained = models.loading, dict(models.trained)
            self.table.record_ok(
                name,
                models.loaded,
                models.known,
                listed=listed,
                note=note,
                loading=loading,
                trained=trained,
            )
            await self._learn_slots(name, state.url, models.loaded, timeout)
            await self._learn_room(name, state.url, timeout)

    def _failed(self, name: str, reason: str) -> None:
        """Record a failed poll; a host that failed may have restarted with other
        ``-np``: every loaded model's slots are asked again once it answers."""
        self._asks.pop(name, None)
        self._room_asks.forget(name)
        self.table.record_failure(name, reason)

    async def _learn_slots(
        self, name: str, url: str, loaded: Iterable[str], timeout: float
    ) -> None:
        """Ask the due loaded models' ``/props`` at once (each within ``timeout``), and
        record what each said; nothing here can mark the host down."""
        asks = self._asks.setdefault(name, SlotAsks())
        due = asks.due(loaded, self._clock.seconds())
        if due:
            each = [Deferred.fromCoroutine(self._ask(name, url, m, timeout)) for m in due]
            await DeferredList(each, consumeErrors=True)

    async def _ask(self, name: str, url: str, model: str, timeout: float) -> None:
        try:
            body = await self._get(name, url + props_path(model), "props", timeout, None)
        except CancelledError:
            raise
        except Exception:  # refused, timed out, too long: the slots stay unknown
            props = ModelProps()
        else:
            props = read_props(body)
        self.table.record_slots(name, model, props.slots)
        self.table.record_window(name, model, props.window)

    async def _learn_room(self, name: str, url: str, timeout: float) -> None:
        """Now and then, the host's own ``/props``, asked without ``?model=`` (which would
        load a model): a router's ``max_instances``. An answer it cannot use changes nothing."""
        if self._stopping or self.table.get(name) is None:  # asks cancelled: stop here
            return
        if not self._room_asks.due(name, self._clock.seconds()):
            return
        try:
            body = await self._get(name, url + ROOM_PATH, "props", timeout, None)
        except CancelledError:
            raise
        except Exception:  # refused, timed out, too long: the room stays as it was
            return
        self.table.record_room(name, read_room(body))

    async def _models(self, name: str, body: bytes, digest: bytes) -> ModelList:
        """The host's list: what the last one read gave when the answer is the same to
        the byte, or when it is long and was read less than :data:`REREAD_SECONDS` ago."""
        now = self._clock.seconds()
        last = self._lists.get(name)
        if last is None or (
            last.digest != digest and (len(body) <= REREAD_BYTES or now - last.at >= REREAD_SECONDS)
        ):
            try:
                last = _Read(digest, now, await self._read(body))
            except ValueError as e:
                last = _Read(digest, now, None, f"models: bad answer: {e}")
            except ListUnread as e:
                size = f"{len(body) / 1048576:.1f} MiB"
                last = _Read(digest, now, None, f"models: a list of {size} could not be read: {e}")
            self._lists[name] = last
        if last.models is None:
            raise PollError(last.error)
        return last.models

    async def _get(
        self, name: str, url: str, what: str, timeout: float, digest: Digest | None = None
    ) -> bytes:
        d = Deferred.fromCoroutine(self._fetch(name, url, what, digest))
        d.addTimeout(timeout, self._clock)
        try:
            return await d
        except DeferredTimeout:
            raise PollError(f"{what}: timed out after {timeout:g}s") from None

    def _client_for(self, name: str) -> _HTTPGetter:
        client = self._client
        return client[name] if isinstance(client, Mapping) else client

    async def _fetch(self, name: str, url: str, what: str, digest: Digest | None) -> bytes:
        headers = self._headers.get(name)
        client = self._client_for(name)
        try:
            response = await client.get(url, allow_redirects=False, headers=headers)
        except Exception as e:
            if is_cancellation(e):
                raise CancelledError() from None
            raise PollError(f"{what}: {describe(e)}") from None
        if response.code in (401, 403):
            discard(response)
            phrase = RESPONSES[response.code].decode().lower()
            hint = "check the host's api_key" if headers else "the host needs an api_key"
            raise PollError(f"{_CHECKS[what]} refused: {response.code} {phrase} — {hint}")
        if response.code != 200:
            discard(response)
            raise PollError(f"{what}: HTTP {response.code}")
        limit = MAX_PROPS_BODY if what == "props" else MAX_POLL_BODY
        try:
            return await read_limited(response, limit, digest)
        except PollError as e:
            raise PollError(f"{what}: {e}") from None
        except Exception as e:
            if is_cancellation(e):
                raise CancelledError() from None
            raise PollError(f"{what}: {describe(e)}") from None
