"""The status page's tokens and speed per host: the last five minutes in a table (prompt
tokens and the share read from the prompt cache, generated tokens and their speed, the
median time to first token), then the last hour in small charts, a minute at a time.

An element of its own, rendered inside :class:`~crossbar.pages.render.StatusPage`: host
names reach it only through the flattener, which escapes them in the SVG as in the HTML.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from twisted.web.iweb import IRequest
from twisted.web.template import Element, Flattenable, Tag, XMLString, renderer, tags

from crossbar.pages.charts import Series, count, legend, line_chart
from crossbar.pages.times import short_seconds
from crossbar.stats import MINUTES, WINDOW_SECONDS, HostHour, HostRecent

_TEMPLATE = XMLString(
    """\
<t:transparent xmlns:t="http://twistedmatrix.com/ns/twisted.web.template/0.1">
<h2>Tokens and speed</h2>
<p class="muted">Over the last <t:transparent t:render="window" /> min, as the answers
reported them: prompt tokens (cached ones included) and the share the host read from its
prompt cache; tokens generated and how fast (generated tokens over the seconds spent
generating them); and the median time to first token, from a request's arrival to its
answer's first content (not the answer's head, not a keep-alive ping).</p>
<table id="usage">
<thead><tr><th>Host</th><th class="num">Prompt tokens</th><th class="num">Prompt cache
hits</th><th class="num">Generated tokens</th><th class="num">Tokens a second</th><th
class="num">First token p50</th></tr></thead>
<tbody>
<tr t:render="row"><td data-label="Host"><b><t:slot name="name" /></b></td><td
data-label="Prompt tokens, 5 min" class="num"><t:slot name="prompt" /></td><td
data-label="Prompt cache hits, 5 min" class="num"><t:slot name="hits" /></td><td
data-label="Generated tokens, 5 min" class="num"><t:slot name="generated" /></td><td
data-label="Tokens a second, 5 min" class="num"><t:slot name="speed" /></td><td
data-label="First token p50, 5 min" class="num"><t:slot name="first_token" /></td></tr>
</tbody>
</table>
<h2>Last hour</h2>
<p class="muted">Each host a minute at a time, the oldest minute on the left and the one
under way on the right. Each chart says its figures in words on hover and to a screen
reader.</p>
<div id="hour"><t:transparent t:render="charts" /></div>
</t:transparent>
"""
)


@attrs.define(slots=False, eq=False)
class HostTokens(Element):
    """The two sections, one row and one set of charts per host, in ``hosts``' order."""

    loader = _TEMPLATE

    hosts: Sequence[str]
    recent: Mapping[str, HostRecent]
    hourly: Mapping[str, HostHour]

    @renderer
    def row(self, request: IRequest | None, tag: Tag) -> Flattenable:
        return [tag.clone().fillSlots(**_cells(n, self.recent.get(n))) for n in self.hosts]

    @renderer
    def charts(self, request: IRequest | None, tag: Tag) -> Flattenable:
        return [host_charts(name, self.hourly.get(name, HostHour())) for name in self.hosts]

    @renderer
    def window(self, request: IRequest | None, tag: Tag) -> Flattenable:
        return str(WINDOW_SECONDS // 60)


def _cells(name: str, recent: HostRecent | None) -> dict[str, Flattenable]:
    recent = recent or HostRecent()
    rate, speed, first = recent.cache_hit_rate, recent.tokens_per_second, recent.first_token_p50
    none = tags.span("none", class_="muted")
    hits: Flattenable = none
    if rate is not None:
        hits = [f"{rate:.0%} ", tags.small(f"({recent.cached_tokens:,} tokens)", class_="muted")]
    return {
        "name": name,
        "prompt": f"{recent.prompt_tokens:,}",
        "hits": hits,
        "generated": f"{recent.generated_tokens:,}",
        "speed": none if speed is None else f"{speed:.1f}" if speed < 100 else f"{speed:,.0f}",
        "first_token": none if first is None else short_seconds(first),
    }


def host_charts(name: str, hour: HostHour) -> Tag:
    """One host's four charts: requests (and errors), prompt tokens (and cached ones),
    generated tokens, and the median time to first token."""
    charts = [
        ("Requests a minute", "requests a minute", True, count,
         [Series("requests", hour.requests), Series("errors", hour.errors)]),
        ("Prompt tokens a minute", "prompt tokens a minute", True, count,
         [Series("prompt", hour.prompt_tokens), Series("cached", hour.cached_tokens)]),
        ("Generated tokens a minute", "generated tokens a minute", True, count,
         [Series("generated", hour.generated_tokens)]),
        ("First token, median a minute", "median time to first token", False,
         short_seconds, [Series("first token", hour.first_token_p50)]),
    ]  # fmt: skip
    figures = [
        tags.figure(
            tags.figcaption(tags.b(caption), tags.br(), *legend(series)),
            line_chart(f"{name}, last {MINUTES} min, {what}", series, shown, totals=totals),
        )
        for caption, what, totals, shown, series in charts
    ]
    return tags.section(tags.h3(name), tags.div(*figures, class_="hour"), class_="host-hour")


def recent_usage_json(recent: HostRecent) -> dict[str, Any]:
    """The table's figures for the status JSON's ``recent`` of a host."""
    rate, speed = recent.cache_hit_rate, recent.tokens_per_second
    return {
        "prompt_tokens": recent.prompt_tokens,
        "cached_tokens": recent.cached_tokens,
        "cache_hit_rate": None if rate is None else round(rate, 4),
        "generated_tokens": recent.generated_tokens,
        "tokens_per_second": None if speed is None else round(speed, 2),
        "first_token_p50_seconds": recent.first_token_p50,
    }
