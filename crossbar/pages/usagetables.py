"""The status page's usage tables: per key, per route and per model served (with the names
sent that a route's alias mapped to it), the tokens of today and of this week, read from
the usage store.

The page reloads every few seconds; the store is read at most every
:data:`REFRESH_SECONDS`, on its own thread, and the page shows the last answer it has
(none yet, the first time): a page load never waits for the disk. "Today" and "this
week" begin at midnight and at Monday's midnight in the machine's time zone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any

import attrs
from twisted.internet.defer import Deferred, FirstError, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.template import Flattenable, Tag, tags

from crossbar.usage import UsageLedger

REFRESH_SECONDS = 10.0
BY = ("route", "key", "model", "asked_model")
"""What the page reads the store by, once for today and once for the week: the keys',
routes' and models' tables are each folded from the same rows."""
log = Logger()


@attrs.frozen
class Tokens:
    requests: int = 0
    prompt: int = 0
    cached: int = 0
    generated: int = 0
    loads: int = 0
    """Loads of a model its requests made hosts begin."""

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            *(a + b for a, b in zip(attrs.astuple(self), attrs.astuple(other), strict=True))
        )


@attrs.frozen
class UsageTotals:
    """Each key's, each route's and each model's tokens, ``(today, this week)``."""

    keys: Mapping[str, tuple[Tokens, Tokens]]
    routes: Mapping[str, tuple[Tokens, Tokens]]
    refused: Sequence[Mapping[str, Any]] = ()
    """Today's requests not served (crossbar's refusals, a host's 4xx), by route, key and
    why: never in the keys' tokens or requests."""
    models: Mapping[str, tuple[Tokens, Tokens]] = attrs.field(factory=dict)
    """By the model served, whatever name it was sent by."""
    sent: Mapping[str, Sequence[str]] = attrs.field(factory=dict)
    """A model's names sent this week that an alias mapped to it, sorted."""


UsageView = UsageTotals | str | None
"""What the page shows: totals, why usage is not kept, or ``None``: not read yet."""


def day_and_week(now: float, zone: tzinfo | None = None) -> tuple[float, float]:
    """When today and this week (from Monday) began, in ``zone`` (the machine's: None)."""
    moment = datetime.fromtimestamp(now, zone)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    monday = midnight - timedelta(days=midnight.weekday())  # naive: read as local time
    return midnight.timestamp(), monday.timestamp()


def totals(
    today: Sequence[Mapping[str, Any]],
    week: Sequence[Mapping[str, Any]],
    refused: Sequence[Mapping[str, Any]] = (),
) -> UsageTotals:
    """The store's sums by route, key, model and name sent (:data:`BY`; a row without a
    model or name sent is left out of the models' table only), folded per key, per route
    and per model; ``refused``: today's requests not served, as the store lists them."""
    tables: tuple[dict[str, list[Tokens]], ...] = ({}, {}, {})
    sent: dict[str, set[str]] = {}
    for i, rows in enumerate((today, week)):
        for row in rows:
            tokens = Tokens(row["requests"], row["prompt_tokens"], row["cached_tokens"],
                            row["completion_tokens"], row["loads"])  # fmt: skip
            model = row.get("model")
            for table, name in zip(tables, (row["key"], row["route"], model), strict=True):
                if name is not None:
                    pair = table.setdefault(name, [Tokens(), Tokens()])
                    pair[i] += tokens
            if model is not None and row.get("asked_model"):
                sent.setdefault(model, set()).add(row["asked_model"])
    keys, routes, models = ({name: (p[0], p[1]) for name, p in sorted(table.items())}
                            for table in tables)  # fmt: skip
    return UsageTotals(
        keys, routes, tuple(refused), models, {m: sorted(names) for m, names in sent.items()}
    )


class UsageTables:
    """The last totals read from ``ledger``, read again when older than
    :data:`REFRESH_SECONDS`."""

    def __init__(
        self, ledger: UsageLedger | None, clock: IReactorTime, zone: tzinfo | None = None
    ) -> None:
        self._ledger, self._clock, self._zone = ledger, clock, zone
        self._totals: UsageTotals | None = None
        self._read_at = -REFRESH_SECONDS
        self._reading = False

    def current(self) -> UsageView:
        ledger = self._ledger
        if ledger is None:
            return "usage_db is off"
        if ledger.off is not None:
            return ledger.off
        now = self._clock.seconds()
        if not self._reading and now - self._read_at >= REFRESH_SECONDS:
            self._reading, self._read_at = True, now
            Deferred.fromCoroutine(self._read(ledger, now))
        return self._totals

    async def _read(self, ledger: UsageLedger, now: float) -> None:
        day, week = day_and_week(now, self._zone)
        by = BY
        # crossbar's own two reads, once a minute: never refused for the page's queries
        reads = [ledger.query(t, now + 60, by, capped=False) for t in (day, week)]
        reads.append(ledger.refused(day, now + 60))
        try:
            today, this_week, refused = await gatherResults(reads, consumeErrors=True)
        except FirstError as e:
            why = str(e.subFailure.value)[:300]
            log.warn("usage store: cannot read it for the status page: {why}", why=why)
        else:
            self._totals = totals(today, this_week, refused)
        finally:
            self._reading = False


def usage_tables(view: UsageView) -> Flattenable:
    """The section: two tables, or a line saying why there are none."""
    head = tags.h2("Tokens today and this week")
    if view is None:
        return [head, tags.p("Reading the usage store\u2026", class_="muted")]
    if isinstance(view, str):
        return [head, tags.p(f"Usage is not kept: {view}.", class_="muted", id="usage-off")]
    note = ("Tokens since midnight and since Monday (this machine's time), from the usage "
            "store: every worker's, up to a few seconds behind.")  # fmt: skip
    return [
        head,
        tags.p(note, class_="muted"),
        _table("usage-keys", "Key", view.keys),
        _table("usage-routes", "Route", view.routes),
        _table("usage-models", "Model", view.models, view.sent),
        _refused(view.refused),
    ]


def _refused(rows: Sequence[Mapping[str, Any]]) -> Tag:
    """Today's requests not served: by route, key and why (``path``, ``limit``, ``host
    404``...), none of them in the tables above."""
    names = ("Route", "Key", "Not served, why", "Today")
    head = tags.thead(tags.tr(*(tags.th(name) for name in names)))
    lines = [
        tags.tr(*(tags.td(str(row[field]), **{"data-label": name})
                  for field, name in zip(("route", "key", "why", "requests"), names, strict=True)))
        for row in rows
    ]  # fmt: skip
    empty = tags.tr(tags.td("none today", class_="muted", colspan="4"))
    return tags.table(head, tags.tbody(*(lines or [empty])), id="usage-refused")


def _table(
    id_: str,
    what: str,
    rows: Mapping[str, tuple[Tokens, Tokens]],
    sent: Mapping[str, Sequence[str]] | None = None,
) -> Tag:
    """One row a name; a model's names ``sent`` that an alias mapped to it follow it, as
    ``qwen3-coder-30b (as claude-haiku-4-5, claude-sonnet-4-5)``."""
    head = tags.thead(tags.tr(tags.th(what), tags.th("Today"), tags.th("This week")))
    lines = [
        tags.tr(
            tags.td(name, _sent_as((sent or {}).get(name, ())), **{"data-label": what}),
            tags.td(_tokens(today), **{"data-label": "Today"}),
            tags.td(_tokens(week), **{"data-label": "This week"}),
        )
        for name, (today, week) in rows.items()
    ]
    empty = tags.tr(tags.td("none yet", class_="muted", colspan="3"))
    body = tags.tbody(*(lines or [empty]))
    return tags.table(head, body, id=id_)


def _sent_as(names: Sequence[str]) -> Flattenable:
    return tags.span(f" (as {', '.join(names)})", class_="muted") if names else ""


def _tokens(tokens: Tokens) -> Flattenable:
    """``12,345 prompt (80% cached), 2,100 generated, 40 requests, 2 loads`` (none: unsaid)."""
    if not tokens.requests:
        return tags.span("none", class_="muted")
    cached = f" ({tokens.cached / tokens.prompt:.0%} cached)" if tokens.prompt else ""
    requests = "1 request" if tokens.requests == 1 else f"{tokens.requests:,} requests"
    loads = f", {tokens.loads:,} load{'s' if tokens.loads > 1 else ''}" if tokens.loads else ""
    return f"{tokens.prompt:,} prompt{cached}, {tokens.generated:,} generated, {requests}{loads}"
