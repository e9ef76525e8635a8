"""What a request may do on its way to a host, beside the queue's own rules: who it is to
the queue (its flow), whether its key may ask for its model, whether its key may make a
host load one more model this minute, whether its key is still good when it leaves the
queue after a reload, and whether a host's 500 may say it failed to load the model. Each
is asked by the exchange at its step; none does I/O."""

from __future__ import annotations

from collections.abc import Sequence

from twisted.web import server

from crossbar.config import KeyHolder, RouteConfig, key_held
from crossbar.http import BadTarget
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.proxy.outcome import Outcome, door_key, makes_load
from crossbar.queueing import Go, Queued, Refused, Waiter, flow_of
from crossbar.routing import Choice, refused_model

GO = Go()
"""Admitted, no host left out: a request that takes no slot, or a route that does not queue."""


def admission(
    proxy: ProxyContext,
    waiter: Waiter,
    request: server.Request,
    asked: Asked,
    outcome: Outcome,
    holding: str | None = None,
    small: Sequence[str] = (),
) -> Go | Queued | Refused:
    """Whether the request goes to a host now, waits for a slot, or is answered now
    (:meth:`crossbar.queueing.Waits.admit`). Only a request that takes a slot, on a route
    that queues, is asked; once admitted, its flow counts it (``outcome.flow``; not while
    it waits, having given back its slot on ``holding``, if it held one); ``small``: hosts
    too small for its prompt, neither waited for nor counted as full. Its flow
    is who it is, for fairness: its key's holder, an unnamed key, or its client (behind
    one of the config's trusted proxies, the client that proxy forwards)."""
    route, waits = outcome.route, proxy.waits
    if waits is None or route is None or not route.queue or not asked.slot or not waits.active():
        return GO
    flow = outcome.flow  # a popped one is known already
    if flow is None:
        head, trusted = request.requestHeaders.getAllRawHeaders(), proxy.config.trusted_proxies
        flow = flow_of(route, head, asked.client, door_key(request), trusted)
    admitted = waits.admit(
        waiter, route, asked.model, flow, asked.conversation,
        tried=outcome.tried, waited=outcome.waited is not None, counted=outcome.flow is not None,
        holding=holding, small=small,
    )  # fmt: skip
    outcome.flow = flow if isinstance(admitted, Go) else None
    return admitted


def holder_of(route: RouteConfig, request: server.Request) -> KeyHolder | None:
    """The named holder of the route's key ``request`` came in with (the door's word,
    else the head read again), on a route with keys."""
    if not route.api_keys:
        return None
    key = door_key(request)
    if key is None or not any(mine is key for mine in route.api_keys):
        key = key_held(list(request.requestHeaders.getAllRawHeaders()), route.api_keys)
    return None if key is None else key.holder


def check_model(route: RouteConfig, request: server.Request, asked: Asked) -> None:
    """Raises a 403 in words when the route, or the request's key, may not ask for the
    model its body names (a request naming none is not checked here)."""
    why = refused_model(route, holder_of(route, request), asked.asked)
    if why is not None:
        raise BadTarget(403, why)


def load_refusal(
    proxy: ProxyContext, route: RouteConfig, request: server.Request, choice: Choice
) -> Refused | None:
    """A 429 in words when ``choice`` makes its host load a model and the request's key
    has made as many loads this minute as its ``max_loads_per_minute``; else the load, if
    any, is counted against the key and ``None`` is returned."""
    if not makes_load(choice):
        return None  # no load, or waiting for one already under way
    holder, budget = holder_of(route, request), proxy.traffic.loads
    now = proxy.clock.seconds()
    words = budget.refusal(holder, now)
    if words is None:
        budget.count(holder, now)
        return None
    return Refused(429, words, budget.retry_after(holder, now), "limit")


def revoked(proxy: ProxyContext, route: RouteConfig | None, request: server.Request) -> bool:
    """Whether the key ``request`` came in with is no longer one of its route's, as the
    config now in force has it (a reload removed it while the request waited)."""
    if route is None or not route.api_keys or proxy.waits is None:
        return False
    now = proxy.waits.route(route.name)
    if now is None or not now.api_keys:
        return False
    return key_held(list(request.requestHeaders.getAllRawHeaders()), now.api_keys) is None


def load_watched(proxy: ProxyContext, host: str, asked: Asked, status: int) -> bool:
    """Whether a ``status`` answer from ``host`` may be a failed load of the request's
    model (a router's 500, the model not loaded there when chosen): then its body is read
    for it before any of it is relayed (:class:`crossbar.proxy.relay.LoadCheck`)."""
    if status != 500 or asked.model is None:
        return False
    state = proxy.table.view.get(host)
    return state is not None and asked.model not in state.loaded
