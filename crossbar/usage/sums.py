"""Per-minute sums of finished requests, folded in memory until they are written.

A row is one minute of one (route, host, model, key, name sent): requests, errors, tokens,
model loads the requests made hosts begin, and the
sums and counts the mean time to first token and mean generation speed are made of (a
mean cannot be added up across batches, workers or minutes; its sum and count can).
Pure values, no I/O: :mod:`crossbar.usage.ledger` writes them, :mod:`.store` keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from crossbar.stats.accessline import ALIAS_CHARS, printable
from crossbar.stats.record import NO_MODEL, OTHER_MODEL, RequestRecord

Place = tuple[int, str, str, str, str, str]
"""``(minute, route, host, model, key, asked_model)``: the minute as epoch seconds at its
start; ``-`` for a request that reached no host, ``(none)`` for one that asked for no model
(``(other)`` for one no host lists: names no host can list); ``asked_model``, the name the
client sent when a route's alias mapped it to ``model``, else :data:`NOT_ALIASED`."""
NOT_ALIASED = ""
"""The ``asked_model`` of a request whose model no alias mapped: it named the model itself."""
ASKED_NAMES = 16
"""Different names sent that a minute of one route and model keeps apart; past them, the
names a client chooses (``claude-*`` matches any) are summed as ``(other)``."""

COUNTS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "first_token_n",
    "first_token_seconds",
    "speed_n",
    "speed_sum",
    "loads",
)
"""A row's sums, in order: what the store's columns are named and the order of
:data:`Sums`. ``errors``: answers of status 500 or more; ``loads``: loads of the model the
requests made hosts begin (:attr:`RequestRecord.loads`)."""
Sums = list[float]


def _known(model: str) -> bool:
    return True


REFUSED_AS = {400: "bad request", 401: "key", 403: "key", 404: "path", 405: "method",
              408: "too slow", 413: "too large", 429: "limit", 431: "too large",
              503: "no host"}  # fmt: skip
"""Why crossbar answered a request itself, in one word by its status: a bounded label
(the words the client got may name hosts and their errors)."""


def refused_as(record: RequestRecord) -> str | None:
    """Why ``record`` was not served: crossbar answered it itself (``path``, ``limit``...),
    or its host refused it (``host 404``: a 4xx, such as a model it does not have); ``None``
    for a request a host served (well or not: a 5xx is an error of a served request)."""
    status = record.status
    if record.refused:
        return REFUSED_AS.get(status, "other")
    if record.host is not None:
        return f"host {status}" if 400 <= status < 500 and status != 499 else None
    if status < 400 or status == 499:
        return None
    return record.shed or REFUSED_AS.get(status, "other")


Refusal = tuple[int, str, str, str]
"""``(minute, route, key, why)``: a minute of requests not served, by :func:`refused_as`."""


class MinuteSums:
    """Rows by :data:`Place`, each added to as requests end.

    ``knows`` says whether a host lists a model: one none lists is summed as ``(other)``,
    as the metrics and the JSON log name it, so that a client cannot fill the store with
    names of its choosing; so is a name sent that an alias mapped past the first
    :data:`ASKED_NAMES` of a minute, route and model. Past ``most`` rows, a request of a new
    row is left out and counted in :attr:`dropped`: rows pile up only while they cannot be
    written.
    """

    def __init__(self, knows: Callable[[str], bool] = _known, most: int = 20_000) -> None:
        self.rows: dict[Place, Sums] = {}
        self.most = most
        self.dropped = 0
        """Requests left out since the rows were last full: what a stuck store cost."""
        self._knows = knows
        self.refused: dict[Refusal, int] = {}
        """Requests not served, by minute, route, key and why (:func:`refused_as`): never
        counted as a key's requests or tokens."""
        self._asked_minute = -1
        self._asked: dict[tuple[str, str], set[str]] = {}
        """The names sent this minute (:attr:`_asked_minute`), by route and model."""

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, record: RequestRecord, now: float) -> None:
        """One request that ended at ``now``. Without keys, usage goes to the route. One
        crossbar answered itself (an unknown route or path, no healthy host, a limit), or
        its host refused (a 4xx), is counted apart in :attr:`refused`, by why; one refused
        at the door (401, 413...) used nothing and is not counted at all: a stranger's
        requests do not fill memory. One that generates nothing (``GET /v1/models``,
        tokenize: :attr:`RequestRecord.generates`) is no served request either."""
        why = refused_as(record)
        if why is not None:
            if not record.refused:  # one refused at the door: a stranger's, not summed
                minute = int(now // 60) * 60
                place_of = (minute, record.route, record.key or record.route, why)
                if place_of in self.refused or len(self.refused) < self.most:
                    self.refused[place_of] = self.refused.get(place_of, 0) + 1
            return
        if not record.generates:
            return
        model = record.model
        if model is None:
            model = NO_MODEL
        elif not self._knows(model):
            model = OTHER_MODEL
        minute = int(now // 60) * 60
        asked = NOT_ALIASED
        if record.asked_model is not None:
            asked = self._asked_name(minute, record.route, model, record.asked_model)
        place = (minute, record.route, record.host or "-", model, record.key or record.route, asked)
        sums = self.rows.get(place)
        if sums is None:
            if len(self.rows) >= self.most:
                self.dropped += 1
                return
            sums = self.rows[place] = [0] * len(COUNTS)
        sums[0] += 1
        if record.status >= 500:
            sums[1] += 1
        sums[2] += record.prompt_tokens or 0
        sums[3] += record.cached_tokens or 0
        sums[4] += record.generated_tokens or 0
        first, speed = record.first_token, record.tokens_per_second
        if first is not None and 0 <= first < math.inf:
            sums[5] += 1
            sums[6] += first
        if speed is not None and 0 <= speed < math.inf:
            sums[7] += 1
            sums[8] += speed
        sums[9] += record.loads

    def _asked_name(self, minute: int, route: str, model: str, sent: str) -> str:
        """The name sent as kept: printable, at most :data:`ALIAS_CHARS` characters, and
        ``(other)`` past :data:`ASKED_NAMES` of this minute, route and model."""
        if minute != self._asked_minute:
            self._asked_minute, self._asked = minute, {}
        name = printable(sent.encode(), ALIAS_CHARS)
        names = self._asked.setdefault((route, model), set())
        if name not in names:
            if len(names) >= ASKED_NAMES:
                return OTHER_MODEL
            names.add(name)
        return name

    def take(self) -> dict[Place, Sums]:
        """Every row, to be written; none are left."""
        rows, self.rows = self.rows, {}
        return rows

    def take_refused(self) -> dict[Refusal, int]:
        """Every count of requests not served, to be written; none are left."""
        refused, self.refused = self.refused, {}
        return refused

    def put_back(self, rows: Mapping[Place, Sums], refused: Mapping[Refusal, int] = {}) -> None:
        """Rows that could not be written, added to those since, as far as room allows;
        the requests of rows left out are counted in :attr:`dropped`."""
        for place_of, count in refused.items():
            if place_of in self.refused or len(self.refused) < self.most:
                self.refused[place_of] = self.refused.get(place_of, 0) + count
        mine = self.rows
        for place, sums in rows.items():
            have = mine.get(place)
            if have is not None:
                for i, value in enumerate(sums):
                    have[i] += value
            elif len(mine) < self.most:
                mine[place] = list(sums)
            else:
                self.dropped += int(sums[0])
