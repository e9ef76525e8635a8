"""The status page for people: one HTML page, rendered from the same views the JSON
status is made of."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape

from crossbar.config import Config, RouteConfig
from crossbar.fleet import HostState, routes_down

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
