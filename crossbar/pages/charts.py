"""Small line charts drawn on the server as inline SVG: no script, no framework, nothing
fetched. Each is a fixed 220 x 92 box whatever the values, so a page of many hosts stays
small and quick to draw.

Readable without colour: each series has its own line pattern (solid, dashed, dotted),
named beside a sample of that pattern; the axes are labelled in text; and each chart's
``<title>`` and ``aria-label`` say its figures in words (what a screen reader reads, and
what a mouse shows on hover). Built from :mod:`twisted.web.template` tags, so a host's
name in a title is escaped like any other text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs
from twisted.web.template import Flattenable, Tag, tags

WIDTH, HEIGHT = 220, 92
_LEFT, _RIGHT, _TOP, _BOTTOM = 44.0, 214.0, 8.0, 72.0
"""The plot area inside the box; the axis labels sit outside it."""
PATTERNS = ("", "5 3", "1.5 2.5")
"""Each series' ``stroke-dasharray``, in order: solid, dashed, dotted."""
_INKS = ("#222", "#555", "#333")

CHART_STYLE = """
.hour{display:flex;flex-wrap:wrap;gap:.4rem 1.2rem;margin:.2rem 0 1rem}
.hour figure{margin:0;width:220px;max-width:100%}
.hour figcaption{font-size:.85rem;color:#444}
.hour svg.chart{display:block;max-width:100%;height:auto}
.hour svg text{font-size:10px;fill:#555}
"""
"""For the page's ``<style>``; no "<", ">" or "&" (the flattener would escape them)."""


@attrs.frozen
class Series:
    """One line: a value a minute, oldest first; ``None`` draws a gap."""

    name: str
    values: Sequence[float | None]


def count(value: float) -> str:
    """A count as a chart's label reads it: ``"950"``, ``"12k"``, ``"3.4M"``."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            scaled = value / size
            return f"{scaled:.1f}{unit}" if scaled < 10 else f"{scaled:.0f}{unit}"
    return f"{value:.0f}" if value == int(value) else f"{value:.2g}"


def nice_top(peak: float) -> float:
    """The axis' top: the least of 1, 2 or 5 times a power of ten at or above ``peak``."""
    if peak <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(peak))
    return next(f * power for f in (1.0, 2.0, 5.0, 10.0) if f * power >= peak * (1 - 1e-9))


def line_chart(
    label: str, series: Sequence[Series], shown: Callable[[float], str], *, totals: bool = True
) -> Tag:
    """A chart of up to three series over the same minutes. ``label`` names it (the host
    and what is drawn); ``shown`` writes a value as the axis and the words say it;
    ``totals`` adds each series' sum to the words (counts have one, medians do not)."""
    values = [v for line in series for v in line.values if v is not None]
    top = nice_top(max(values, default=0.0))
    words = f"{label}: " + "; ".join(_said(line, shown, totals) for line in series)
    width = (_RIGHT - _LEFT) / max(1, max(len(line.values) for line in series) - 1)
    drawn: list[Tag] = [
        tags.title(words),
        _text(_LEFT - 4, _TOP + 4, shown(top), "end"),
        _text(_LEFT - 4, _BOTTOM, "0", "end"),
        _text(_LEFT, HEIGHT - 4, f"{len(series[0].values)} min ago", "start"),
        _text(_RIGHT, HEIGHT - 4, "now", "end"),
        _svg("path", d=f"M{_LEFT},{_TOP}H{_RIGHT}", stroke="#ddd", fill="none"),
        _svg("path", d=f"M{_LEFT},{_TOP}V{_BOTTOM}H{_RIGHT}", stroke="#999", fill="none"),
    ]
    for index, line in enumerate(series):
        d = _path(line.values, top, width)
        if d:
            drawn.append(_line(d, index, f"{line.name} line"))
    return _svg(
        "svg",
        *drawn,
        class_="chart",
        role="img",
        width=str(WIDTH),
        height=str(HEIGHT),
        viewBox=f"0 0 {WIDTH} {HEIGHT}",
        **{"aria-label": words},
    )


def legend(series: Sequence[Series]) -> list[Tag | str]:
    """Each series' name after a sample of its line's pattern, for a caption."""
    out: list[Tag | str] = []
    for index, line in enumerate(series):
        sample = _svg(
            "svg", _line("M1,5H23", index), width="24", height="10", **{"aria-hidden": "true"}
        )
        out += [" " if index else "", sample, f" {line.name}"]
    return out


def _said(line: Series, shown: Callable[[float], str], totals: bool) -> str:
    """One series in words: its sum (counts), or in how many minutes and its lowest
    (medians); then its highest minute and when."""
    known = [(i, v) for i, v in enumerate(line.values) if v is not None]
    if not any(v for _, v in known):
        return f"{line.name} none"
    at, peak = max(known, key=lambda pair: pair[1])
    ago = len(line.values) - 1 - at
    when = "in the minute under way" if ago == 0 else f"{ago} min ago"
    parts = [f"{shown(sum(v for _, v in known))} in all"] if totals else []
    if not totals:
        parts.append(f"in {len(known)} of {len(line.values)} minutes")
        parts.append(f"lowest {shown(min(v for _, v in known))}")
    parts.append(f"highest {shown(peak)} {when}")
    return f"{line.name} " + ", ".join(parts)


def _path(values: Sequence[float | None], top: float, width: float) -> str:
    """SVG path data through the values, a gap at each ``None``; a lone value between
    gaps is a dot (a round cap on a zero-length stroke)."""
    out: list[str] = []
    pen_down = False
    for i, value in enumerate(values):
        if value is None:
            pen_down = False
            continue
        x = _LEFT + i * width
        y = _BOTTOM - min(value, top) / top * (_BOTTOM - _TOP)
        out.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        lone = not pen_down and (i + 1 == len(values) or values[i + 1] is None)
        if lone:
            out.append("h0.01")
        pen_down = True
    return "".join(out)


def _line(d: str, index: int, name: str | None = None) -> Tag:
    attributes = {
        "d": d,
        "fill": "none",
        "stroke": _INKS[index],
        "stroke-width": "1.6",
        "stroke-linecap": "round",
        "stroke-linejoin": "round",
    }
    if PATTERNS[index]:
        attributes["stroke-dasharray"] = PATTERNS[index]
    if name is not None:
        attributes["class"] = name.replace(" ", "-")
    return _svg("path", **attributes)


def _text(x: float, y: float, text: str, anchor: str) -> Tag:
    return _svg("text", text, x=f"{x:g}", y=f"{y:g}", **{"text-anchor": anchor})


def _svg(name: str, *children: Tag | str, **attributes: str) -> Tag:
    """An SVG element: ``tags`` knows only HTML's names. ``class_`` as in ``tags``."""
    named: dict[bytes | str, Flattenable] = {
        "class" if key == "class_" else key: value for key, value in attributes.items()
    }
    return Tag(name, attributes=named, children=list(children))
