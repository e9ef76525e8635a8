"""crossbar's own pages under ``/_crossbar/``: status for people and for machines.

A thin Klein app: the config names hosts and routes, the health table says what each
host is doing, the traffic counters say how many requests each carries, the recent
traffic what each did in the last five minutes, and each route's policy says where it
sends traffic right now (asked as the proxy asks it, without moving its state, so the
page cannot disagree with it). It reads all of that; the one thing it changes is the
config, through ``POST /_crossbar/reload``.
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
from twisted.web.resource import IResource, Resource
from twisted.web.util import Redirect
from werkzeug.exceptions import MethodNotAllowed, NotFound

from crossbar import __version__
from crossbar.config import Config, Reloaded, Reloads, RouteConfig
from crossbar.pages.flowshares import FlowShares
from crossbar.pages.hosttokens import recent_usage_json
from crossbar.pages.models import models_json
from crossbar.pages.peers import WorkerInfo, relay_reload
from crossbar.pages.prefixtable import NO_PREFIXES
from crossbar.pages.render import About, StatusPage, model_on
from crossbar.pages.times import rfc3339
from crossbar.pages.usagequery import answer as usage_answer
from crossbar.pages.usagetables import UsageTables
from crossbar.polling import HealthTable, HostState
from crossbar.prefixes import PrefixCounts, PrefixSaves
from crossbar.queueing import Traffic
from crossbar.routing import Ask, Choice, places_conversations, routes_down
from crossbar.stats import (
    CONTENT_TYPE,
    WINDOW_SECONDS,
    HourlyTraffic,
    Metrics,
    RecentTraffic,
    RouteAffinity,
    waiting_by_route,
)
from crossbar.usage import UsageLedger


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
        *,
        recent: RecentTraffic,
        worker: WorkerInfo | None = None,
        reloads: Reloads | None = None,
        reload: Callable[[], Reloaded] | None = None,
        hourly: HourlyTraffic | None = None,
        usage: UsageLedger | None = None,
        prefixes: tuple[PrefixCounts, PrefixSaves] | None = None,
    ) -> None:
        self.config = config
        self.table = table
        self.traffic = traffic
        self.metrics = metrics
        self.clock = clock
        self.gather_metrics = gather_metrics
        """With several workers: every worker's metrics, labelled by worker."""
        self.recent = recent
        self.hourly = hourly
        """Each host's last hour for the page's charts (``None``: no charts' data)."""
        self.about = About(__version__, clock.seconds(), config.source, worker)
        """Built with the service, so ``started`` is when this crossbar started."""
        self.draining = False
        """Crossbar is stopping: readyz says 503 so that a balancer sends elsewhere."""
        self.reloads = reloads
        self.reload = reload
        """Reloads the config (``None``: there is no file to read, as in a demo)."""
        self.usage = usage
        """Usage kept across restarts; ``None``: ``usage_db`` is off."""
        self.usage_panel = UsageTables(usage, clock)
        self.prefixes = prefixes
        """Shared prefixes counted and saved on hosts (``None``: none kept)."""

    def prefixes_json(self) -> dict[str, Any]:
        if self.prefixes is None:
            return NO_PREFIXES
        counts, saves = self.prefixes
        return {"shared": counts.listing(self.clock.seconds()), "hosts": saves.listing()}

    def resource(self) -> IResource:
        return self.app.resource()

    def probes(self) -> IResource:
        """``/_crossbar/`` of the main port when the pages have a listener of their own:
        ``livez`` and ``readyz`` for a load balancer, a JSON 404 for the rest."""
        return _ProbesOnly(self.resource())

    def own_root(self) -> IResource:
        """The root of the pages' own listener (``status_listen``): ``/_crossbar/`` as on
        the main port, ``/`` sends a browser there, a JSON 404 for anything else."""
        return _PagesRoot(self.resource())

    # -- views of the state ----------------------------------------------------------------

    def host_json(self, state: HostState) -> dict[str, Any]:
        doc = state.to_json(self.clock.seconds())
        doc["last_ok"] = rfc3339(state.last_ok)
        doc["in_flight"] = self.traffic.in_flight.get(state.name, 0)
        doc["leaving"] = state.name not in self.config.hosts  # reloaded away, finishing
        if state.max_instances is not None:  # a router's models: in flight, idle, room
            doc |= models_json(state, self.traffic.usage, self.clock.seconds())
        recent = self.recent.host(state.name)
        doc["recent"] = {
            "window_seconds": WINDOW_SECONDS,
            "requests": recent.requests,
            "errors": recent.errors,
            "ttfb_p50_seconds": recent.ttfb_p50,
            **recent_usage_json(recent),
        }
        return doc

    def choices(self, states: Mapping[str, HostState]) -> dict[str, str | None]:
        """Where a request for each route's default model would go now, or ``None``:
        the proxy's first pick, including ``when_all_down: try_all``."""
        return _hosts(self.chosen(states))

    def chosen(self, states: Mapping[str, HostState]) -> dict[str, Choice | None]:
        """:meth:`choices` as the policies made them, with what loading the model costs
        where no healthy host has it loaded."""
        found: dict[str, Choice | None] = {}
        traffic = self.traffic
        for name, route in self.config.routes.items():
            policy = traffic.policies.of(route)
            ask = Ask(route.default_model, now=self.clock.seconds())
            found[name] = policy.choose(route, ask, states, traffic.in_flight, commit=False)
        return found

    def status_json(self, base: str) -> dict[str, Any]:
        """Everything the page shows; ``base`` as for :class:`StatusPage`. A route's
        ``choice_model`` is how its choice holds the default model (see :func:`model_on`)."""
        states = self.table.snapshot()
        chosen = self.chosen(states)
        choices = _hosts(chosen)
        about = self.about
        now = self.clock.seconds()
        worker = about.worker
        affinity = self.affinity()
        waiting = waiting_by_route(self.traffic, now)
        return {
            "version": about.version,
            "uptime_seconds": round(now - about.started, 3),
            "config": about.source,
            "reloads": None if self.reloads is None else self.reloads.to_json(),
            "worker": None if worker is None else {"index": worker.index, "count": worker.count},
            "hosts": {name: self.host_json(state) for name, state in states.items()},
            "routes": {
                name: _route_json(route, choices[name], states, base, affinity.get(name))
                | {"waiting": waiting.get(name, {"requests": 0, "oldest_seconds": None})}
                | _load_json(chosen[name])
                for name, route in self.config.routes.items()
            },
            "slot_shares": {
                flow: round(part, 4) for flow, part in self.traffic.queue.shares(now).items()
            },
            "flows": FlowShares.of(self.traffic.queue.usage(now)).to_json(),
            "prefixes": self.prefixes_json(),
        }

    def affinity(self) -> dict[str, RouteAffinity]:
        """Each ``cache_affinity`` route's turns over the recent window."""
        routes = self.config.routes.items()
        return {n: self.recent.affinity(n) for n, r in routes if places_conversations(r)}

    # -- endpoints -------------------------------------------------------------------------

    @app.route("/", methods=["GET"])
    def page(self, request: IRequest) -> StatusPage:
        """The page for people; Klein flattens it with ``renderElement``, which writes
        ``<!DOCTYPE html>`` first but sets no headers, so they are set here."""
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        _no_store(request)
        states = self.table.snapshot()
        in_flight = dict(self.traffic.in_flight)  # flattened after this returns
        chosen = self.chosen(states)
        return StatusPage(
            self.config,
            states,
            in_flight,
            _hosts(chosen),
            self.clock.seconds(),
            loads={name: c.load for name, c in chosen.items() if c and c.load},
            model_usage=self.traffic.usage,
            about=self.about,
            recent=self.recent.hosts(),
            affinity=self.affinity(),
            base=base_url(request),
            reloads=self.reloads,
            waiting=waiting_by_route(self.traffic, self.clock.seconds()),
            hourly={} if self.hourly is None else self.hourly.hosts(),
            usage_totals=self.usage_panel.current(),
            shares=FlowShares.of(self.traffic.queue.usage(self.clock.seconds())),
            shared_prefixes=self.prefixes_json(),
        )

    @app.route("/status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        return _json(request, self.status_json(base_url(request)))

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

    @app.route("/reload", methods=["POST"])
    def reload_config(self, request: IRequest) -> bytes | Deferred[bytes]:
        """Reload the config, as SIGHUP does. Only where the pages are an admin's: behind
        ``status_keys``, or on ``status_listen``, a port of their own. With workers, the
        answer is worker 0's, which reloads them all."""
        if self.reload is None:
            request.setResponseCode(409)
            return _json(request, {"error": "no config file to reload"})
        if not (self.config.status_keys or self.config.status_listen):
            request.setResponseCode(403)
            return _json(request, {"error": "reload over HTTP needs status_keys or status_listen"})
        worker = self.about.worker
        if worker is not None and worker.index != 0:
            return Deferred.fromCoroutine(self._relayed_reload(request, worker))
        result = self.reload()
        if not result.ok:
            request.setResponseCode(409 if result.conflict else 400)
            return _json(request, {"error": "reload refused", "reason": result.message})
        return _json(
            request, {"reloaded": True, "changes": result.message, "ignored": list(result.ignored)}
        )

    async def _relayed_reload(self, request: IRequest, worker: WorkerInfo) -> bytes:
        code, answer = await relay_reload(worker)
        request.setResponseCode(code)
        return _json(request, answer)

    @app.route("/usage", methods=["GET"])
    def usage_sums(self, request: IRequest) -> Deferred[bytes]:
        """Usage kept in ``usage_db``, summed (see :mod:`crossbar.pages.usagequery`)."""
        return Deferred.fromCoroutine(usage_answer(request, self.usage, self.clock))

    @app.route("/livez", methods=["GET"])
    def livez(self, request: IRequest) -> bytes:
        return _json(request, {"live": True})

    @app.route("/readyz", methods=["GET"])
    def readyz(self, request: IRequest) -> bytes:
        down = routes_down(self.config.routes, self.table.snapshot())
        if self.draining:
            request.setResponseCode(503)
            return _json(request, {"ready": False, "draining": True, "routes_down": down})
        if down:
            request.setResponseCode(503)
        return _json(request, {"ready": not down, "routes_down": down})

    @app.handle_errors(NotFound)
    def not_found(self, request: IRequest, failure: Failure) -> bytes:
        return _not_found(request)

    @app.handle_errors(MethodNotAllowed)
    def not_allowed(self, request: IRequest, failure: Failure) -> bytes:
        request.setResponseCode(405)
        allowed = b"POST" if request.path.endswith(b"/reload") else b"GET, HEAD"
        request.setHeader(b"allow", allowed)
        return _json(request, {"error": "method not allowed"})


class _ProbesOnly(Resource):
    isLeaf = True

    def __init__(self, pages: IResource) -> None:
        super().__init__()
        self._pages = pages

    def render(self, request: Any) -> bytes | int:
        if request.postpath in ([b"livez"], [b"readyz"]):
            result: bytes | int = self._pages.render(request)
            return result
        return _not_found(request)


class _PagesRoot(Resource):
    def __init__(self, pages: IResource) -> None:
        super().__init__()
        self.putChild(b"_crossbar", pages)
        self.putChild(b"", Redirect(b"/_crossbar/"))

    def getChild(self, path: bytes, request: Any) -> IResource:
        return _NotFound()


class _NotFound(Resource):
    isLeaf = True

    def render(self, request: Any) -> bytes:
        return _not_found(request)


def _not_found(request: IRequest) -> bytes:
    request.setResponseCode(404)
    return _json(request, {"error": "not found"})


def _route_json(
    route: RouteConfig,
    choice: str | None,
    states: Mapping[str, HostState],
    base: str,
    affinity: RouteAffinity | None,
) -> dict[str, Any]:
    chosen = None if choice is None else states.get(choice)
    doc: dict[str, Any] = {
        "base_url": f"{base}/{route.name}/v1",
        "hosts": list(route.hosts),
        "policy": route.policy,
        "when_all_down": route.when_all_down,
        "default_model": route.default_model,
        "choice": choice,
        "choice_model": model_on(chosen, route.default_model),
    }
    if affinity is not None:
        doc["affinity"] = {
            "window_seconds": WINDOW_SECONDS,
            "turns": affinity.turns,
            "home": affinity.home,
            "moved": affinity.moved,
            "home_share": affinity.home_share,
        }
    return doc


def _hosts(chosen: Mapping[str, Choice | None]) -> dict[str, str | None]:
    return {name: None if c is None else c.host for name, c in chosen.items()}


def _load_json(choice: Choice | None) -> dict[str, Any]:
    """Where the route's default model would be loaded, and what that evicts; nothing
    when it is loaded on a healthy host or the hosts' room is unknown."""
    load = None if choice is None else choice.load
    return {} if load is None else {"load": load.to_json()}


def base_url(request: IRequest) -> str:
    """crossbar's URL as the reader reached it: the Host header the browser sent (an
    agent on that machine reaches crossbar the same way), else the address the
    connection came in on. Shown as text, escaped like any other."""
    host: bytes | None = request.getHeader(b"host")
    if host:
        return f"http://{host.decode('latin-1')}"
    address: Any = request.getHost()
    where = str(getattr(address, "host", "localhost"))
    port = getattr(address, "port", None)
    if ":" in where:  # IPv6
        where = f"[{where}]"
    return f"http://{where}" if port in (None, 80) else f"http://{where}:{port}"


def _no_store(request: IRequest) -> None:
    request.setHeader(b"cache-control", b"no-store")


def _json(request: IRequest, payload: Mapping[str, Any]) -> bytes:
    request.setHeader(b"content-type", b"application/json")
    _no_store(request)
    return json.dumps(payload, indent=2).encode() + b"\n"
