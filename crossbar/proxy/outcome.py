"""Where a request's one record is made: an :class:`Outcome` filled in as its exchange
goes (what was asked, where it went, how it waited, what the answer said of its work:
tokens, cache hits, the first token's time, speed, :mod:`crossbar.usage.reader`), made
into a :class:`~crossbar.stats.RequestRecord` as it ends. An answer's reader is bounded by
what is plausible for its request on its host (:func:`answer_reader`): a hostile or broken
host's larger numbers are dropped, not charged to the key, and said in one line."""

from __future__ import annotations

import attrs
from twisted.logger import Logger
from twisted.web import server

from crossbar.config import RouteConfig, Secret
from crossbar.http import ProxyRequest
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.proxy.phases import Phase
from crossbar.queueing import Flow, flow_of
from crossbar.routing import LOADING, Choice, Placement
from crossbar.stats import RequestRecord
from crossbar.usage import APIS, AnswerReader, Bounds

log = Logger()


@attrs.define
class Outcome:
    """What a request's record will say, filled in by its exchange as it goes."""

    started: float
    """When the exchange began, on the clock's time."""
    route: RouteConfig | None = None
    """Its route, once its path named one."""
    path: bytes = b"-"
    """The route's part of the path once a route is known, else the path as asked."""
    model: str | None = None
    """The model its body asked for (the route's default filled in, an alias mapped)."""
    alias: str | None = None
    """The name the client sent, when a route's alias mapped it to ``model``."""
    generates: bool = True
    """It takes a slot of its host (:meth:`crossbar.proxy.shapes.Shape.uses_slot`)."""
    host: str | None = None
    """The last host tried."""
    tried: list[str] = attrs.Factory(list)
    """Every host tried, in order."""
    failures: list[tuple[str, str]] = attrs.Factory(list)
    """Each host that failed and another was tried, with why, in order."""
    placement: Placement | None = None
    """Where ``cache_affinity`` placed it, at the last host."""
    flow: Flow | None = None
    """Who it is, where slots are counted (once counted in its flow's share)."""
    waited: float | None = None
    """Seconds it waited in crossbar for a slot."""
    shed: str | None = None
    """Why the queue answered it, if it did."""
    first_byte: float | None = None
    """Seconds until the host's status line."""
    reader: AnswerReader | None = None
    """What the answer says of its work, where its API says it."""
    reason: str | None = None
    """The words of an answer crossbar made itself (a refusal, an error), for the log."""
    size_note: str | None = None
    """What its prompt's size changed, in words (:class:`crossbar.proxy.fitting.Fit`)."""
    loads: int = 0
    """Loads of its model its hosts were sent it to make (:func:`makes_load`)."""

    def chose(self, choice: Choice) -> None:
        """The policy's ``choice`` is where it goes next: its placement, and any load it makes."""
        self.placement = choice.placement
        self.loads += makes_load(choice)

    def record(self, request: server.Request, phase: Phase, sent: int, now: float) -> RequestRecord:
        """The record of the request as it ended at ``now`` in ``phase``, ``sent`` bytes
        of its answer's body relayed."""
        placed, reader = self.placement, self.reader
        # A client that leaves once the stream's last event reached it (as Codex does) had it all.
        left = phase is Phase.CLIENT_LEFT and not (reader is not None and reader.whole())
        usage = None if reader is None else reader.usage()
        first = None if reader is None or reader.first_content is None else reader.first_content
        flow, route = self.flow, self.route
        keyed = route is not None and bool(route.api_keys)
        if flow is None and route is not None and keyed:  # who, for usage: only where keys are
            head = request.requestHeaders.getAllRawHeaders()
            flow = flow_of(route, head, "", door_key(request))
        return RequestRecord(
            route=route.name if route is not None else "-",
            host=self.host,
            # A client that left before the end of its answer did not get it, whatever began.
            status=499 if left else request.code,
            seconds=now - self.started,
            first_byte=self.first_byte,
            sent=sent,
            model=self.model,
            asked_model=self.alias,
            generates=self.generates,
            affinity=None if placed is None else placed.outcome,
            method=request.method,
            path=self.path,
            tried=tuple(self.tried),
            failures=tuple(self.failures),
            cut_off=phase is Phase.CUT_OFF,
            client_left=left,
            moved_from=placed.home if placed is not None and placed.outcome == "moved" else None,
            refused=False,
            waited=self.waited,
            shed=self.shed,
            key=flow.name if flow is not None and keyed else None,
            prompt_tokens=None if usage is None else usage.prompt,
            cached_tokens=None if usage is None else usage.cached,
            generated_tokens=None if usage is None else usage.generated,
            first_token=None if first is None else first - self.started,
            tokens_per_second=None if usage is None else usage.tokens_per_second,
            loads=self.loads,
            reason=self.reason,
            size_note=self.size_note,
        )


def makes_load(choice: Choice) -> bool:
    """Whether sending a request to ``choice`` makes its host load the model: it is loaded
    on no healthy host of the group, and no load of it is under way there."""
    return choice.load is not None and choice.load.rank != LOADING


def door_key(request: server.Request) -> Secret | None:
    """The key the door let ``request`` in with (a :class:`ProxyRequest`'s), if any."""
    return request.key if isinstance(request, ProxyRequest) else None


def answer_reader(
    proxy: ProxyContext, host: str, asked: Asked, streamed: bool
) -> AnswerReader | None:
    """A reader for the answer ``host`` sends to ``asked`` (``None``: its API says
    nothing of its work). Its numbers are bounded: prompt tokens by the host's learned
    window for the model, generated ones by the request's answer limit and a margin
    (:class:`crossbar.usage.counts.Bounds`)."""
    if asked.api not in APIS:
        return None
    state = proxy.table.view.get(host)
    window = state.window(asked.model) if state is not None else None
    bounds = Bounds.of(window, asked.reply_limit)
    model = asked.model or "-"

    def said(words: str) -> None:
        log.warn("host {host}, model {model}: {words}", host=host, model=model, words=words)

    return AnswerReader(asked.api, streamed, proxy.clock.seconds, bounds, said)
