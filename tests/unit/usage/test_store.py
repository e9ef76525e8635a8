"""crossbar.usage.store: the SQLite file, shared by workers, pruned, queried; a bad file
refused when it is opened."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from crossbar.usage.store import GROUPS, UsageStore
from crossbar.usage.sums import COUNTS

ROW = [1, 0, 100, 60, 20, 1, 0.5, 1, 40.0, 1]


def opened(path: Path | str) -> UsageStore:
    store = UsageStore(str(path))
    store.open()
    return store


def test_two_connections_add_to_the_same_rows(tmp_path: Path) -> None:
    """Two workers write the same minute of the same place: the sums add, none replaces
    the other, and each sees both."""
    a, b = opened(tmp_path / "u.sqlite3"), opened(tmp_path / "u.sqlite3")
    a.add({(60, "lab", "gpu-a", "m", "alice", ""): ROW})
    b.add({(60, "lab", "gpu-a", "m", "alice", ""): ROW, (60, "lab", "gpu-b", "m", "bob", ""): ROW})
    [alice, bob] = a.query(0, 120, ["key"])
    assert alice == {"key": "alice"} | dict(
        zip(COUNTS, [2, 0, 200, 120, 40, 2, 1.0, 2, 80.0, 2], strict=True)
    )
    assert bob["key"] == "bob"
    assert bob["requests"] == 1
    assert b.query(0, 120, ["host", "model"])[0]["host"] == "gpu-a"
    a.close()
    b.close()


def test_a_query_takes_the_minutes_that_begin_in_its_span(tmp_path: Path) -> None:
    store = opened(":memory:")
    store.add({(minute, "lab", "gpu-a", "m", "alice", ""): ROW for minute in (0, 60, 120)})
    assert [row["requests"] for row in store.query(60, 120, [])] == [1]
    assert [row["requests"] for row in store.query(0, 180, [])] == [3]
    assert store.query(180, 240, ["key"]) == []
    assert store.query(180, 240, []) == []  # no sums of nothing
    with pytest.raises(ValueError, match="cannot group by"):
        store.query(0, 60, ["key; DROP TABLE usage_minutes"])
    assert set(GROUPS) == {"route", "host", "model", "key", "asked_model"}


def test_prune_forgets_the_old_minutes(tmp_path: Path) -> None:
    store = opened(tmp_path / "u.sqlite3")
    store.add({(minute, "lab", "gpu-a", "m", "alice", ""): ROW for minute in (0, 60, 120)})
    assert store.prune(120) == 2
    assert store.query(0, 1000, [])[0]["requests"] == 1


def test_kept_across_a_restart_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "u.sqlite3"
    store = opened(path)
    store.add({(0, "lab", "gpu-a", "m", "alice", ""): ROW})
    store.close()
    assert opened(path).query(0, 60, [])[0]["prompt_tokens"] == 100
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_a_bad_file_fails_at_open(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.sqlite3"
    corrupt.write_bytes(b"not a database, but long enough to look like one" * 100)
    with pytest.raises(sqlite3.DatabaseError, match="file is not a database"):
        opened(corrupt)
    with pytest.raises(sqlite3.OperationalError, match="unable to open"):
        opened(tmp_path / "no-such-folder" / "u.sqlite3")
    with pytest.raises(sqlite3.ProgrammingError, match="not open"):
        UsageStore(str(tmp_path / "u")).add({})


def test_a_write_waits_for_another_process_lock_then_goes_through(tmp_path: Path) -> None:
    """``workers: N``: a file locked by another writer is waited for, not failed."""
    path = tmp_path / "u.sqlite3"
    store = opened(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    wrote = threading.Event()

    def write() -> None:
        store.add({(0, "lab", "gpu-a", "m", "alice", ""): ROW})
        wrote.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert not wrote.wait(0.3)  # held by the other's lock
    other.execute("COMMIT")
    assert wrote.wait(10)
    writer.join()
    assert store.query(0, 60, [])[0]["requests"] == 1


def test_a_failed_commit_leaves_no_transaction_open(tmp_path: Path) -> None:
    store = opened(":memory:")
    with pytest.raises(sqlite3.Error):
        store.add({(0, "lab", "gpu-a", "m", "alice", ""): ["x"] * 8})  # one value short
    store.add({(0, "lab", "gpu-a", "m", "alice", ""): ROW})  # the next batch goes through
    assert store.query(0, 60, [])[0]["requests"] == 1


def test_workers_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Switching a new file to WAL does not wait for another's lock: seen failing one
    start in twenty with four workers before it was tried again."""
    failed: list[Exception] = []
    for attempt in range(60):
        path = tmp_path / f"u{attempt}.sqlite3"
        together = threading.Barrier(4)

        def open_it(path: Path = path, together: threading.Barrier = together) -> None:
            together.wait()
            try:
                opened(path).close()
            except Exception as e:
                failed.append(e)

        workers = [threading.Thread(target=open_it) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert failed == []


OLD_SCHEMA = """
CREATE TABLE usage_minutes (
    minute INTEGER NOT NULL, route TEXT NOT NULL, host TEXT NOT NULL, model TEXT NOT NULL,
    key TEXT NOT NULL, requests INTEGER NOT NULL, errors INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, first_token_n INTEGER NOT NULL,
    first_token_seconds REAL NOT NULL, speed_n INTEGER NOT NULL, speed_sum REAL NOT NULL,
    PRIMARY KEY (minute, route, host, model, key)
) WITHOUT ROWID
"""
OLD_ROW = "(0, 'lab', 'gpu-a', 'm', 'alice', 3, 0, 30, 0, 6, 3, 1.5, 3, 90.0)"


def old_file(folder: Path, *rows: str) -> Path:
    """A usage file as a crossbar before ``loads`` and ``asked_model`` made it, with ``rows``."""
    path = folder / "u.sqlite3"
    old = sqlite3.connect(path)
    old.execute(OLD_SCHEMA)
    for row in rows:
        old.execute(f"INSERT INTO usage_minutes VALUES {row}")
    old.commit()
    old.close()
    return path


def test_a_file_made_before_loads_were_kept_opens_and_counts_them_from_then(
    tmp_path: Path,
) -> None:
    """A file an earlier crossbar made, without the ``loads`` column: it opens, its rows
    read 0 loads, and loads written since add up (two workers opening it add it once)."""
    path = old_file(tmp_path, OLD_ROW)
    store, again = opened(path), opened(path)
    store.add({(0, "lab", "gpu-a", "m", "alice", ""): ROW,
               (60, "lab", "gpu-a", "m", "bob", ""): ROW})  # fmt: skip
    reader = UsageStore(str(path), reading=True)
    reader.open()
    [alice, bob] = reader.query(0, 120, ["key"])
    assert (alice["requests"], alice["loads"]) == (4, 1)
    assert (bob["requests"], bob["loads"]) == (1, 1)
    assert reader.query(0, 60, [])[0]["prompt_tokens"] == 130
    for each in (store, again, reader):
        each.close()


def test_requests_not_served_are_kept_by_why_across_a_restart_and_an_old_file_gains_them(
    tmp_path: Path,
) -> None:
    """A file an earlier crossbar made has no table of requests not served: it gets one
    when it opens; what is written there is kept across a restart, and pruned."""
    path = old_file(tmp_path)
    store = opened(path)
    refused = {(0, "lab", "alice", "path"): 2, (60, "lab", "alice", "limit"): 1}
    store.add({}, refused)
    store.add({}, {(60, "lab", "alice", "path"): 1})
    store.close()
    again = opened(path)
    assert again.refused(0, 120) == [
        {"route": "lab", "key": "alice", "why": "limit", "requests": 1},
        {"route": "lab", "key": "alice", "why": "path", "requests": 3},
    ]
    assert again.query(0, 120, []) == []  # never a served request
    again.prune(60)
    assert [row["requests"] for row in again.refused(0, 120)] == [1, 1]
    again.close()


def test_a_file_made_before_names_sent_were_kept_opens_and_keeps_each_name_apart(
    tmp_path: Path,
) -> None:
    """A file an earlier crossbar made, without ``asked_model`` (and ``loads``): it opens
    (two workers change it once), its rows read as sent by the model's own name, and rows
    written since keep each name sent apart while the model's sums take them all."""
    path = old_file(tmp_path, OLD_ROW)
    store, again = opened(path), opened(path)
    store.add({(0, "lab", "gpu-a", "m", "alice", "claude-sonnet-4-5"): ROW})
    again.add({(0, "lab", "gpu-a", "m", "alice", "claude-sonnet-4-5"): ROW,
               (0, "lab", "gpu-a", "m", "alice", ""): ROW})  # fmt: skip
    [model] = store.query(0, 60, ["model"])
    assert (model["model"], model["requests"], model["prompt_tokens"]) == ("m", 6, 330)
    assert model["loads"] == 3
    sent = {row["asked_model"]: row["requests"] for row in store.query(0, 60, ["asked_model"])}
    assert sent == {"": 4, "claude-sonnet-4-5": 2}
    tables = sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='table'")
    assert sorted(name for (name,) in tables) == ["refused_minutes", "usage_minutes"]
    store.close()
    again.close()
