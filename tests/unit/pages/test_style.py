"""crossbar.pages.style: the page's CSS survives the template's flattening as written."""

from __future__ import annotations

from crossbar.pages.charts import CHART_STYLE
from crossbar.pages.style import STYLE


def test_the_css_holds_nothing_the_flattener_would_escape() -> None:
    """Inside <style> a browser reads text raw, but the flattener escapes <, > and & as in
    any text: one of them would break the rule it is in."""
    for css in (STYLE, CHART_STYLE):
        assert not set(css) & set("<>&")
        assert css.count("{") == css.count("}")
