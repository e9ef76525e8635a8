"""The status page for people: one HTML page, rendered from the same views the JSON
status is made of.

It is a :mod:`twisted.web.template` element, so every value from the config or from a
host (names, URLs, model ids, error text) reaches the page only through the flattener,
which escapes it for where it lands, text or attribute: nothing here writes HTML by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from twisted.web.iweb import IRequest
from twisted.web.template import Element, Flattenable, Tag, XMLString, renderer, tags

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


# Inside <style> an HTML parser takes text raw, while the flattener escapes "<", ">" and
# "&" as in any text: keep those three characters out of the CSS.
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

# The page's fixed shape. Renderers (t:render) fill in rows and the summary; slots
# (t:slot) take single values. The doctype is written by whoever flattens the page
# (Klein's renderElement writes ``<!DOCTYPE html>``).
_TEMPLATE = XMLString(
    """\
<html xmlns:t="http://twistedmatrix.com/ns/twisted.web.template/0.1" lang="en" t:render="page">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1" />
<meta http-equiv="refresh"><t:attr name="content"><t:slot name="refresh" /></t:attr></meta>
<title>crossbar status</title>
<style><t:slot name="style" /></style>
</head>
<body>
<h1>crossbar</h1>
<p t:render="summary" />
<p class="muted">As of <t:slot name="now" />; this page reloads every <t:slot
name="refresh" /> s.</p>
<h2>Hosts</h2>
<table id="hosts">
<thead><tr><th>Host</th><th>State</th><th>Last good poll</th><th>Last error</th><th>Loaded</th>
<th>Known</th><th class="num">Good polls in a row</th><th class="num">In flight</th></tr></thead>
<tbody>
<tr t:render="host"><td data-label="Host"><b><t:slot name="name" /></b><br /><small
class="muted"><t:slot name="url" /></small></td><td data-label="State"><t:slot
name="state" /></td><td data-label="Last good poll"><t:slot name="last_ok" /></td><td
data-label="Last error"><t:slot name="error" /></td><td data-label="Loaded"><t:slot
name="loaded" /></td><td data-label="Known"><t:slot name="known" /></td><td
data-label="Good polls in a row" class="num"><t:slot name="consecutive" /></td><td
data-label="In flight" class="num"><t:slot name="in_flight" /></td></tr>
</tbody>
</table>
<h2>Routes</h2>
<table id="routes">
<thead><tr><th>Route</th><th>Hosts, in order</th><th>Default model</th><th>Goes to now</th></tr>
</thead>
<tbody>
<tr t:render="route"><td data-label="Route"><b><t:slot name="name" /></b></td><td
data-label="Hosts, in order"><t:slot name="members" /></td><td
data-label="Default model"><t:slot name="model" /></td><td
data-label="Goes to now"><t:slot name="goes_to" /></td></tr>
</tbody>
</table>
<p class="muted">Also: <a href="status">status (JSON)</a> \u00b7 <a href="metrics">metrics</a>
\u00b7 <a href="readyz">readyz</a> \u00b7 <a href="livez">livez</a></p>
</body>
</html>
"""
)

_MARK = {"up": "\u25cf up", "down": "\u25bc down", "unknown": "? unknown"}


def _mark(state: str) -> Tag:
    return tags.span(_MARK[state], class_=f"mark {state}")


def _muted(text: str) -> Tag:
    return tags.span(text, class_="muted")


def _names(names: Sequence[str]) -> Flattenable:
    """A comma-separated list as plain text (the flattener escapes it), or a muted none."""
    return ", ".join(names) if names else _muted("none")


def _joined(separator: str, items: Iterable[Flattenable]) -> list[Flattenable]:
    """``separator.join`` for tags: the separator is text between them."""
    out: list[Flattenable] = []
    for item in items:
        out.extend([separator, item] if out else [item])
    return out


class StatusPage(Element):
    """The whole status page, from one snapshot taken when the request came in."""

    loader = _TEMPLATE

    def __init__(
        self,
        config: Config,
        states: Mapping[str, HostState],
        in_flight: Mapping[str, int],
        choices: Mapping[str, str | None],
        now: float,
    ) -> None:
        super().__init__()
        self.config = config
        self.states = states
        self.in_flight = in_flight
        self.choices = choices
        self.now = now

    @renderer
    def page(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """What more than one part of the page, or the fixed CSS, needs."""
        return tag.fillSlots(
            refresh=str(REFRESH_SECONDS), style=_STYLE, now=rfc3339(self.now) or ""
        )

    @renderer
    def summary(self, request: IRequest | None, tag: Tag) -> Flattenable:
        down = routes_down(self.config.routes, self.states)
        if down:
            return tag(
                tags.span("not ready", class_="mark down"), " no healthy host for: ", _names(down)
            )
        return tag(tags.span("ready", class_="mark up"), " every route has a healthy host")

    @renderer
    def host(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """One row per host, one line each."""
        rows = (tag.clone().fillSlots(**self._host_cells(n, s)) for n, s in self.states.items())
        return _joined("\n", rows)

    @renderer
    def route(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """One row per route, one line each."""
        routes = self.config.routes.items()
        rows = (tag.clone().fillSlots(**self._route_cells(n, r)) for n, r in routes)
        return _joined("\n", rows)

    def _host_cells(self, name: str, state: HostState) -> dict[str, Flattenable]:
        return {
            "name": state.name,
            "url": state.url,
            "state": _mark(state.state),
            "last_ok": self._last_ok(state),
            "error": tags.span(state.last_err, class_="err") if state.last_err else "",
            "loaded": _names(state.loaded),
            "known": _names(state.known),
            "consecutive": str(state.consecutive),
            "in_flight": str(self.in_flight.get(name, 0)),
        }

    def _route_cells(self, name: str, route: RouteConfig) -> dict[str, Flattenable]:
        model = route.default_model
        return {
            "name": route.name,
            "members": _joined(" ", (self._member(host) for host in route.hosts)),
            "model": _muted("none (first healthy host)") if model is None else model,
            "goes_to": self._goes_to(self.choices.get(name)),
        }

    def _last_ok(self, state: HostState) -> Flattenable:
        if state.last_ok is None:
            return _muted("never")
        return tags.span(ago(self.now - state.last_ok), title=rfc3339(state.last_ok) or "")

    def _member(self, host: str) -> Tag:
        """One of a route's hosts, coloured by its state."""
        state = self.states[host].state if host in self.states else "unknown"
        return tags.span(host, class_=f"mark {state}")

    def _goes_to(self, choice: str | None) -> Flattenable:
        """Where the route sends a request now; ``try_all`` may pick a host that is down."""
        if choice is None:
            return tags.span("no healthy host", class_="err")
        if choice in self.states and self.states[choice].healthy:
            return tags.b(choice)
        return [tags.b(choice), " ", tags.span("(none healthy; tried anyway)", class_="err")]
