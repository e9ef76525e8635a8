"""The status page's part on shared prompt prefixes: which prefixes new conversations
began with lately (per route and model), and what each host holds saved
(:mod:`crossbar.prefixes`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.web.template import Tag, tags

NO_PREFIXES: dict[str, list[Any]] = {"shared": [], "hosts": []}


def prefixes_section(
    shared: Sequence[dict[str, Any]], hosts: Sequence[dict[str, Any]], tag: Tag
) -> Tag:
    """A table of the prefixes seen lately, and a line per host on its saved ones."""
    heading = tags.h2("Shared prefixes")
    if not shared:
        words = "No new conversation of a cache_affinity route began lately."
        return tag(heading, tags.p(words, class_="muted"))
    head = tags.tr(
        tags.th("Route"), tags.th("Model"), tags.th("Prefix"),
        tags.th("New conversations", class_="num"), tags.th("Last seen", class_="num"),
    )  # fmt: skip
    rows = [
        tags.tr(
            tags.td(row["route"], **{"data-label": "Route"}),
            tags.td(row["model"], **{"data-label": "Model"}),
            tags.td(tags.code(row["prefix"]), **{"data-label": "Prefix"}),
            tags.td(str(row["new_conversations"]), class_="num", **{"data-label": "New"}),
            tags.td(f"{row['last_seen_ago']:g} s ago", class_="num", **{"data-label": "Last"}),
        )
        for row in shared
    ]
    what = (
        "The system prompt and tools new conversations began with in the last hour; one"
        " seen twice is saved once on each host that allows slot saves (--slot-save-path)."
    )
    return tag(
        heading,
        tags.p(what, class_="muted"),
        tags.table(tags.thead(head), tags.tbody(rows), id="prefixes"),
        tags.ul([tags.li(_host_line(host)) for host in hosts]),
    )


def _host_line(host: dict[str, Any]) -> str:
    allows = host["allows_saves"]
    if allows is False:
        return f"{host['host']}: keeps no saved slots (started without --slot-save-path)"
    saved = host["saved"]
    if not saved:
        return f"{host['host']}: nothing saved yet"
    held = ", ".join(f"{s['prefix']} ({s['model']}, {s['tokens']} tokens)" for s in saved)
    return f"{host['host']}: {held}; restored {host['restores']} times"
