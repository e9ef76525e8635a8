"""The status page's tokens and speed per host (crossbar.pages.hosttokens): the last five
minutes' table, the last hour's charts, and the same figures in the status JSON."""

from __future__ import annotations

import random
import time
from xml.etree import ElementTree

from twisted.internet.task import Clock
from twisted.web.template import Flattenable, flattenString

from crossbar.config import Config, HostConfig, RouteConfig
from crossbar.pages.hosttokens import HostTokens, host_charts, recent_usage_json
from crossbar.pages.render import About, StatusPage
from crossbar.polling.health import HealthTable
from crossbar.stats.hour import HostHour, HourlyTraffic
from crossbar.stats.record import RequestRecord
from crossbar.stats.window import HostRecent, RecentTraffic
from tests.support.pagerows import PageRows

T0 = 1_700_000_040.0
EVIL = "<script>alert(1)</script>"


def flat(thing: Flattenable) -> str:
    done: list[object] = []
    flattenString(None, thing).addBoth(done.append)
    assert isinstance(done[0], bytes), done
    return done[0].decode()


def rows(html: str) -> list[dict[str, str]]:
    return PageRows(f"<html><body>{html}</body></html>").tables["usage"]


def test_the_table_says_each_hosts_last_five_minutes() -> None:
    recent = {
        "gpu-a": HostRecent(
            requests=12,
            prompt_tokens=120_000,
            cached_tokens=90_000,
            generated_tokens=4_321,
            tokens_per_second=41.25,
            first_token_p50=0.85,
        ),
        "gpu-b": HostRecent(requests=3, generated_tokens=900, tokens_per_second=1234.0),
    }
    html = flat(HostTokens(["gpu-a", "gpu-b", "gpu-c"], recent, {}))
    assert rows(html) == [
        {
            "Host": "gpu-a",
            "Prompt tokens, 5 min": "120,000",
            "Prompt cache hits, 5 min": "75% (90,000 tokens)",
            "Generated tokens, 5 min": "4,321",
            "Tokens a second, 5 min": "41.2",
            "First token p50, 5 min": "850 ms",
        },
        {
            "Host": "gpu-b",
            "Prompt tokens, 5 min": "0",
            "Prompt cache hits, 5 min": "none",
            "Generated tokens, 5 min": "900",
            "Tokens a second, 5 min": "1,234",
            "First token p50, 5 min": "none",
        },
        {  # a host with no figures at all (one that left the config, say)
            "Host": "gpu-c",
            "Prompt tokens, 5 min": "0",
            "Prompt cache hits, 5 min": "none",
            "Generated tokens, 5 min": "0",
            "Tokens a second, 5 min": "none",
            "First token p50, 5 min": "none",
        },
    ]
    assert "Over the last 5 min, as the answers" in html
    assert "not the answer's head, not a keep-alive ping" in html


def test_each_host_has_four_charts_named_in_words() -> None:
    hour = HostHour(
        requests=(0,) * 58 + (30, 10),
        prompt_tokens=(0,) * 58 + (90_000, 1_000),
        cached_tokens=(0,) * 58 + (80_000, 0),
        generated_tokens=(0,) * 59 + (700,),
        first_token_p50=(None,) * 58 + (2.5, 0.4),
    )
    section = ElementTree.fromstring(flat(host_charts("gpu-a", hour)))
    assert section.findtext("h3") == "gpu-a"
    titles = [chart.findtext("title") for chart in section.iter("svg") if chart.get("role")]
    assert titles == [
        "gpu-a, last 60 min, requests a minute: requests 40 in all, highest 30 1 min ago; "
        "errors none",
        "gpu-a, last 60 min, prompt tokens a minute: prompt 91k in all, highest 90k 1 min ago; "
        "cached 80k in all, highest 80k 1 min ago",
        "gpu-a, last 60 min, generated tokens a minute: generated 700 in all, highest 700 in "
        "the minute under way",
        "gpu-a, last 60 min, median time to first token: first token in 2 of 60 minutes, "
        "lowest 400 ms, highest 2.5 s 1 min ago",
    ]
    captions = [" ".join("".join(c.itertext()).split()) for c in section.iter("figcaption")]
    assert captions == [
        "Requests a minute requests errors",
        "Prompt tokens a minute prompt cached",
        "Generated tokens a minute generated",
        "First token, median a minute first token",
    ]


def test_a_hostile_host_name_stays_text_in_the_table_and_the_svg() -> None:
    html = flat(HostTokens([EVIL], {EVIL: HostRecent(requests=1)}, {EVIL: HostHour()}))
    assert "<script>" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 1 + 1 + 4 * 2  # row, h3, charts
    assert rows(html)[0]["Host"] == EVIL


def test_the_json_figures() -> None:
    recent = HostRecent(prompt_tokens=3, cached_tokens=2, generated_tokens=7,
                        tokens_per_second=33.333, first_token_p50=0.12)  # fmt: skip
    assert recent_usage_json(recent) == {
        "prompt_tokens": 3,
        "cached_tokens": 2,
        "cache_hit_rate": 0.6667,
        "generated_tokens": 7,
        "tokens_per_second": 33.33,
        "first_token_p50_seconds": 0.12,
    }


def test_a_page_of_eight_busy_hosts_renders_well_within_its_refresh() -> None:
    """Eight hosts with a full hour and five minutes of traffic: the whole page, charts
    included, in far less than the 5 s between reloads (about 30 ms here; a loose bound
    for a shared machine)."""
    names = [f"gpu-{i}" for i in range(8)]
    config = Config(
        listen="tcp:0",
        hosts={n: HostConfig(n, f"http://{n}") for n in names},
        routes={"lab": RouteConfig("lab", tuple(names), None)},
        source="lab.yaml",
    )
    clock = Clock()
    clock.advance(T0)
    recent, hourly = RecentTraffic(names, clock), HourlyTraffic(names, clock)
    pick = random.Random(25)
    for _ in range(60):
        for name in names:
            for _ in range(20):
                prompt = pick.randint(100, 30_000)
                record = RequestRecord(
                    "lab",
                    name,
                    200,
                    1.0,
                    0.01,
                    prompt_tokens=prompt,
                    cached_tokens=pick.randint(0, prompt),
                    generated_tokens=pick.randint(1, 800),
                    tokens_per_second=pick.uniform(20, 90),
                    first_token=pick.lognormvariate(-0.5, 1),
                )
                recent.request_done(record)
                hourly.request_done(record)
        clock.advance(60)
    table = HealthTable(config.urls, clock)

    def render() -> str:
        return flat(
            StatusPage(
                config,
                table.snapshot(),
                {},
                {"lab": None},
                clock.seconds(),
                about=About("1", T0, "lab.yaml"),
                recent=recent.hosts(),
                base="http://crossbar",
                hourly=hourly.hosts(),
            )
        )

    started = time.perf_counter()
    html = render()
    took = time.perf_counter() - started
    assert html.count('role="img"') == 8 * 4
    assert len(html) < 150_000, f"{len(html)} bytes"
    assert took < 1.0, f"{took * 1000:.0f} ms to render"
