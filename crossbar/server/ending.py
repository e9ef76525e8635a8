"""An exchange as it ended, made into the one record its observers read: what was asked,
where it went, how it ended, and what the answer said of its work (tokens, cache hits,
the first token's time, speed: :mod:`crossbar.server.usage`)."""

from __future__ import annotations

from typing import Protocol

from twisted.web import server

from crossbar.config import RouteConfig, Secret
from crossbar.fleet import Placement, RequestRecord
from crossbar.fleet.queue import Flow
from crossbar.server.phases import Phase
from crossbar.server.usage import AnswerReader
from crossbar.server.waiting import flow_of


class Ended(Protocol):
    """What of an :class:`~crossbar.server.exchange.Exchange` its record reads."""

    request: server.Request
    phase: Phase
    route: RouteConfig | None
    host: str | None
    started: float
    first_byte: float | None
    asked: str | None
    placement: Placement | None
    path: bytes
    tried: list[str]
    waited: float | None
    shed_as: str | None
    flow: Flow | None
    reader: AnswerReader | None

    @property
    def sent(self) -> int: ...


def door_key(request: server.Request) -> Secret | None:
    """The key the door let ``request`` in with (a :class:`ProxyRequest`'s), if any."""
    key: Secret | None = getattr(request, "key", None)
    return key


def record_of(ended: Ended, now: float) -> RequestRecord:
    """The record of ``ended`` at ``now``."""
    placed, reader = ended.placement, ended.reader
    # A client that leaves once the stream's last event reached it (as Codex does) had it all.
    left = ended.phase is Phase.CLIENT_LEFT and not (reader is not None and reader.whole())
    usage = None if reader is None else reader.usage()
    first = None if reader is None or reader.first_content is None else reader.first_content
    flow, route = ended.flow, ended.route
    keyed = route is not None and bool(route.api_keys)
    if flow is None and route is not None and keyed:  # who, for usage: only where keys are
        request = ended.request
        flow = flow_of(route, request.requestHeaders.getAllRawHeaders(), "", door_key(request))
    return RequestRecord(
        route=route.name if route is not None else "-",
        host=ended.host,
        # A client that left before the end of its answer did not get it, whatever began.
        status=499 if left else ended.request.code,
        seconds=now - ended.started,
        first_byte=ended.first_byte,
        sent=ended.sent,
        model=ended.asked,
        affinity=None if placed is None else placed.outcome,
        method=ended.request.method,
        path=ended.path,
        tried=tuple(ended.tried),
        cut_off=ended.phase is Phase.CUT_OFF,
        client_left=left,
        moved_from=placed.home if placed is not None and placed.outcome == "moved" else None,
        waited=ended.waited,
        shed=ended.shed_as,
        key=flow.name if flow is not None and keyed else None,
        prompt_tokens=None if usage is None else usage.prompt,
        cached_tokens=None if usage is None else usage.cached,
        generated_tokens=None if usage is None else usage.generated,
        first_token=None if first is None else first - ended.started,
        tokens_per_second=None if usage is None else usage.tokens_per_second,
    )
