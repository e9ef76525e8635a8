"""``GET /_crossbar/usage``: the usage kept in the store, summed over a span of time by
key, model, host or route, as JSON or CSV.

Parameters (each at most once; anything else is a 400 naming it):

``since``, ``until``
    RFC 3339 (``2026-12-01T09:00:00Z``, ``2026-12-01T10:00:00+01:00``, or a date,
    ``2026-12-01``, its midnight UTC; no offset: UTC) or epoch seconds (``1764579600``).
    The minutes that *begin* in ``[since, until)`` are summed. Default: the 24 h up to now.
``by``
    ``key`` (the default), ``model``, ``host``, ``route``, ``asked_model``, or several
    joined by commas (``route,key``). ``asked_model`` is the name a client sent that a
    route's alias mapped to the model served (``null``, or an empty cell: the model's own
    name); grouped by ``model`` without it, each group says in ``asked_as`` which names
    were sent for it and how many requests each.
``format``
    ``json`` (the default) or ``csv``.

The query runs on a connection and a thread of its own, never holding the writer's
batches; at most two run at once (a third is a 503 in words). One that has not answered
in :data:`QUERY_SECONDS` is a 503, never a stalled page, and is stopped where it is.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest

from crossbar.pages.times import rfc3339
from crossbar.usage import COUNTS, GROUPS, QueriesBusy, UsageLedger

DEFAULT_SPAN = 86400.0
QUERY_SECONDS = 10.0
LATEST = 253402300799.0
"""The last second of the year 9999: past it a time is no time."""
_PARAMETERS = ("since", "until", "by", "format")
FIGURES = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cache_hit_rate",
    "ttft_ms_mean",
    "tok_s_mean",
    "loads",
)
"""The columns of each group, after its names: ``cache_hit_rate`` is cached / prompt
tokens, the means are over the requests that reported them (``null`` when none did);
``loads``: loads of the model the requests made hosts begin (the last column, so that
a CSV read by position before it was added reads the same)."""


@attrs.frozen
class UsageQuery:
    since: float
    until: float
    by: tuple[str, ...] = ("key",)
    format: str = "json"


@attrs.frozen
class BadParameter(Exception):
    parameter: str
    problem: str


def parse_ask(args: Mapping[bytes, Sequence[bytes]], now: float) -> UsageQuery:
    """The query's parameters checked; a :class:`BadParameter` names what is wrong."""
    given: dict[str, str] = {}
    for raw, values in args.items():
        name = raw.decode("latin-1")
        if name not in _PARAMETERS:
            expected = ", ".join(_PARAMETERS)
            raise BadParameter(_shown(name), f"unknown parameter (expected one of: {expected})")
        if len(values) != 1:
            raise BadParameter(name, "given more than once")
        given[name] = values[0].decode("latin-1")
    until = _time("until", given["until"]) if "until" in given else now
    since = _time("since", given["since"]) if "since" in given else until - DEFAULT_SPAN
    if not since < until:
        raise BadParameter("since", "must be before until")
    by = tuple(given.get("by", "key").split(","))
    for name in by:
        if name not in GROUPS:
            raise BadParameter("by", f"{_shown(name)!r} is not one of {', '.join(GROUPS)}")
    if len(set(by)) != len(by):
        raise BadParameter("by", "names a group twice")
    form = given.get("format", "json")
    if form not in ("json", "csv"):
        raise BadParameter("format", f"must be json or csv, not {_shown(form)!r}")
    return UsageQuery(since, until, by, form)


def _time(name: str, text: str) -> float:
    """RFC 3339 or epoch seconds, as the module says."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            problem = (
                f"{_shown(text)!r} is neither RFC 3339 (2026-12-01T09:00:00Z) nor epoch seconds"
            )
            raise BadParameter(name, problem) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = moment.timestamp()
    if not 0 <= seconds <= LATEST:  # also NaN and infinities
        raise BadParameter(name, "must be from 1970 to 9999")
    return seconds


def _shown(text: str) -> str:
    """A client's text quoted back: printable, and short."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 64 else text[:61] + "..."


def asked_as(rows: Sequence[Mapping[str, Any]], by: Sequence[str]) -> list[dict[str, Any]]:
    """Rows grouped by ``by`` and ``asked_model`` (the store's, in that order) folded into
    one a group of ``by``: its sums added up, and ``asked_as``, the names sent that an alias
    mapped, each with its requests."""
    folded: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        names = tuple(row[name] for name in by)
        group = folded.get(names)
        if group is None:
            group = folded[names] = dict(zip(by, names, strict=True)) | dict.fromkeys(COUNTS, 0)
            group["asked_as"] = {}
        for name in COUNTS:
            group[name] += row[name]
        if row["asked_model"]:
            group["asked_as"][row["asked_model"]] = row["requests"]
    return list(folded.values())


def _folds(by: Sequence[str]) -> bool:
    """Whether groups ``by`` say which names were sent for their model (:func:`asked_as`)."""
    return "model" in by and "asked_model" not in by


def _named(row: Mapping[str, Any], name: str) -> Any:
    """A group's name: ``None`` for the ``asked_model`` of a model sent as itself."""
    return row[name] or None if name == "asked_model" else row[name]


def figures(sums: Mapping[str, Any]) -> dict[str, Any]:
    """The store's plain sums of a group as :data:`FIGURES` names them."""
    prompt = sums["prompt_tokens"]
    first_n, speed_n = sums["first_token_n"], sums["speed_n"]
    return {
        "requests": sums["requests"],
        "errors": sums["errors"],
        "prompt_tokens": prompt,
        "cached_tokens": sums["cached_tokens"],
        "completion_tokens": sums["completion_tokens"],
        "cache_hit_rate": round(sums["cached_tokens"] / prompt, 4) if prompt else None,
        "ttft_ms_mean": round(sums["first_token_seconds"] * 1000 / first_n) if first_n else None,
        "tok_s_mean": round(sums["speed_sum"] / speed_n, 1) if speed_n else None,
        "loads": sums["loads"],
    }


def total(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every group's plain sums added up."""
    return {name: sum(row[name] for row in rows) for name in COUNTS}


def as_json(
    ask: UsageQuery,
    rows: Sequence[Mapping[str, Any]],
    retention: float,
    refused: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The JSON answer: the groups asked for, their total, and the requests not served
    (``refused``: by route, key and why, never in a group's figures)."""
    return {
        "since": rfc3339(ask.since),
        "until": rfc3339(ask.until),
        "by": list(ask.by),
        "kept_seconds": retention,
        "groups": [
            {name: _named(row, name) for name in ask.by}
            | ({"asked_as": row["asked_as"]} if "asked_as" in row else {})
            | figures(row)
            for row in rows
        ],
        "total": figures(total(rows)),
        "refused": [dict(row) for row in refused],
    }


def as_csv(ask: UsageQuery, rows: Sequence[Mapping[str, Any]]) -> str:
    """A header, then a line a group: its names quoted, its figures as numbers, and last,
    grouped by model, ``asked_as`` (``claude-haiku-4-5: 3; claude-sonnet-4-5: 12``). A name
    a spreadsheet would take for a formula (a model's name comes from a host, a name sent
    from a client) starts with ``'``."""
    folds = _folds(ask.by)
    lines = [",".join((*ask.by, *FIGURES, *(("asked_as",) if folds else ())))]
    for row in rows:
        shown = figures(row)
        cells = [_cell(str(_named(row, name) or "")) for name in ask.by]
        cells += ("" if shown[f] is None else str(shown[f]) for f in FIGURES)
        if folds:
            sent = "; ".join(f"{name}: {n}" for name, n in row.get("asked_as", {}).items())
            cells.append(_cell(sent))
        lines.append(",".join(cells))
    return "".join(line + "\r\n" for line in lines)


_FORMULA = frozenset("=+-@\u2212")
"""What a formula starts with in a spreadsheet (the minus sign too), once a name's
full-width and small forms are folded (NFKC: U+FF1D is ``=``)."""


def _cell(text: str) -> str:
    """A name as a quoted CSV cell, with a ``'`` before it when a spreadsheet could read
    it as a formula: it starts with a tab, a CR or a LF, or its first character after any
    spaces (of any width) is one of :data:`_FORMULA`."""
    first = unicodedata.normalize("NFKC", text.lstrip()[:1])[:1]
    if text[:1] in ("\t", "\r", "\n") or first in _FORMULA:
        text = "'" + text
    return '"' + text.replace('"', '""') + '"'


async def answer(request: IRequest, ledger: UsageLedger | None, clock: IReactorTime) -> bytes:
    """The page's answer: the sums asked for, or a JSON error."""
    try:
        ask = parse_ask(request.args or {}, clock.seconds())
    except BadParameter as bad:
        return _json(request, 400, {"error": "bad parameter", "parameter": bad.parameter,
                                    "problem": bad.problem})  # fmt: skip
    if ledger is None or ledger.off is not None:
        reason = "usage_db is off" if ledger is None else ledger.off
        return _json(request, 503, {"error": "usage is not kept", "reason": reason})
    by = (*ask.by, "asked_model") if _folds(ask.by) else ask.by
    asked: Deferred[list[dict[str, Any]]] = ledger.query(ask.since, ask.until, by)
    try:
        rows = await asked.addTimeout(QUERY_SECONDS, clock)
        if by != ask.by:
            rows = asked_as(rows, ask.by)
        refused = [] if ask.format == "csv" else await ledger.refused(ask.since, ask.until)
    except TimeoutError:
        reason = f"the usage store has not answered in {QUERY_SECONDS:g} s; the query was stopped"
        return _json(request, 503, {"error": "usage store busy", "reason": reason})
    except QueriesBusy as busy:
        request.setHeader(b"retry-after", b"5")
        return _json(request, 503, {"error": "usage queries busy", "reason": str(busy)})
    except Exception as e:
        return _json(request, 503, {"error": "usage store failed", "reason": str(e)[:300]})
    if ask.format == "csv":
        request.setHeader(b"content-type", b"text/csv; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return as_csv(ask, rows).encode()
    return _json(request, 200, as_json(ask, rows, ledger.retention, refused))


def _json(request: IRequest, code: int, payload: Mapping[str, Any]) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(payload, indent=2, allow_nan=False).encode() + b"\n"
