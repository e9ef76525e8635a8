"""Small inline SVG charts (crossbar.pages.charts): their words, their lines and their
bounds, read from the flattened markup."""

from __future__ import annotations

import re
from xml.etree import ElementTree

import pytest
from twisted.web.template import Tag, flattenString

from crossbar.pages.charts import (
    CHART_STYLE,
    HEIGHT,
    PATTERNS,
    WIDTH,
    Series,
    count,
    legend,
    line_chart,
    nice_top,
)
from crossbar.pages.times import short_seconds


def flat(tag: Tag | list[Tag | str]) -> str:
    done: list[object] = []
    flattenString(None, tag).addBoth(done.append)
    assert isinstance(done[0], bytes), done
    return done[0].decode()


def svg(text: str) -> ElementTree.Element:
    """The chart as an element tree (the flattener writes well-formed XML)."""
    return ElementTree.fromstring(text)


def lines(chart: ElementTree.Element) -> list[ElementTree.Element]:
    return [p for p in chart.iter("path") if p.get("class", "").endswith("-line")]


def minutes(*pairs: tuple[int, float | None]) -> list[float | None]:
    """Sixty minutes of ``None`` but for the (index, value) pairs given."""
    values: list[float | None] = [None] * 60
    for at, value in pairs:
        values[at] = value
    return values


def test_a_chart_is_a_fixed_box_with_its_words_in_a_title_and_a_label() -> None:
    requests = Series("requests", [0] * 57 + [12, 40, 3])
    errors = Series("errors", [0] * 58 + [2, 0])
    text = flat(line_chart("gpu-a, last 60 min, requests a minute", [requests, errors], count))
    chart = svg(text)
    words = (
        "gpu-a, last 60 min, requests a minute: requests 55 in all, highest 40 1 min ago; "
        "errors 2 in all, highest 2 1 min ago"
    )
    assert chart.findtext("title") == words
    assert chart.get("aria-label") == words
    assert chart.get("role") == "img"
    assert (chart.get("width"), chart.get("height")) == (str(WIDTH), str(HEIGHT))
    assert chart.get("viewBox") == f"0 0 {WIDTH} {HEIGHT}"
    texts = [t.text for t in chart.iter("text")]
    assert texts == ["50", "0", "60 min ago", "now"]  # the axis' top is a round number
    drawn = lines(chart)
    assert [p.get("stroke-dasharray") for p in drawn] == [None, PATTERNS[1]]  # solid, dashed
    assert "<script" not in text


def test_every_point_stays_inside_the_box() -> None:
    series = Series("tokens", [float(i * 1000) for i in range(60)])
    chart = svg(flat(line_chart("x", [series], count)))
    (path,) = lines(chart)
    points = [
        tuple(map(float, p.split(","))) for p in re.findall(r"[-\d.]+,[-\d.]+", path.get("d", ""))
    ]
    assert len(points) == 60
    assert all(0 <= x <= WIDTH and 0 <= y <= HEIGHT for x, y in points)
    assert points[0][0] < points[-1][0]  # the oldest on the left
    assert points[0][1] > points[-1][1]  # 0 at the bottom, the most at the top


def test_gaps_are_left_blank_and_a_lone_minute_is_a_dot() -> None:
    medians = Series("first token", minutes((10, 0.2), (11, 0.4), (30, 1.5), (59, 0.3)))
    chart = svg(
        flat(
            line_chart("gpu-a, median time to first token", [medians], short_seconds, totals=False)
        )
    )
    (path,) = lines(chart)
    d = path.get("d", "")
    assert d.count("M") == 3  # minutes 10-11, 30, 59: three pieces
    assert d.count("h0.01") == 2  # the two lone minutes drawn as dots
    assert path.get("stroke-linecap") == "round"
    assert chart.findtext("title") == (
        "gpu-a, median time to first token: first token in 4 of 60 minutes, lowest 200 ms, "
        "highest 1.5 s 29 min ago"
    )
    assert next(t.text for t in chart.iter("text")) == "2.0 s"


def test_a_quiet_hour_says_none_and_draws_no_line() -> None:
    chart = svg(flat(line_chart("gpu-b", [Series("requests", [0] * 60)], count)))
    assert chart.findtext("title") == "gpu-b: requests none"
    assert [t.text for t in chart.iter("text")][:2] == ["1", "0"]
    assert len(lines(chart)) == 1  # a flat line at 0: no traffic is a value
    medians = svg(flat(line_chart("gpu-b", [Series("first token", [None] * 60)], short_seconds)))
    assert lines(medians) == [] and medians.findtext("title") == "gpu-b: first token none"


def test_the_minute_under_way_is_named_so() -> None:
    chart = svg(flat(line_chart("h", [Series("requests", [0] * 59 + [5])], count)))
    assert chart.findtext("title") == "h: requests 5 in all, highest 5 in the minute under way"


def test_names_are_escaped_in_the_title_and_the_label() -> None:
    evil = "<script>alert(1)</script>"
    text = flat(line_chart(f'{evil}" onload="x', [Series("requests", [1] * 60)], count))
    assert "<script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    chart = svg(text)
    assert chart.findtext("title", "").startswith(evil)  # as text, once parsed
    assert chart.get("aria-label", "").startswith(f'{evil}" onload="x')
    assert chart.get("onload") is None


def test_the_legend_shows_each_pattern_beside_its_name() -> None:
    text = flat([*legend([Series("prompt", []), Series("cached", []), Series("other", [])])])
    assert re.sub(r"<svg.*?</svg>", "[line]", text) == "[line] prompt [line] cached [line] other"
    assert text.count('aria-hidden="true"') == 3  # the words say it; the samples are for eyes
    assert 'stroke-dasharray="5 3"' in text and 'stroke-dasharray="1.5 2.5"' in text


@pytest.mark.parametrize(
    ("peak", "top"),
    [(0, 1), (0.3, 0.5), (1, 1), (1.2, 2), (3, 5), (7, 10), (40, 50), (1234, 2000), (5e6, 5e6)],
)
def test_the_axis_top_is_one_two_or_five_times_a_power_of_ten(peak: float, top: float) -> None:
    assert nice_top(peak) == pytest.approx(top)


def test_counts_read_short() -> None:
    values = [0, 7, 950, 1000, 1250, 12_000, 3_400_000, 2e9, 0.5]
    assert [count(v) for v in values] == [
        "0",
        "7",
        "950",
        "1.0k",
        "1.2k",
        "12k",
        "3.4M",
        "2.0G",
        "0.5",
    ]


def test_the_css_has_nothing_the_flattener_would_escape() -> None:
    assert not set("<>&") & set(CHART_STYLE)
