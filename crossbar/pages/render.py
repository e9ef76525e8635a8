"""The status page for people: one HTML page, rendered from the same views the JSON
status is made of.

It is a :mod:`twisted.web.template` element, so every value from the config, from a
host or from the request (names, URLs, model ids, error text, the Host header) reaches
the page only through the flattener, which escapes it for where it lands, text or
attribute: nothing here writes HTML by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from twisted.web.iweb import IRequest
from twisted.web.template import Element, Flattenable, Tag, XMLString, renderer, tags

from crossbar.config import DEMO_SOURCE, Config, Reloads, RouteConfig
from crossbar.pages.charts import CHART_STYLE
from crossbar.pages.flowshares import FlowShares, flows_section
from crossbar.pages.hosttokens import HostTokens
from crossbar.pages.models import instances_words, load_words, model_notes
from crossbar.pages.peers import WorkerInfo
from crossbar.pages.prefixtable import NO_PREFIXES, prefixes_section
from crossbar.pages.style import STYLE
from crossbar.pages.times import ago, duration, rfc3339, short_seconds
from crossbar.pages.usagetables import UsageView, usage_tables
from crossbar.polling import HostState
from crossbar.routing import LoadCost, Occupancy, routes_down
from crossbar.stats import WINDOW_SECONDS, HostHour, HostRecent, RouteAffinity

REFRESH_SECONDS = 5
PAGE_MODELS = 20
"""Model ids shown per cell; past them, a count (a host may list a thousand)."""


def model_on(state: HostState | None, model: str | None) -> str | None:
    """How the host a route chose holds the route's default model: ``"loaded"``,
    ``"known"`` (it would load it first), ``"not listed"``, or ``None`` (no model, no host)."""
    if state is None or model is None:
        return None
    if model in state.loaded:
        return "loaded"
    return "known" if model in state.known else "not listed"


@attrs.frozen
class About:
    """Which crossbar this is: what the page's header says."""

    version: str
    started: float
    source: str
    """The config file, or ``(demo)``."""
    worker: WorkerInfo | None = None
    """With ``workers: N``, the worker that answered: its table and counts are its own."""


# The page's fixed shape. Renderers (t:render) fill in rows, the header and the summary;
# slots (t:slot) take single values. The doctype is written by whoever flattens the page
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
<h1>crossbar <small class="muted"><t:slot name="version" /></small></h1>
<p id="about" class="muted" t:render="intro" />
<p id="demo" class="banner" t:render="demo">Demo: the fleet is simulated (<code>--demo</code>),
no GPU; its answers are made up.</p>
<p id="summary" t:render="summary" />
<p class="muted">As of <t:slot name="now" />; this page reloads every <t:slot
name="refresh" /> s.</p>
<h2>Hosts</h2>
<p class="muted">Requests, errors (answers of status 500 or more) and the median time to
first byte are over the last <t:slot name="window" /> min.</p>
<table id="hosts">
<thead><tr><th>Host</th><th>State</th><th>Last good poll</th><th>Last error</th><th>Loaded</th>
<th>Known</th><th class="num">Good polls in a row</th><th class="num">In flight</th>
<th class="num">Requests</th><th class="num">Errors</th><th class="num">First byte
p50</th></tr></thead>
<tbody>
<tr t:render="host"><td data-label="Host"><b><t:slot name="name" /></b><br /><small
class="muted"><t:slot name="url" /></small></td><td data-label="State"><t:slot
name="state" /></td><td data-label="Last good poll"><t:slot name="last_ok" /></td><td
data-label="Last error"><t:slot name="error" /></td><td data-label="Loaded"><t:slot
name="loaded" /></td><td data-label="Known"><t:slot name="known" /></td><td
data-label="Good polls in a row" class="num"><t:slot name="consecutive" /></td><td
data-label="In flight" class="num"><t:slot name="in_flight" /></td><td
data-label="Requests, 5 min" class="num"><t:slot name="requests" /></td><td
data-label="Errors, 5 min" class="num"><t:slot name="errors" /></td><td
data-label="First byte p50, 5 min" class="num"><t:slot name="ttfb" /></td></tr>
</tbody>
</table>
<t:transparent t:render="usage" />
<h2>Routes</h2>
<table id="routes">
<thead><tr><th>Route and its base URL for agents</th><th>Policy</th><th>Hosts, in order</th>
<th>Default model</th><th>Goes to now</th></tr></thead>
<tbody>
<tr t:render="route"><td data-label="Route"><b><t:slot name="name" /></b><br /><code><t:slot
name="base_url" /></code></td><td data-label="Policy"><t:slot name="policy" /></td><td
data-label="Hosts, in order"><t:slot name="members" /></td><td
data-label="Default model"><t:slot name="model" /></td><td
data-label="Goes to now"><t:slot name="goes_to" /></td></tr>
</tbody>
</table>
<t:transparent t:render="usage_tables" />
<div t:render="flows" />
<div t:render="prefixes" />
<p class="muted">Also: <a href="status">status (JSON)</a> \u00b7 <a href="metrics">metrics</a>
\u00b7 <a href="usage">usage (JSON)</a> \u00b7 <a href="readyz">readyz</a> \u00b7 <a
href="livez">livez</a></p>
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


def _models(
    names: Sequence[str], note: str = "", notes: Mapping[str, str] | None = None
) -> Flattenable:
    """Model ids, each kept on one line: a browser would break ``qwen3-coder-30b`` at a
    hyphen, and a reader would see two models. The first :data:`PAGE_MODELS` only, then
    how many more; ``note`` says what of the host's list was left out (or the room the
    loaded ones take), ``notes`` something of each (its slots, its requests in flight)."""
    shown: Flattenable = _muted("none")
    notes = notes or {}
    if names:
        spans = (
            tags.span(name, _muted(f" ({notes[name]})") if name in notes else "", class_="model")
            for name in names[:PAGE_MODELS]
        )
        shown = _joined(", ", spans)
        if len(names) > PAGE_MODELS:
            more = f"and {len(names) - PAGE_MODELS:,} more ({len(names):,} in all)"
            shown = [shown, ", ", _muted(more)]
    return [shown, tags.br(), tags.small(note, class_="err")] if note else shown


def _joined(separator: str, items: Iterable[Flattenable]) -> list[Flattenable]:
    """``separator.join`` for tags: the separator is text between them."""
    out: list[Flattenable] = []
    for item in items:
        out.extend([separator, item] if out else [item])
    return out


def _at_home(turns: RouteAffinity) -> Tag:
    """How well a ``cache_affinity`` route keeps conversations on their home host."""
    share = turns.home_share
    if share is None:
        return _muted(f"no conversation in {WINDOW_SECONDS // 60} min")
    text = f"{share:.0%} of {turns.turns} turns at their home host, {WINDOW_SECONDS // 60} min"
    hint = f"{turns.home} at home, {turns.moved} moved (load bound, slots, a failed host)"
    return tags.small(text, title=hint, class_="affinity")


def _when(epoch: float, text: str) -> Tag:
    """A time in words, with the exact time on hover."""
    return tags.span(text, title=rfc3339(epoch) or "")


@attrs.define(slots=False, eq=False)
class StatusPage(Element):
    """The whole status page, from one snapshot taken when the request came in;
    ``base`` is crossbar's own URL as the reader reached it, e.g. ``http://gpu-box:7777``."""

    loader = _TEMPLATE

    config: Config
    states: Mapping[str, HostState]
    in_flight: Mapping[str, int]
    choices: Mapping[str, str | None]
    now: float
    about: About = attrs.field(kw_only=True)
    recent: Mapping[str, HostRecent] = attrs.field(kw_only=True)
    base: str = attrs.field(kw_only=True)
    affinity: Mapping[str, RouteAffinity] = attrs.field(kw_only=True, factory=dict)
    """Each ``cache_affinity`` route's turns over the recent window."""
    reloads: Reloads | None = attrs.field(kw_only=True, default=None)
    waiting: Mapping[str, Mapping[str, Any]] = attrs.field(kw_only=True, factory=dict)
    """Each route with requests waiting in crossbar for a slot: how many, the oldest wait."""
    hourly: Mapping[str, HostHour] = attrs.field(kw_only=True, factory=dict)
    """Each host's last hour, a minute at a time, for the charts."""
    usage_totals: UsageView = attrs.field(kw_only=True, default="usage_db is off")
    """Each key's and route's tokens of today and this week (:mod:`.usagepanel`)."""
    shares: FlowShares = attrs.field(kw_only=True, factory=lambda: FlowShares.of({}))
    """Each flow's share of the slots over the last five minutes."""
    loads: Mapping[str, LoadCost] = attrs.field(kw_only=True, factory=dict)
    """Each route whose default model is loaded on no healthy host: where it would load."""
    model_usage: Occupancy = attrs.field(kw_only=True, factory=Occupancy)
    shared_prefixes: Mapping[str, Any] = attrs.field(kw_only=True, default=NO_PREFIXES)
    """Shared prompt prefixes seen lately and saved on hosts (:mod:`crossbar.prefixes`)."""
    """Requests in flight and last use per host and model (a router's loaded models)."""

    @renderer
    def page(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """What more than one part of the page, or the fixed CSS, needs."""
        return tag.fillSlots(
            refresh=str(REFRESH_SECONDS),
            style=STYLE + CHART_STYLE,
            now=rfc3339(self.now) or "",
            version=self.about.version,
            window=str(WINDOW_SECONDS // 60),
        )

    @renderer
    def intro(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """Up how long, from which config, and which worker answered."""
        about = self.about
        up = _when(about.started, duration(self.now - about.started))
        config: list[Flattenable] = ["config ", tags.code(about.source)]
        parts: list[Flattenable] = [["up ", up], config]
        reloads = self.reloads
        if reloads is not None and reloads.ok:
            loaded = _when(reloads.loaded_at, duration(self.now - reloads.loaded_at) + " ago")
            config += [", reloaded ", loaded]
        if reloads is not None and reloads.last_refused is not None:
            when, reason = reloads.last_refused
            parts.append(
                tags.span(
                    tags.span("reload refused", class_="mark down"),
                    " ",
                    _when(when, duration(self.now - when) + " ago"),
                    ": ",
                    reason,
                )
            )
        worker = about.worker
        if worker is not None and worker.count > 1:
            note = "workers are numbered from 0; each has its own table and counts"
            parts.append(tags.span(f"worker {worker.index} of {worker.count}", title=note))
        return tag(_joined(" \u00b7 ", parts))

    @renderer
    def demo(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """The banner, on a demo only: nobody should take its answers for a model's."""
        return tag if self.config.source == DEMO_SOURCE else ""

    @renderer
    def usage_tables(self, request: IRequest | None, tag: Tag) -> Flattenable:
        return usage_tables(self.usage_totals)

    @renderer
    def summary(self, request: IRequest | None, tag: Tag) -> Flattenable:
        down = routes_down(self.config.routes, self.states)
        if down:
            return tag(
                tags.span("not ready", class_="mark down"), " no healthy host for: ", _names(down)
            )
        return tag(tags.span("ready", class_="mark up"), " every route has a healthy host")

    @renderer
    def flows(self, request: IRequest | None, tag: Tag) -> Flattenable:
        return flows_section(self.shares, tag)

    @renderer
    def prefixes(self, request: IRequest | None, tag: Tag) -> Flattenable:
        return prefixes_section(self.shared_prefixes["shared"], self.shared_prefixes["hosts"], tag)

    @renderer
    def host(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """One row per host, one line each."""
        rows = (tag.clone().fillSlots(**self._host_cells(n, s)) for n, s in self.states.items())
        return _joined("\n", rows)

    @renderer
    def usage(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """Tokens and speed per host, then the last hour's charts (:mod:`.hostusage`)."""
        return HostTokens(list(self.states), self.recent, self.hourly)

    @renderer
    def route(self, request: IRequest | None, tag: Tag) -> Flattenable:
        """One row per route, one line each."""
        routes = self.config.routes.items()
        rows = (tag.clone().fillSlots(**self._route_cells(n, r)) for n, r in routes)
        return _joined("\n", rows)

    def _host_cells(self, name: str, state: HostState) -> dict[str, Flattenable]:
        recent = self.recent.get(name, HostRecent())
        p50 = recent.ttfb_p50
        leaving = name not in self.config.hosts  # reloaded away, finishing its requests
        return {
            "name": [state.name, " ", _muted("(left the config)")] if leaving else state.name,
            "url": state.url,
            "state": _mark(state.state),
            "last_ok": self._last_ok(state),
            "error": self._errors(state),
            "loaded": self._loaded(state),
            "known": _models(state.known, state.models_note),
            "consecutive": str(state.consecutive),
            "in_flight": str(self.in_flight.get(name, 0)),
            "requests": str(recent.requests),
            "errors": tags.span(str(recent.errors), class_="err") if recent.errors else "0",
            "ttfb": _muted("none") if p50 is None else short_seconds(p50),
        }

    def _errors(self, state: HostState) -> Flattenable:
        """The host's last error, and the models it failed to load lately."""
        failed = state.load_failures.said(self.now) if state.load_failures.total else ""
        text = "; ".join(t for t in (state.last_err, failed) if t)
        return tags.span(text, class_="err") if text else ""

    def _route_cells(self, name: str, route: RouteConfig) -> dict[str, Flattenable]:
        model = route.default_model
        policy = route.policy + ("; try all when down" if route.when_all_down == "try_all" else "")
        turns = self.affinity.get(name)
        shown: list[Flattenable] = [policy]
        if turns is not None:
            shown += [tags.br(), _at_home(turns)]
        waits = self.waiting.get(name)
        if waits:
            oldest = short_seconds(waits["oldest_seconds"])
            line = f"{waits['requests']} waiting for a slot, the longest {oldest}"
            shown += [tags.br(), tags.span(line, class_="err")]
        return {
            "name": route.name,
            "base_url": f"{self.base}/{route.name}/v1",
            "policy": shown if len(shown) > 1 else policy,
            "members": _joined(" ", (self._member(host) for host in route.hosts)),
            "model": _muted("none (first healthy host)") if model is None else model,
            "goes_to": self._goes_to(self.choices.get(name), model, self.loads.get(name)),
        }

    def _last_ok(self, state: HostState) -> Flattenable:
        if state.last_ok is None:
            return _muted("never")
        return _when(state.last_ok, ago(self.now - state.last_ok))

    def _member(self, host: str) -> Tag:
        """One of a route's hosts, coloured by its state."""
        state = self.states[host].state if host in self.states else "unknown"
        return tags.span(host, class_=f"mark {state}")

    def _loaded(self, state: HostState) -> Flattenable:
        """The loaded models, each with its slots and (on a router) its requests in flight
        or idle time, then the room they take: "2 of 4 instances"."""
        shown = _models(state.loaded, notes=model_notes(state, self.model_usage, self.now))
        room = instances_words(state, self.model_usage)
        return shown if room is None else [shown, tags.br(), tags.small(room, class_="muted")]

    def _goes_to(self, choice: str | None, model: str | None, load: LoadCost | None) -> Flattenable:
        """Where the route sends a request for its default model now, and whether that
        host has the model loaded; ``try_all`` may pick a host that is down."""
        if choice is None:
            return tags.span("no healthy host", class_="err")
        state = self.states.get(choice)
        if state is None or not state.healthy:
            return [tags.b(choice), " ", tags.span("(none healthy; tried anyway)", class_="err")]
        held = model_on(state, model)
        if held == "loaded":
            return [tags.b(choice), " ", _muted(f"({model} loaded)")]
        if held == "known":
            said = f"(knows {model}; would load it)" if load is None else load_words(load, model)
            return [tags.b(choice), " ", _muted(said)]
        if held == "not listed":
            return [
                tags.b(choice),
                " ",
                tags.span(f"(no healthy host lists {model})", class_="err"),
            ]
        return tags.b(choice)
