"""Where a request's one record is made: an exchange as it ended (what was asked, where
it went, how it ended, and what the answer said of its work: tokens, cache hits, the
first token's time, speed, :mod:`crossbar.usage.reader`), or a request refused at the door."""

from __future__ import annotations

from typing import Protocol

from twisted.web import server

from crossbar.config import RouteConfig, Secret
from crossbar.proxy.phases import Phase
from crossbar.queueing import Flow, flow_of
from crossbar.routing import Placement
from crossbar.stats import RequestRecord
from crossbar.usage import AnswerReader


class Ended(Protocol):
    """What of an :class:`~crossbar.proxy.exchange.Exchange` its record reads."""

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
    # By position, in the fields' order: a call with 23 keywords costs twice as much
    # (22k instructions a request against 11k); tests/unit/stats/test_record.py checks the order.
    return RequestRecord(
        route.name if route is not None else "-",  # route
        ended.host,  # host
        # A client that left before the end of its answer did not get it, whatever began.
        499 if left else ended.request.code,  # status
        now - ended.started,  # seconds
        ended.first_byte,  # first_byte
        ended.sent,  # sent
        ended.asked,  # model
        None if placed is None else placed.outcome,  # affinity
        ended.request.method,  # method
        ended.path,  # path
        tuple(ended.tried),  # tried
        ended.phase is Phase.CUT_OFF,  # cut_off
        left,  # client_left
        placed.home if placed is not None and placed.outcome == "moved" else None,  # moved_from
        False,  # refused
        ended.waited,  # waited
        ended.shed_as,  # shed
        flow.name if flow is not None and keyed else None,  # key
        None if usage is None else usage.prompt,  # prompt_tokens
        None if usage is None else usage.cached,  # cached_tokens
        None if usage is None else usage.generated,  # generated_tokens
        None if first is None else first - ended.started,  # first_token
        None if usage is None else usage.tokens_per_second,  # tokens_per_second
        getattr(ended, "reason", None),  # reason: the words of an answer crossbar made
    )
