"""The health table: who is up, and which models each host has resident.

A :class:`HealthTable` holds one immutable :class:`HostState` per host and is the
single source of truth the proxy and the status pages read. A :class:`Poller`
feeds it by asking every host ``GET /health`` then ``GET /v1/models`` on a
``LoopingCall``. It never asks ``/slots``, ``/metrics`` or ``/props?model=``:
in router mode those make llama-server load a model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs
from twisted.application.service import Service
from twisted.internet.defer import CancelledError, Deferred, DeferredList, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as _Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse

from crossbar.config import HostSettings
from crossbar.connect import Discard
from crossbar.failures import describe, is_cancellation, stop_producing

MAX_POLL_BODY = 1024 * 1024

log = Logger()


@attrs.frozen
class HostState:
    """What crossbar knows of one host. Immutable: readers can never change the table."""

    name: str
    url: str
    healthy: bool = False
    loaded: tuple[str, ...] = ()
    known: tuple[str, ...] = ()
    consecutive: int = 0
    last_ok: float | None = None
    last_err: str = ""
    has_failed: bool = False
    polled: bool = False
    """A poll of this host has ended (either way); until then its state is unknown."""
    polls: int = 0
    poll_failures: int = 0
    fails: int = 0
    """Real requests that failed in a row (passive health), reset by one that did not."""

    @property
    def state(self) -> str:
        if not self.polled and not self.has_failed:
            return "unknown"
        return "up" if self.healthy else "down"

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "state": self.state,
            "loaded": list(self.loaded),
            "known": list(self.known),
            "consecutive": self.consecutive,
            "last_ok": self.last_ok,
            "last_err": self.last_err,
        }


class HealthTable:
    """Per-host state, changed only through :meth:`record_ok` and :meth:`record_failure`."""

    def __init__(
        self,
        hosts: Mapping[str, str],
        clock: IReactorTime,
        settings: Mapping[str, HostSettings] | None = None,
    ) -> None:
        self._clock = clock
        self._states = {name: HostState(name=name, url=url) for name, url in hosts.items()}
        self._view = MappingProxyType(self._states)
        default = HostSettings()
        self._settings = {name: (settings or {}).get(name, default) for name in hosts}
        self._listeners: list[Callable[[HostState, HostState], None]] = []

    @property
    def names(self) -> list[str]:
        return list(self._states)

    def get(self, name: str) -> HostState | None:
        return self._states.get(name)

    @property
    def view(self) -> Mapping[str, HostState]:
        """A live read-only view of the states: nothing copied, for the request path."""
        return self._view

    def snapshot(self) -> dict[str, HostState]:
        """A new dict of the current (immutable) states."""
        return dict(self._states)

    def on_change(self, listener: Callable[[HostState, HostState], None]) -> None:
        """Call ``listener(old, new)`` whenever a host's ``state`` changes."""
        self._listeners.append(listener)

    def record_ok(self, name: str, loaded: Iterable[str], known: Iterable[str]) -> None:
        old = self._states.get(name)
        if old is None:
            return
        consecutive = old.consecutive + 1
        healthy = not old.has_failed or consecutive >= self._settings[name].recovery_polls
        self._set(
            attrs.evolve(
                old,
                healthy=healthy,
                fails=0 if healthy and not old.healthy else old.fails,
                loaded=tuple(sorted(set(loaded))),
                known=tuple(sorted(set(known))),
                consecutive=consecutive,
                last_ok=self._clock.seconds(),
                last_err="",
                polled=True,
                polls=old.polls + 1,
            )
        )

    def record_failure(self, name: str, reason: str, *, poll: bool = True) -> None:
        old = self._states.get(name)
        if old is None:
            return
        self._set(
            attrs.evolve(
                old,
                healthy=False,
                consecutive=0,
                last_err=reason,
                has_failed=True,
                polled=old.polled or poll,
                polls=old.polls + poll,
                poll_failures=old.poll_failures + poll,
            )
        )

    def mark_down(self, name: str, reason: str) -> None:
        """Take a host out of service at once, whatever its ``max_fails``."""
        self.record_failure(name, f"marked down: {reason}", poll=False)

    def request_failed(self, name: str, reason: str) -> None:
        """A real request to this host failed; ``max_fails`` in a row mark it down."""
        old = self._states.get(name)
        if old is None:
            return
        fails = old.fails + 1
        if fails >= self._settings[name].max_fails:
            self.mark_down(name, reason)
            self._states[name] = attrs.evolve(self._states[name], fails=fails)
        else:
            self._states[name] = attrs.evolve(old, fails=fails)

    def request_ok(self, name: str) -> None:
        """A real request to this host went well: its run of failures is over."""
        old = self._states.get(name)
        if old is not None and old.fails:
            self._states[name] = attrs.evolve(old, fails=0)

    def _set(self, new: HostState) -> None:
        old = self._states[new.name]
        self._states[new.name] = new
        if old.state != new.state:
            for listener in self._listeners:
                listener(old, new)


def log_transition(old: HostState, new: HostState) -> None:
    """One log line when a host changes state, not one per poll."""
    if new.healthy:
        log.info("host {name} is up", name=new.name)
    else:
        log.warn("host {name} is down: {reason}", name=new.name, reason=new.last_err)


def parse_models(body: bytes) -> tuple[list[str], list[str]]:
    """``(loaded, known)`` model ids from a ``/v1/models`` answer.

    In router mode every model the router knows is listed with ``status.value``;
    only ``loaded`` is resident. An entry without ``status`` (single-model
    llama-server) is resident.
    """
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError('expected {"data": [...]}')
    loaded: list[str] = []
    known: list[str] = []
    for entry in doc["data"]:
        if not isinstance(entry, dict):
            raise ValueError("a data entry is not an object")
        model_id = entry.get("id")
        if not isinstance(model_id, str) or not model_id:
            continue
        known.append(model_id)
        status = entry.get("status")
        if status is None or (isinstance(status, dict) and status.get("value") == "loaded"):
            loaded.append(model_id)
    return loaded, known


class _HTTPGetter(Protocol):
    """The part of treq's ``HTTPClient`` (or ``StubTreq``) the poller uses."""

    def get(self, url: str, /, *, allow_redirects: bool = ...) -> Deferred[Any]: ...


class _TooLarge(Exception):
    pass


class _LimitedBody(_Protocol):
    """Collects a response body, giving up (and closing the connection) past a limit."""

    def __init__(self, limit: int) -> None:
        self.finished: Deferred[bytes] = Deferred(self._cancel)
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._limit:
            self._stop(_TooLarge(f"body larger than {self._limit} bytes"))
        else:
            self._parts.append(data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:  # noqa: B008
        if self.finished.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self.finished.callback(b"".join(self._parts))
        else:
            self.finished.errback(reason)

    def _stop(self, exc: Exception) -> None:
        if not self.finished.called:
            self.finished.errback(exc)
        if self.transport is not None:
            stop_producing(self.transport)

    def _cancel(self, d: Deferred[bytes]) -> None:
        if self.transport is not None:
            stop_producing(self.transport)


def read_limited(response: IResponse, limit: int) -> Deferred[bytes]:
    if response.length != 0 and isinstance(response.length, int) and response.length > limit:
        response.deliverBody(Discard())
        return Deferred.fromCoroutine(_raise(_TooLarge(f"body larger than {limit} bytes")))
    if response.length == 0:
        return succeed(b"")
    reader = _LimitedBody(limit)
    response.deliverBody(reader)
    return reader.finished


async def _raise(exc: Exception) -> bytes:
    raise exc


class PollError(Exception):
    """A poll failed; ``str()`` is the ``last_err`` text."""


class Poller(Service):
    """Polls every host of a table at start and then every ``poll_interval`` of that host.

    Each host has its own ``LoopingCall``, so hosts are polled concurrently and
    independently: a slow host delays no other, and a host whose previous poll is
    still running is skipped on that tick rather than polled twice.
    """

    def __init__(
        self,
        table: HealthTable,
        client: _HTTPGetter,
        clock: IReactorTime,
        settings: Mapping[str, HostSettings] | None = None,
    ) -> None:
        self.table = table
        self._client = client
        self._clock = clock
        default = HostSettings()
        self._settings = {name: (settings or {}).get(name, default) for name in table.names}
        self._running: dict[str, Deferred[None]] = {}
        self._loops: dict[str, LoopingCall] = {}
        self._stopping = False

    def startService(self) -> None:
        super().startService()
        self._stopping = False
        for name in self.table.names:
            loop = LoopingCall(self.tick, name)
            loop.clock = self._clock
            self._loops[name] = loop
            loop.start(self._settings[name].poll_interval, now=True)

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
        settings = self._settings[name]
        try:
            await self._get(state.url + settings.health_path, "health", settings.poll_timeout)
            body = await self._get(state.url + "/v1/models", "models", settings.poll_timeout)
            try:
                loaded, known = parse_models(body)
            except ValueError as e:
                raise PollError(f"models: bad answer: {e}") from None
        except CancelledError:
            if self._stopping:
                return
            self.table.record_failure(name, "poll cancelled")
        except PollError as e:
            self.table.record_failure(name, str(e))
        except Exception as e:  # a failing host must never stop the poller
            self.table.record_failure(name, f"poll: {describe(e)}")
        else:
            self.table.record_ok(name, loaded, known)

    async def _get(self, url: str, what: str, timeout: float) -> bytes:
        d = Deferred.fromCoroutine(self._fetch(url, what))
        d.addTimeout(timeout, self._clock)
        try:
            return await d
        except DeferredTimeout:
            raise PollError(f"{what}: timed out after {timeout:g}s") from None

    async def _fetch(self, url: str, what: str) -> bytes:
        try:
            response = await self._client.get(url, allow_redirects=False)
        except Exception as e:
            if is_cancellation(e):
                raise CancelledError() from None
            raise PollError(f"{what}: {describe(e)}") from None
        if response.code != 200:
            response.deliverBody(Discard())
            raise PollError(f"{what}: HTTP {response.code}")
        try:
            return await read_limited(response, MAX_POLL_BODY)
        except Exception as e:
            if is_cancellation(e):
                raise CancelledError() from None
            raise PollError(f"{what}: {describe(e)}") from None
