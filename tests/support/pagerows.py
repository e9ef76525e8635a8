"""The status page read as data (tables, metas, paragraphs, chart titles), for the pages' tests."""

from __future__ import annotations

from html.parser import HTMLParser


class PageRows(HTMLParser):
    """The status page as data: for each table id, one ``{column label: cell text}`` per row;
    each ``<meta>`` with a ``name`` or ``http-equiv``, as ``{that: content}``; the text of
    each other element that has an id (a paragraph), as ``{id: text}``; each chart's
    ``<title>`` (an SVG's, not the page's), in order, in ``charts``."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, str]]] = {}
        self.metas: dict[str, str | None] = {}
        self.title = ""
        self.charts: list[str] = []
        self._in_svg = 0
        self.texts: dict[str, str] = {}
        self._said: tuple[str, str, list[str]] | None = None  # (id, tag, text) being read
        self._table: str | None = None
        self._row: dict[str, str] | None = None
        self._label: str | None = None
        self._text: list[str] = []
        self._in_title = False
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element_id = dict(attrs).get("id")
        if element_id and tag != "table":
            self._said = (element_id, tag, [])
        if tag == "table":
            self._table = dict(attrs).get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = {}
        elif tag == "td" and self._row is not None:
            self._label, self._text = dict(attrs).get("data-label") or "", []
        elif tag == "br":
            self._text.append(" ")
        elif tag == "svg":
            self._in_svg += 1
        elif tag == "title":
            self._in_title = True
            if self._in_svg:
                self.charts.append("")
        elif tag == "meta":
            found = dict(attrs)
            key = found.get("name") or found.get("http-equiv")
            if key:
                self.metas[key] = found.get("content")

    def handle_endtag(self, tag: str) -> None:
        if self._said is not None and tag == self._said[1]:
            element_id, _, text = self._said
            self.texts[element_id] = " ".join("".join(text).split())
            self._said = None
        if tag == "td" and self._row is not None and self._label is not None:
            self._row[self._label] = " ".join("".join(self._text).split())
            self._label = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            if self._row:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "title":
            self._in_title = False
        elif tag == "svg":
            self._in_svg -= 1

    def handle_data(self, data: str) -> None:
        if self._said is not None:
            self._said[2].append(data)
        if self._label is not None:
            self._text.append(data)
        if self._in_title and self._in_svg:
            self.charts[-1] += data
        elif self._in_title:
            self.title += data
