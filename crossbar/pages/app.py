"""crossbar's own pages under ``/_crossbar/``: status for people and for machines.

A thin Klein app that only reads: the config names hosts and routes, the health
table says what each host is doing, the traffic counters say how many requests each
carries, and :func:`crossbar.fleet.choose_for_route` says where a route sends traffic
right now (the same rule the proxy applies, so the page cannot disagree with it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from werkzeug.exceptions import MethodNotAllowed, NotFound

from crossbar.config import Config
from crossbar.fleet import HealthTable, HostState, Traffic, choose_for_route, routes_down
from crossbar.pages.metrics import CONTENT_TYPE, Metrics
from crossbar.pages.render import StatusPage, rfc3339


class StatusApp:
    """The ``/_crossbar/`` pages; mount :meth:`resource` on crossbar's root."""

    app = Klein()

    def __init__(
        self,
        config: Config,
        table: HealthTable,
        traffic: Traffic,
        metrics: Metrics,
        clock: IReactorTime,
        gather_metrics: Callable[[], Deferred[bytes]] | None = None,
    ) -> None:
        self.config = config
        self.table = table
        self.traffic = traffic
        self.metrics = metrics
        self.clock = clock
        self.gather_metrics = gather_metrics
        """With several workers: every worker's metrics, labelled by worker."""

    def resource(self) -> IResource:
        return self.app.resource()

    # -- views of the state ----------------------------------------------------------------

    def host_json(self, state: HostState) -> dict[str, Any]:
        doc = state.to_json()
        doc["last_ok"] = rfc3339(state.last_ok)
        doc["in_flight"] = self.traffic.in_flight.get(state.name, 0)
        return doc

    def choices(self, states: Mapping[str, HostState]) -> dict[str, str | None]:
        """Where a request for each route's default model would go now, or ``None``:
        the proxy's first pick, including ``when_all_down: try_all``."""
        found: dict[str, str | None] = {}
        for name, route in self.config.routes.items():
            turn = self.traffic.turns.get(name, 0)
            found[name] = choose_for_route(
                route, route.default_model, states, self.traffic.in_flight, turn
            )
        return found

    def status_json(self) -> dict[str, Any]:
        states = self.table.snapshot()
        choices = self.choices(states)
        return {
            "hosts": {name: self.host_json(state) for name, state in states.items()},
            "routes": {
                name: {
                    "hosts": list(route.hosts),
                    "default_model": route.default_model,
                    "choice": choices[name],
                }
                for name, route in self.config.routes.items()
            },
        }

    # -- endpoints -------------------------------------------------------------------------

    @app.route("/", methods=["GET"])
    def page(self, request: IRequest) -> StatusPage:
        """The page for people; Klein flattens it with ``renderElement``, which writes
        ``<!DOCTYPE html>`` first but sets no headers, so they are set here."""
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        _no_store(request)
        states = self.table.snapshot()
        in_flight = dict(self.traffic.in_flight)  # flattened after this returns
        return StatusPage(
            self.config, states, in_flight, self.choices(states), self.clock.seconds()
        )

    @app.route("/status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        return _json(request, self.status_json())

    @app.route("/status/<host>", methods=["GET"])
    def host_status(self, request: IRequest, host: str) -> bytes:
        state = self.table.get(host)
        if state is None:
            request.setResponseCode(404)
            return _json(request, {"error": "unknown host"})
        return _json(request, self.host_json(state))

    @app.route("/metrics", methods=["GET"])
    def metrics_text(self, request: IRequest) -> bytes | Deferred[bytes]:
        request.setHeader(b"content-type", CONTENT_TYPE.encode("ascii"))
        _no_store(request)
        if self.gather_metrics is None or b"local" in (request.args or {}):
            return self.metrics.render()
        return self.gather_metrics()

    @app.route("/livez", methods=["GET"])
    def livez(self, request: IRequest) -> bytes:
        return _json(request, {"live": True})

    @app.route("/readyz", methods=["GET"])
    def readyz(self, request: IRequest) -> bytes:
        down = routes_down(self.config.routes, self.table.snapshot())
        if down:
            request.setResponseCode(503)
        return _json(request, {"ready": not down, "routes_down": down})

    @app.handle_errors(NotFound)
    def not_found(self, request: IRequest, failure: Failure) -> bytes:
        request.setResponseCode(404)
        return _json(request, {"error": "not found"})

    @app.handle_errors(MethodNotAllowed)
    def not_allowed(self, request: IRequest, failure: Failure) -> bytes:
        request.setResponseCode(405)
        request.setHeader(b"allow", b"GET, HEAD")
        return _json(request, {"error": "method not allowed"})


def _no_store(request: IRequest) -> None:
    request.setHeader(b"cache-control", b"no-store")


def _json(request: IRequest, payload: Mapping[str, Any]) -> bytes:
    request.setHeader(b"content-type", b"application/json")
    _no_store(request)
    return json.dumps(payload, indent=2).encode() + b"\n"
