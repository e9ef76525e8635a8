"""crossbar's own pages under ``/_crossbar/``: status for people and for machines.

A thin Klein app that only reads: the config names hosts and routes, the health
table says what each host is doing, the proxy says how many requests it carries,
and :func:`crossbar.routing.choose` says where a route sends traffic right now (the
same rule the proxy applies, so the page cannot disagree with it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any, Protocol

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from werkzeug.exceptions import MethodNotAllowed, NotFound

from crossbar.config import Config, RouteConfig
from crossbar.health import HealthTable, HostState
from crossbar.metrics import CONTENT_TYPE, Metrics
from crossbar.routing import choose

REFRESH_SECONDS = 5


def rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


def ago(seconds: float) -> str:
    """A short, rounded-down age: ``"3 s ago"``, ``"4 min ago"``, ``"2 h ago"``, ``"5 d ago"``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60} min ago"
    if s < 86400:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


def routes_down(routes: Mapping[str, RouteConfig], states: Mapping[str, HostState]) -> list[str]:
    """The routes that have no healthy host, in config order."""
    return [
        name
        for name, route in routes.items()
        if not any(h in states and states[h].healthy for h in route.hosts)
    ]


class ProxyView(Protocol):
    """What the pages read from the proxy: requests in flight by host, round-robin turns."""

    @property
    def in_flight(self) -> Mapping[str, int]: ...

    @property
    def turns(self) -> Mapping[str, int]: ...


class StatusApp:
    """The ``/_crossbar/`` pages; mount :meth:`resource` on crossbar's root."""

    app = Klein()

    def __init__(
        self,
        config: Config,
        table: HealthTable,
        proxy: ProxyView,
        metrics: Metrics,
        clock: IReactorTime,
    ) -> None:
        self.config = config
        self.table = table
        self.proxy = proxy
        self.metrics = metrics
        self.clock = clock
        self.gather_metrics: Callable[[], Deferred[bytes]] | None = None
        """With several workers: every worker's metrics, labelled by worker."""

    def resource(self) -> IResource:
        return self.app.resource()

    # -- views of the state ----------------------------------------------------------------

    def host_json(self, state: HostState) -> dict[str, Any]:
        doc = state.to_json()
        doc["last_ok"] = rfc3339(state.last_ok)
        doc["in_flight"] = self.proxy.in_flight.get(state.name, 0)
        return doc

    def choices(self, states: Mapping[str, HostState]) -> dict[str, str | None]:
        """Where a request for each route's default model would go now, or ``None``:
        the proxy's first pick, including ``when_all_down: try_all``."""
        found: dict[str, str | None] = {}
        for name, route in self.config.routes.items():
            host = choose(
                route.hosts,
                route.default_model,
                states,
                policy=route.policy,
                in_flight=self.proxy.in_flight,
                turn=self.proxy.turns.get(name, 0),
            )
            if host is None and route.when_all_down == "try_all":
                host = route.hosts[0]
            found[name] = host
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
    def page(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        _no_store(request)
        states = self.table.snapshot()
        page = render_page(
            self.config, states, self.proxy.in_flight, self.choices(states), self.clock.seconds()
        )
        return page.encode("utf-8")

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


# -- the HTML page ---------------------------------------------------------------------------

_STYLE = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1rem;color:#222}
h1{font-size:1.3rem;margin:0}
h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
p{margin:.3rem 0}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;vertical-align:top;padding:.35rem .5rem;border-bottom:1px solid #ddd}
th{background:#f3f3f3;font-weight:600}
.mark{display:inline-block;padding:0 .5rem;border-radius:.7rem;font-weight:600;white-space:nowrap}
.up{background:#d7f2dc;color:#145a24}
.down{background:#fbe0df;color:#a11a1a}
.unknown{background:#e8e8e8;color:#444}
.err{color:#a11a1a;overflow-wrap:anywhere}
.muted{color:#777}
.num{text-align:right}
@media (max-width:720px){
thead{display:none}
table,tbody,tr,td{display:block;width:auto}
tr{border:1px solid #ddd;border-radius:.4rem;margin:0 0 .75rem;padding:.3rem 0}
td{border:0;padding:.15rem .6rem}
td.num{text-align:left}
td::before{content:attr(data-label) ": ";font-weight:600;color:#555}
}
"""

_MARK = {"up": "\u25cf up", "down": "\u25bc down", "unknown": "? unknown"}


def _mark(state: str) -> str:
    return f'<span class="mark {state}">{_MARK[state]}</span>'


def _cell(label: str, content: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'<td data-label="{label}"{attr}>{content}</td>'


def _row(*cells: str) -> str:
    return "<tr>" + "".join(cells) + "</tr>"


def _names(names: Sequence[str]) -> str:
    if not names:
        return '<span class="muted">none</span>'
    return ", ".join(escape(n) for n in names)


def _host_row(state: HostState, in_flight: int, now: float) -> str:
    last_ok = (
        '<span class="muted">never</span>'
        if state.last_ok is None
        else f'<span title="{escape(rfc3339(state.last_ok) or "")}">'
        f"{ago(now - state.last_ok)}</span>"
    )
    error = f'<span class="err">{escape(state.last_err)}</span>' if state.last_err else ""
    name = f'<b>{escape(state.name)}</b><br><small class="muted">{escape(state.url)}</small>'
    return _row(
        _cell("Host", name),
        _cell("State", _mark(state.state)),
        _cell("Last good poll", last_ok),
        _cell("Last error", error),
        _cell("Loaded", _names(state.loaded)),
        _cell("Known", _names(state.known)),
        _cell("Good polls in a row", str(state.consecutive), "num"),
        _cell("In flight", str(in_flight), "num"),
    )


def _route_row(route: RouteConfig, states: Mapping[str, HostState], choice: str | None) -> str:
    members = " ".join(
        f'<span class="mark {states[h].state if h in states else "unknown"}">{escape(h)}</span>'
        for h in route.hosts
    )
    model = (
        escape(route.default_model)
        if route.default_model is not None
        else '<span class="muted">none (first healthy host)</span>'
    )
    if choice is None:
        goes_to = '<span class="err">no healthy host</span>'
    elif choice in states and states[choice].healthy:
        goes_to = f"<b>{escape(choice)}</b>"
    else:
        goes_to = f'<b>{escape(choice)}</b> <span class="err">(none healthy; tried anyway)</span>'
    return _row(
        _cell("Route", f"<b>{escape(route.name)}</b>"),
        _cell("Hosts, in order", members),
        _cell("Default model", model),
        _cell("Goes to now", goes_to),
    )


def render_page(
    config: Config,
    states: Mapping[str, HostState],
    in_flight: Mapping[str, int],
    choices: Mapping[str, str | None],
    now: float,
) -> str:
    """The whole status page; every value from the config or a host is escaped."""
    down = routes_down(config.routes, states)
    if down:
        summary = f'<span class="mark down">not ready</span> no healthy host for: {_names(down)}'
    else:
        summary = '<span class="mark up">ready</span> every route has a healthy host'
    hosts = "\n".join(
        _host_row(state, in_flight.get(name, 0), now) for name, state in states.items()
    )
    routes = "\n".join(
        _route_row(route, states, choices.get(name)) for name, route in config.routes.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<title>crossbar status</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>crossbar</h1>
<p>{summary}</p>
<p class="muted">As of {rfc3339(now)}; this page reloads every {REFRESH_SECONDS} s.</p>
<h2>Hosts</h2>
<table id="hosts">
<thead><tr><th>Host</th><th>State</th><th>Last good poll</th><th>Last error</th><th>Loaded</th>
<th>Known</th><th class="num">Good polls in a row</th><th class="num">In flight</th></tr></thead>
<tbody>
{hosts}
</tbody>
</table>
<h2>Routes</h2>
<table id="routes">
<thead><tr><th>Route</th><th>Hosts, in order</th><th>Default model</th><th>Goes to now</th></tr>
</thead>
<tbody>
{routes}
</tbody>
</table>
<p class="muted">Also: <a href="status">status (JSON)</a> \u00b7 <a href="metrics">metrics</a>
\u00b7 <a href="readyz">readyz</a> \u00b7 <a href="livez">livez</a></p>
</body>
</html>
"""
