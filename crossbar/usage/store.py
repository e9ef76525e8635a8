"""The SQLite file usage is kept in: its schema, batch writes, pruning and queries.

Blocking code, for one thread of its own (:class:`crossbar.usage.thread.OneThread`),
never the reactor's; queries on a second connection and thread (``reading``, see
:mod:`crossbar.usage.queries`). Several processes (``workers: N``) share one file: it is in WAL
mode (readers never wait for the writer), a writer that finds the file locked waits up
to :data:`BUSY_SECONDS`, and a batch *adds* to the rows it meets
(``ON CONFLICT DO UPDATE SET n = n + excluded.n``), so two workers' minutes of the same
route, host, model and key sum instead of one replacing the other.

It holds names only: of routes, hosts, models (those a host lists, else ``other``), keys
(a key's configured name, or a fingerprint that cannot be turned back into it) and the
names clients sent that a route's alias mapped to a model (``asked_model``, a few a minute:
:data:`crossbar.usage.sums.ASKED_NAMES`). Never a key, never a request or an answer.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crossbar.usage.sums import COUNTS, Place, Refusal, Sums

BUSY_SECONDS = 10.0
"""How long a write waits for another process's to end before it fails (and is tried
again with the next batch)."""
GROUPS = ("route", "host", "model", "key", "asked_model")
"""What a query may group by: the names of the columns a row is placed by, in the order of
:data:`crossbar.usage.sums.Place`."""
ADDED = ("loads",)
"""Sums a file made by an earlier crossbar may lack: added (as 0 in its rows) when it opens."""
PLACED = ("minute", *GROUPS)
"""The columns of a row's key: a :data:`crossbar.usage.sums.Place`, in order."""


def _column(name: str) -> str:
    kind = "REAL" if name.endswith(("seconds", "sum")) else "INTEGER"
    return f"{name} {kind} NOT NULL DEFAULT 0"


SCHEMA = f"""
CREATE TABLE IF NOT EXISTS usage_minutes (
    minute INTEGER NOT NULL,
    route TEXT NOT NULL,
    host TEXT NOT NULL,
    model TEXT NOT NULL,
    key TEXT NOT NULL,
    asked_model TEXT NOT NULL DEFAULT '',
    {", ".join(_column(name) for name in COUNTS)},
    PRIMARY KEY ({", ".join(PLACED)})
) WITHOUT ROWID
"""  # fmt: skip
"""``asked_model``: the name the client sent when an alias mapped it to ``model``, else
``''``: part of the key, so that each name sent keeps its sums."""
REFUSED_SCHEMA = """
CREATE TABLE IF NOT EXISTS refused_minutes (
    minute INTEGER NOT NULL,
    route TEXT NOT NULL,
    key TEXT NOT NULL,
    why TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, route, key, why)
) WITHOUT ROWID
"""
"""Requests not served (:func:`crossbar.usage.sums.refused_as`), apart from the usage:
made in a file of an earlier crossbar when it opens."""
_INSERT_REFUSED = (
    "INSERT INTO refused_minutes (minute, route, key, why, requests) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (minute, route, key, why) DO UPDATE SET requests = requests + excluded.requests"
)
PROGRESS_STEPS = 10_000
"""SQLite virtual machine steps between two checks of whether a query is to stop (a few
milliseconds of work)."""
_INSERT = (
    f"INSERT INTO usage_minutes ({', '.join((*PLACED, *COUNTS))})"
    f" VALUES ({', '.join('?' for _ in (*PLACED, *COUNTS))})"
    f" ON CONFLICT ({', '.join(PLACED)}) DO UPDATE SET "
    + ", ".join(f"{name} = {name} + excluded.{name}" for name in COUNTS)
)


def _never() -> bool:
    return False


class UsageStore:
    """One connection to one file (or ``":memory:"``), opened by :meth:`open`.
    ``reading``: a connection for queries alone, beside the writer's (it never writes,
    creates nothing, and takes no lock a write would wait for: the file is in WAL mode)."""

    def __init__(self, path: str, *, reading: bool = False) -> None:
        self.path = path
        self.reading = reading
        self._db: sqlite3.Connection | None = None

    @property
    def opened(self) -> bool:
        return self._db is not None

    def open(self) -> None:
        """Open the file, creating it and its table if need be, and check that it can
        be written now: a corrupt file, or one that cannot be written, raises
        ``sqlite3.Error`` (or ``OSError``) here rather than at the first batch.

        Workers start together: switching a new file to WAL mode does not wait for the
        lock another worker holds while it does the same, so a busy file is tried again
        (on this thread of its own) for up to :data:`BUSY_SECONDS`."""
        deadline = time.monotonic() + BUSY_SECONDS
        while True:
            try:
                self._open()
                return
            except sqlite3.OperationalError as e:
                busy = e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(0.02)

    def _open(self) -> None:
        db = sqlite3.connect(
            self.path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False
        )
        if self.reading:
            db.execute("PRAGMA query_only=ON")
            self._db = db
            return
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a power cut may lose the last batch
            db.execute(SCHEMA)
            db.execute(REFUSED_SCHEMA)
            with _transaction(db):  # takes the write lock: fails on a read-only file
                _add_missing(db)
        except BaseException:
            db.close()
            raise
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.ProgrammingError("the usage store is not open")
        return self._db

    def add(self, rows: Mapping[Place, Sums], refused: Mapping[Refusal, int] = {}) -> None:
        """Add a batch of rows, and of counts of requests not served, to those kept, in
        one transaction: all or none."""
        db = self._connection
        with _transaction(db):
            db.executemany(_INSERT, [(*place, *sums) for place, sums in rows.items()])
            db.executemany(_INSERT_REFUSED, [(*place, n) for place, n in refused.items()])

    def prune(self, before: float) -> int:
        """Forget the minutes that began before ``before``; how many rows went."""
        db = self._connection
        with _transaction(db):
            db.execute("DELETE FROM refused_minutes WHERE minute < ?", (before,))
            return db.execute("DELETE FROM usage_minutes WHERE minute < ?", (before,)).rowcount

    def refused(self, since: float, until: float) -> list[dict[str, Any]]:
        """The requests not served in the minutes that began in ``[since, until)``, one
        dict a route, key and why (``requests``), ordered by them."""
        sql = (
            "SELECT route, key, why, SUM(requests) FROM refused_minutes"
            " WHERE minute >= ? AND minute < ? GROUP BY route, key, why ORDER BY route, key, why"
        )
        rows = self._connection.execute(sql, (since, until))
        return [dict(zip(("route", "key", "why", "requests"), row, strict=True)) for row in rows]

    def query(
        self,
        since: float,
        until: float,
        by: Sequence[str],
        stop: Callable[[], bool] = _never,
    ) -> list[dict[str, Any]]:
        """The sums of the minutes that began in ``[since, until)``, one dict a group of
        ``by`` (names of :data:`GROUPS`), ordered by it; plain sums, as :data:`COUNTS`
        names them. ``stop`` is asked every :data:`PROGRESS_STEPS` steps of SQLite's work
        (on this thread): once it says yes, the query ends with ``sqlite3.OperationalError``
        (``interrupted``)."""
        if not set(by) <= set(GROUPS):
            raise ValueError(f"cannot group by {by!r}")
        columns = ", ".join(by)
        sums = ", ".join(f"SUM({name})" for name in COUNTS)
        sql = f"SELECT {columns}{', ' if by else ''}{sums} FROM usage_minutes"
        sql += " WHERE minute >= ? AND minute < ?"
        if by:
            sql += f" GROUP BY {columns} ORDER BY {columns}"
        found = []
        db = self._connection
        db.set_progress_handler(lambda: 1 if stop() else 0, PROGRESS_STEPS)
        try:
            for row in db.execute(sql, (since, until)):
                if row[len(by)] is None:  # no rows at all: SUM of nothing
                    continue
                found.append(dict(zip((*by, *COUNTS), row, strict=True)))
        finally:
            db.set_progress_handler(None, 0)
        return found


def _add_missing(db: sqlite3.Connection) -> None:
    """Bring a file made by an earlier crossbar up to :data:`SCHEMA` (under the write lock:
    two workers opening one old file change it once). A column of :data:`ADDED` is added
    (0 in its rows); a table without ``asked_model``, a column of its key, which SQLite
    cannot add to a table's key, is made again with it, its rows copied (``''``: named
    as themselves), the sums it lacks 0."""
    have = {row[1] for row in db.execute("PRAGMA table_info(usage_minutes)")}
    if "asked_model" not in have:
        kept = ", ".join(name for name in (*PLACED, *COUNTS) if name in have)
        db.execute("ALTER TABLE usage_minutes RENAME TO usage_minutes_before")
        db.execute(SCHEMA)
        db.execute(f"INSERT INTO usage_minutes ({kept}) SELECT {kept} FROM usage_minutes_before")
        db.execute("DROP TABLE usage_minutes_before")
        return
    for name in ADDED:
        if name not in have:
            db.execute(f"ALTER TABLE usage_minutes ADD COLUMN {_column(name)}")


class _transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any error: the write lock
    is taken up front, so a busy file is waited for at the start, not half-way."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        db = self._db
        if kind is None:
            try:
                db.execute("COMMIT")
                return
            except sqlite3.Error:
                if db.in_transaction:  # the next batch must find none open
                    db.execute("ROLLBACK")
                raise
        if db.in_transaction:
            db.execute("ROLLBACK")
