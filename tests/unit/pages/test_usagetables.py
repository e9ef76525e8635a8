"""crossbar.pages.usagetables: per key and per route, today's and this week's tokens on the
status page, read from the store at most every few seconds, never waited for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.web.template import flattenString

from crossbar.config import Config, HostConfig, RouteConfig
from crossbar.pages.render import About, StatusPage
from crossbar.pages.usagetables import (
    REFRESH_SECONDS,
    Tokens,
    UsageTables,
    UsageView,
    day_and_week,
    totals,
    usage_tables,
)
from crossbar.testing.logs import LogCapture
from crossbar.testing.rig import rigs
from crossbar.testing.simulator import SimulatedHost
from tests.support.chromium import CHROMIUM, dump_dom
from tests.support.pagerows import PageRows

PLUS_ONE = timezone(timedelta(hours=1))
WEDNESDAY = datetime(2026, 12, 2, 10, 30, tzinfo=PLUS_ONE).timestamp()


def row(
    route: str, key: str, requests: int, prompt: int, cached: int, out: int, loads: int = 0
) -> dict[str, Any]:
    return {"route": route, "key": key, "requests": requests, "prompt_tokens": prompt,
            "cached_tokens": cached, "completion_tokens": out, "loads": loads}  # fmt: skip


def html(view: UsageView) -> str:
    done: list[bytes] = []
    flattenString(None, usage_tables(view)).addCallback(done.append)
    return done[0].decode()


def test_today_and_this_week_begin_at_midnight_and_monday_in_the_zone() -> None:
    day, week = day_and_week(WEDNESDAY, PLUS_ONE)
    assert datetime.fromtimestamp(day, UTC) == datetime(2026, 12, 1, 23, 0, tzinfo=UTC)
    assert datetime.fromtimestamp(week, UTC) == datetime(2026, 11, 29, 23, 0, tzinfo=UTC)
    local_day, local_week = day_and_week(WEDNESDAY)  # the machine's zone
    assert 0 <= WEDNESDAY - local_day < 86400
    assert (local_day - local_week) % 86400 in (0, 3600, 82800)  # whole days, give or take DST


def test_the_sums_by_route_and_key_fold_per_key_and_per_route() -> None:
    today = [row("lab", "alice", 2, 100, 50, 10), row("ops", "alice", 1, 10, 0, 1)]
    week = [*today, row("lab", "bob", 5, 1000, 900, 100)]
    found = totals(today, week)
    assert found.keys == {
        "alice": (Tokens(3, 110, 50, 11), Tokens(3, 110, 50, 11)),
        "bob": (Tokens(), Tokens(5, 1000, 900, 100)),
    }
    assert found.routes["lab"] == (Tokens(2, 100, 50, 10), Tokens(7, 1100, 950, 110))


def test_each_model_served_is_summed_whatever_it_was_sent_as_and_names_them() -> None:
    """Requests an alias mapped count under the model served; the names sent follow it."""
    today = [
        row("lab", "alice", 2, 100, 50, 10) | {"model": "qwen3", "asked_model": ""},
        row("lab", "alice", 3, 30, 0, 3) | {"model": "qwen3", "asked_model": "claude-sonnet-4-5"},
    ]
    week = [*today, row("ops", "bob", 1, 5, 0, 1) | {"model": "qwen3", "asked_model": "gpt-5"}]
    found = totals(today, week)
    assert found.models == {"qwen3": (Tokens(5, 130, 50, 13), Tokens(6, 135, 50, 14))}
    assert found.keys["alice"] == (Tokens(5, 130, 50, 13), Tokens(5, 130, 50, 13))
    assert found.sent == {"qwen3": ["claude-sonnet-4-5", "gpt-5"]}
    page = html(found)
    assert '<table id="usage-models">' in page
    assert (
        '<td data-label="Model">qwen3<span class="muted"> (as claude-sonnet-4-5, gpt-5)</span>'
        in page
    )


class FakeLedger:
    off: str | None = None

    def __init__(self) -> None:
        self.asked: list[tuple[float, float, tuple[str, ...], Deferred[list[dict[str, Any]]]]] = []

    def query(
        self, since: float, until: float, by: tuple[str, ...], *, capped: bool = True
    ) -> Deferred[Any]:
        assert not capped, "the page's own reads are never refused for others' queries"
        d: Deferred[list[dict[str, Any]]] = Deferred()
        self.asked.append((since, until, by, d))
        return d

    def refused(self, since: float, until: float) -> Deferred[Any]:
        return succeed([{"route": "lab", "key": "alice", "why": "path", "requests": 2}])


def test_the_page_shows_the_last_totals_and_reads_again_at_most_every_few_seconds() -> None:
    clock, ledger = Clock(), FakeLedger()
    clock.advance(WEDNESDAY)
    panel = UsageTables(ledger, clock, PLUS_ONE)  # type: ignore[arg-type]
    assert panel.current() is None  # not read yet: the page does not wait
    [(since, _, by, today), (week_since, _, _, week)] = ledger.asked
    assert (since, week_since) == day_and_week(WEDNESDAY, PLUS_ONE)
    assert by == ("route", "key", "model", "asked_model")
    assert panel.current() is None and len(ledger.asked) == 2  # one read at a time
    today.callback([row("lab", "alice", 1, 10, 5, 2)])
    week.callback([row("lab", "alice", 4, 40, 20, 8)])
    shown = panel.current()
    assert not isinstance(shown, str) and shown is not None
    assert shown.keys["alice"] == (Tokens(1, 10, 5, 2), Tokens(4, 40, 20, 8))
    assert shown.refused == ({"route": "lab", "key": "alice", "why": "path", "requests": 2},)
    page = html(shown)
    assert 'id="usage-refused"' in page and ">path</td>" in page
    clock.advance(REFRESH_SECONDS - 1)
    assert panel.current() is shown and len(ledger.asked) == 2
    clock.advance(1)
    assert panel.current() is shown and len(ledger.asked) == 4  # read again, shown meanwhile


def test_a_failed_read_is_one_line_and_tried_again_later() -> None:
    clock, ledger = Clock(), FakeLedger()
    panel = UsageTables(ledger, clock)  # type: ignore[arg-type]
    panel.current()
    logs = LogCapture()
    try:
        ledger.asked[0][3].errback(RuntimeError("database is locked"))
        ledger.asked[1][3].callback([])
    finally:
        logs.close()
    assert logs.lines == ["usage store: cannot read it for the status page: database is locked"]
    assert panel.current() is None
    clock.advance(REFRESH_SECONDS)
    panel.current()
    assert len(ledger.asked) == 4


def test_a_store_that_is_off_is_said() -> None:
    ledger = FakeLedger()
    ledger.off = "cannot use /x: file is not a database"
    assert UsageTables(ledger, Clock()).current() == ledger.off  # type: ignore[arg-type]
    assert UsageTables(None, Clock()).current() == "usage_db is off"
    assert "Usage is not kept: cannot use /x: file is not a database." in html(ledger.off)


def test_the_tables_say_tokens_in_words_names_escaped() -> None:
    view = totals([], [row("lab", "<alice>", 4, 12345, 9876, 2100, loads=3)])
    text = html(view)
    assert '<table id="usage-keys">' in text and '<table id="usage-routes">' in text
    assert "&lt;alice&gt;" in text and "<alice>" not in text
    assert "12,345 prompt (80% cached), 2,100 generated, 4 requests, 3 loads" in text
    assert '<span class="muted">none</span>' in text  # nothing today
    assert "none yet" in html(totals([], []))
    one = html(totals([row("lab", "a", 1, 10, 0, 2)], []))
    assert "10 prompt (0% cached), 2 generated, 1 request<" in one  # no load: unsaid
    loaded = html(totals([row("lab", "a", 1, 10, 0, 2, loads=1)], []))
    assert "10 prompt (0% cached), 2 generated, 1 request, 1 load<" in loaded
    assert "Reading the usage store" in html(None)


def test_the_status_page_has_the_usage_section() -> None:
    config = Config(listen="tcp:0", hosts={"gpu-a": HostConfig("gpu-a", "http://h")},
                    routes={"lab": RouteConfig("lab", ("gpu-a",), None)})  # fmt: skip
    about = About("1", 0.0, "lab.yaml")
    page = StatusPage(config, {}, {}, {}, 0.0, about=about, recent={}, base="http://x",
                      usage_totals=totals([row("lab", "bob", 1, 1, 0, 1)], []))  # fmt: skip
    done: list[bytes] = []
    flattenString(None, page).addCallback(done.append)
    text = done[0].decode()
    assert "<h2>Tokens today and this week</h2>" in text and '<table id="usage-keys">' in text
    assert '<a href="usage">usage (JSON)</a>' in text


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install chromium)",
)
@pytest_twisted.ensureDeferred
async def test_the_usage_tables_in_headless_chromium(tmp_path: Path) -> None:
    """Requests through crossbar, their batch written, the page loaded once to read the
    store: a browser shows each key's and each route's tokens of today and this week."""
    from twisted.internet.threads import deferToThread

    def memory(config: Config) -> Config:
        return attrs.evolve(config, usage_db=":memory:")

    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost({"tiny-a": "loaded"})}, adjust=memory)
        chat = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            response, _ = await rig.post("/lab/v1/chat/completions", chat)
            assert response.code == 200
        ledger = rig.crossbar.usage
        assert ledger is not None
        await ledger.flush()
        rig.crossbar.status.usage_panel.current()  # the first load starts the read
        await ledger.query(0, 1, (), capped=False)  # queued after the panel's reads: they are done
        dom = await deferToThread(dump_dom, rig.base + "/_crossbar/", tmp_path / "profile")
    page = PageRows(dom)
    [key] = page.tables["usage-keys"]
    [route] = page.tables["usage-routes"]
    assert key["Key"] == "lab" and route["Route"] == "lab"  # no keys: the route's
    for shown in (key["Today"], key["This week"], route["This week"]):
        assert shown.endswith(" generated, 2 requests"), shown
        assert " prompt" in shown
