"""The status page's renderer alone: flatten :class:`StatusPage` and read the HTML it makes.

Exact substrings on purpose: escaping is about the very bytes, and each mark, time and
"Goes to now" text is what a person reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from twisted.internet.task import Clock
from twisted.web.template import flattenString

from crossbar.config import DEMO_SOURCE, Config, HostConfig, RouteConfig
from crossbar.pages import render
from crossbar.pages.charts import CHART_STYLE
from crossbar.pages.peers import WorkerInfo
from crossbar.pages.render import About, StatusPage
from crossbar.pages.style import STYLE
from crossbar.pages.times import duration, short_seconds
from crossbar.polling.health import HealthTable, HostState
from crossbar.routing.policies import Ask, Policies
from crossbar.stats.window import HostRecent, RouteAffinity

T0 = 1_700_000_000.0
T0_RFC3339 = "2023-11-14T22:13:20.000Z"


def config(hosts: dict[str, str], *routes: RouteConfig, source: str = "lab.yaml") -> Config:
    return Config(
        listen="tcp:0",
        hosts={name: HostConfig(name, url) for name, url in hosts.items()},
        routes={route.name: route for route in routes},
        source=source,
    )


def flatten(page: StatusPage) -> str:
    """The page as text; the flattener finishes at once, as nothing in it waits."""
    done: list[object] = []
    flattenString(None, page).addBoth(done.append)
    assert len(done) == 1 and isinstance(done[0], bytes), done
    return done[0].decode("utf-8")


def page(
    cfg: Config,
    states: dict[str, HostState],
    now: float,
    in_flight: dict[str, int] | None = None,
    *,
    recent: dict[str, HostRecent] | None = None,
    base: str = "http://crossbar:7777",
    about: About | None = None,
    affinity: dict[str, RouteAffinity] | None = None,
) -> str:
    """The page, with each route's choice made as the status app makes it; crossbar
    started at T0 unless ``about`` says otherwise."""
    policies = Policies(cfg.routes)
    choices = {}
    for name, route in cfg.routes.items():
        ask = Ask(route.default_model)
        choice = policies.of(route).choose(route, ask, states, {}, commit=False)
        choices[name] = None if choice is None else choice.host
    about = about or About("1.2.3", T0, cfg.source)
    return flatten(
        StatusPage(
            cfg,
            states,
            in_flight or {},
            choices,
            now,
            about=about,
            recent=recent or {},
            base=base,
            affinity=affinity or {},
        )
    )


def table(cfg: Config, clock: Clock) -> HealthTable:
    return HealthTable({name: host.url for name, host in cfg.hosts.items()}, clock)


# -- escaping -----------------------------------------------------------------------------------


def test_text_from_the_config_and_the_hosts_is_escaped(clock: Clock) -> None:
    cfg = config(
        {"gpu<1>": 'http://h/<x>?a="1"&b=2'},
        RouteConfig("r&d", ("gpu<1>",), "<img src=x onerror=alert(1)>"),
    )
    states = table(cfg, clock)
    states.record_ok("gpu<1>", loaded=["m&m"], known=["<b>bold</b>", "m&m"])
    states.record_failure("gpu<1>", "models: bad answer: <script>alert('x')</script>")
    html = page(cfg, states.snapshot(), clock.seconds())

    assert "<script" not in html and "<img" not in html and "<b>bold" not in html
    assert (
        '<td data-label="Host"><b>gpu&lt;1&gt;</b><br />'
        '<small class="muted">http://h/&lt;x&gt;?a="1"&amp;b=2</small></td>'
    ) in html
    assert (
        '<td data-label="Last error"><span class="err">'
        "models: bad answer: &lt;script&gt;alert('x')&lt;/script&gt;</span></td>"
    ) in html
    assert (  # each model id one span, kept on one line by the CSS
        '<td data-label="Known"><span class="model">&lt;b&gt;bold&lt;/b&gt;</span>, '
        '<span class="model">m&amp;m</span></td>'
    ) in html
    assert (
        '<td data-label="Route"><b>r&amp;d</b><br />'
        "<code>http://crossbar:7777/r&amp;d/v1</code></td>"
    ) in html
    assert '<span class="mark down">gpu&lt;1&gt;</span>' in html
    assert '<td data-label="Default model">&lt;img src=x onerror=alert(1)&gt;</td>' in html
    assert "no healthy host for: r&amp;d</p>" in html


def test_a_value_in_an_attribute_is_escaped(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """No config or host value lands in an attribute today; the time in ``title`` is the
    one computed there, so a hostile one is put in its place to test that path."""
    hostile = 'x" onmouseover="alert(1)" <b>'
    monkeypatch.setattr(render, "rfc3339", lambda epoch: hostile)
    cfg = config({"gpu-a": "http://a"})
    states = table(cfg, clock)
    states.record_ok("gpu-a", loaded=[], known=[])
    html = page(cfg, states.snapshot(), clock.seconds())

    assert (
        '<span title="x&quot; onmouseover=&quot;alert(1)&quot; &lt;b&gt;">0 s ago</span>'
    ) in html
    assert 'As of x" onmouseover="alert(1)" &lt;b&gt;; this page' in html  # text: " stays


def test_the_css_is_written_as_it_is(clock: Clock) -> None:
    """Inside <style> a browser reads text raw: the page holds the CSS byte for byte."""
    html = page(config({}), {}, clock.seconds())
    assert f"<style>{STYLE}{CHART_STYLE}</style>" in html


# -- what a person reads ------------------------------------------------------------------------

Action = Callable[[HealthTable], None]


def never_polled(table: HealthTable) -> None:
    pass


def polled_up(table: HealthTable) -> None:
    table.record_ok("gpu-a", loaded=[], known=[])


def polled_down(table: HealthTable) -> None:
    table.record_failure("gpu-a", "health: HTTP 500")


@pytest.mark.parametrize(
    ("action", "mark"),
    [
        (never_polled, '<span class="mark unknown">? unknown</span>'),
        (polled_up, '<span class="mark up">\u25cf up</span>'),
        (polled_down, '<span class="mark down">\u25bc down</span>'),
    ],
)
def test_each_host_state_has_its_mark(clock: Clock, action: Action, mark: str) -> None:
    cfg = config({"gpu-a": "http://a"}, RouteConfig("lab", ("gpu-a",), None))
    states = table(cfg, clock)
    action(states)
    html = page(cfg, states.snapshot(), clock.seconds())

    assert f'<td data-label="State">{mark}</td>' in html
    cls = mark.split('"')[1]  # the route's list of hosts wears the same colour
    assert f'<td data-label="Hosts, in order"><span class="{cls}">gpu-a</span></td>' in html


@pytest.mark.parametrize("action", [never_polled, polled_down])
def test_a_host_never_polled_well_says_never(clock: Clock, action: Action) -> None:
    cfg = config({"gpu-a": "http://a"})
    states = table(cfg, clock)
    action(states)
    html = page(cfg, states.snapshot(), clock.seconds())
    assert '<td data-label="Last good poll"><span class="muted">never</span></td>' in html


def test_the_last_good_poll_is_an_age_with_its_time_on_hover(clock: Clock) -> None:
    cfg = config({"gpu-a": "http://a"})
    states = table(cfg, clock)
    states.record_ok("gpu-a", loaded=["m1"], known=["m1"])
    clock.advance(125)
    html = page(cfg, states.snapshot(), clock.seconds())
    assert (
        f'<td data-label="Last good poll"><span title="{T0_RFC3339}">2 min ago</span></td>'
    ) in html
    assert (
        '<p class="muted">As of 2023-11-14T22:15:25.000Z; this page reloads every 5 s.</p>' in html
    )


def test_goes_to_now_in_each_case(clock: Clock) -> None:
    cfg = config(
        {"gpu-a": "http://a", "gpu-b": "http://b"},
        RouteConfig("healthy", ("gpu-b", "gpu-a"), None),
        RouteConfig("anyway", ("gpu-b",), None, when_all_down="try_all"),
        RouteConfig("stuck", ("gpu-b",), None),
    )
    states = table(cfg, clock)
    states.record_ok("gpu-a", loaded=[], known=[])
    states.record_failure("gpu-b", "refused")
    html = page(cfg, states.snapshot(), clock.seconds())

    goes_to = html.split('<table id="routes">')[1]
    assert '<td data-label="Goes to now"><b>gpu-a</b></td></tr>' in goes_to
    assert (
        '<td data-label="Goes to now"><b>gpu-b</b> '
        '<span class="err">(none healthy; tried anyway)</span></td></tr>'
    ) in goes_to
    assert (
        '<td data-label="Goes to now"><span class="err">no healthy host</span></td></tr>'
    ) in goes_to


def test_the_summary_names_the_routes_that_are_down(clock: Clock) -> None:
    cfg = config(
        {"gpu-a": "http://a", "gpu-b": "http://b"},
        RouteConfig("lab", ("gpu-a",), None),
        RouteConfig("bee", ("gpu-b",), None),
        RouteConfig("both", ("gpu-b", "gpu-a"), None),
    )
    states = table(cfg, clock)
    html = page(cfg, states.snapshot(), clock.seconds())
    assert (
        '<p id="summary"><span class="mark down">not ready</span>'
        " no healthy host for: lab, bee, both</p>"
    ) in html

    states.record_ok("gpu-a", loaded=[], known=[])
    html = page(cfg, states.snapshot(), clock.seconds())
    assert (
        '<p id="summary"><span class="mark down">not ready</span> no healthy host for: bee</p>'
        in html
    )

    states.record_ok("gpu-b", loaded=[], known=[])
    html = page(cfg, states.snapshot(), clock.seconds())
    assert (
        '<p id="summary"><span class="mark up">ready</span> every route has a healthy host</p>'
        in html
    )


def test_rows_follow_the_table_and_the_config_in_order(clock: Clock) -> None:
    cfg = config(
        {"gpu-b": "http://b", "gpu-a": "http://a"},
        RouteConfig("z", ("gpu-a",), None),
        RouteConfig("a", ("gpu-b",), "m1"),
    )
    html = page(cfg, table(cfg, clock).snapshot(), clock.seconds(), {"gpu-a": 7})
    hosts = html.split('<table id="hosts">')[1].split("</table>")[0]
    routes = html.split('<table id="routes">')[1]
    assert hosts.index("<b>gpu-b</b>") < hosts.index("<b>gpu-a</b>")
    assert routes.index("<b>z</b>") < routes.index("<b>a</b>")
    assert hosts.count("<tr>") == 3 and routes.count("<tr>") == 3  # a heading row, then one each
    assert hosts.count('<td data-label="In flight" class="num">0</td>') == 1  # gpu-b
    assert hosts.count('<td data-label="In flight" class="num">7</td>') == 1  # gpu-a


# -- the header: which crossbar, how long up, which config --------------------------------------


def test_the_header_says_version_uptime_and_config_file(clock: Clock) -> None:
    clock.advance(3 * 3600 + 12 * 60 + 59)
    html = page(config({}), {}, clock.seconds())
    assert '<h1>crossbar <small class="muted">1.2.3</small></h1>' in html
    assert (
        f'<p id="about" class="muted">up <span title="{T0_RFC3339}">3 h 12 min</span>'
        " \u00b7 config <code>lab.yaml</code></p>"
    ) in html
    assert 'id="demo"' not in html and "simulated" not in html

    html = page(config({}, source="/etc/<x>&y.yaml"), {}, clock.seconds())
    assert "config <code>/etc/&lt;x&gt;&amp;y.yaml</code>" in html


def test_a_demo_says_so_in_a_banner(clock: Clock) -> None:
    html = page(config({}, source=DEMO_SOURCE), {}, clock.seconds())
    assert "config <code>(demo)</code>" in html
    assert (
        '<p id="demo" class="banner">Demo: the fleet is simulated (<code>--demo</code>),\n'
        "no GPU; its answers are made up.</p>"
    ) in html


@pytest.mark.parametrize(
    ("worker", "shown"),
    [
        (None, None),
        (WorkerInfo(0, 1, "/run"), None),  # one worker is no news
        (WorkerInfo(2, 4, "/run"), "worker 2 of 4"),
    ],
)
def test_the_worker_is_named_when_there_are_several(
    clock: Clock, worker: WorkerInfo | None, shown: str | None
) -> None:
    about = About("1.2.3", T0, "lab.yaml", worker)
    html = page(config({}), {}, clock.seconds(), about=about)
    header = html.split('<p id="about"')[1].split("</p>")[0]
    if shown is None:
        assert "worker" not in header
    else:
        assert header.endswith(f">{shown}</span>")
        assert 'title="workers are numbered from 0; each has its own table and counts"' in header


# -- routes: base URL, policy, where a request goes and whether its model is loaded -------------


def test_each_route_has_its_base_url_from_the_host_the_reader_used(clock: Clock) -> None:
    cfg = config({"gpu-a": "http://a"}, RouteConfig("lab", ("gpu-a",), None))
    html = page(cfg, {}, clock.seconds(), base="http://10.1.2.3:7777")
    assert (
        '<td data-label="Route"><b>lab</b><br /><code>http://10.1.2.3:7777/lab/v1</code></td>'
    ) in html

    hostile = 'http://x"><script>alert(1)</script>'  # a Host header is the client's to write
    html = page(cfg, {}, clock.seconds(), base=hostile)
    assert "<script" not in html
    assert '<code>http://x"&gt;&lt;script&gt;alert(1)&lt;/script&gt;/lab/v1</code>' in html


def test_each_route_shows_its_policy(clock: Clock) -> None:
    cfg = config(
        {"gpu-a": "http://a"},
        RouteConfig("p", ("gpu-a",), None),
        RouteConfig("rr", ("gpu-a",), None, policy="round_robin", when_all_down="try_all"),
        RouteConfig("lb", ("gpu-a",), None, policy="least_busy"),
    )
    html = page(cfg, {}, clock.seconds())
    assert '<td data-label="Policy">priority</td>' in html
    assert '<td data-label="Policy">round_robin; try all when down</td>' in html
    assert '<td data-label="Policy">least_busy</td>' in html


def test_goes_to_now_names_the_model_and_whether_it_is_loaded(clock: Clock) -> None:
    cfg = config(
        {"gpu-a": "http://a", "gpu-b": "http://b"},
        RouteConfig("loaded", ("gpu-a", "gpu-b"), "m1"),
        RouteConfig("known", ("gpu-a", "gpu-b"), "m2"),
        RouteConfig("nowhere", ("gpu-a",), "<m9>"),
    )
    states = table(cfg, clock)
    states.record_ok("gpu-a", loaded=["m0"], known=["m0", "m1"])
    states.record_ok("gpu-b", loaded=["m1"], known=["m1", "m2"])
    goes_to = page(cfg, states.snapshot(), clock.seconds()).split('<table id="routes">')[1]

    assert (  # loaded on gpu-b beats known on gpu-a, the first in the route's order
        '<td data-label="Goes to now"><b>gpu-b</b> <span class="muted">(m1 loaded)</span></td>'
    ) in goes_to
    assert (
        '<td data-label="Goes to now"><b>gpu-b</b> '
        '<span class="muted">(knows m2; would load it)</span></td>'
    ) in goes_to
    assert (
        '<td data-label="Goes to now"><b>gpu-a</b> '
        '<span class="err">(no healthy host lists &lt;m9&gt;)</span></td>'
    ) in goes_to


# -- hosts: the last five minutes ---------------------------------------------------------------


def test_each_host_shows_its_last_five_minutes(clock: Clock) -> None:
    cfg = config({"gpu-a": "http://a", "gpu-b": "http://b", "gpu-c": "http://c"})
    recent = {"gpu-a": HostRecent(1234, 0, 0.042), "gpu-b": HostRecent(7, 3, 12.0)}
    html = page(cfg, table(cfg, clock).snapshot(), clock.seconds(), recent=recent)
    a, b, c = html.split('<table id="hosts">')[1].split("<tbody>")[1].split("</tr>")[:3]

    assert a.endswith(
        '<td data-label="Requests, 5 min" class="num">1234</td>'
        '<td data-label="Errors, 5 min" class="num">0</td>'
        '<td data-label="First byte p50, 5 min" class="num">42 ms</td>'
    )
    assert b.endswith(
        '<td data-label="Requests, 5 min" class="num">7</td>'
        '<td data-label="Errors, 5 min" class="num"><span class="err">3</span></td>'
        '<td data-label="First byte p50, 5 min" class="num">12 s</td>'
    )
    assert c.endswith(  # no traffic at all
        '<td data-label="Requests, 5 min" class="num">0</td>'
        '<td data-label="Errors, 5 min" class="num">0</td>'
        '<td data-label="First byte p50, 5 min" class="num"><span class="muted">none</span></td>'
    )
    assert "errors (answers of status 500 or more)" in html
    assert "first byte are over the last 5 min." in html


def test_durations_and_times_to_first_byte_in_words() -> None:
    spans = [-1, 59.9, 60, 3599, 3600, 3 * 3600 + 12 * 60 + 59, 2 * 86400 + 5 * 3600 + 59 * 60]
    words = ["0 s", "59 s", "1 min", "59 min", "1 h 0 min", "3 h 12 min", "2 d 5 h"]
    assert [duration(span) for span in spans] == words
    times = [0.00001, 0.00045, 0.0015, 0.042, 0.42, 1.5, 12.0, 120.0, 9900.0]
    words = ["0.01 ms", "0.45 ms", "1.5 ms", "42 ms", "420 ms", "1.5 s", "12 s", "120 s", "9900 s"]
    assert [short_seconds(time) for time in times] == words


def test_a_cache_affinity_route_says_how_many_turns_went_home() -> None:
    cfg = config(
        {"gpu-a": "http://a", "gpu-b": "http://b"},
        RouteConfig("agents", ("gpu-a", "gpu-b"), None, "cache_affinity"),
        RouteConfig("quiet", ("gpu-a", "gpu-b"), None, "cache_affinity"),
        RouteConfig("lab", ("gpu-a",), None),
    )
    states = {n: HostState(n, f"http://{n}", healthy=True) for n in ("gpu-a", "gpu-b")}
    turns = {"agents": RouteAffinity(turns=200, home=187), "quiet": RouteAffinity()}
    html = page(cfg, states, T0, affinity=turns)
    assert (
        '<small title="187 at home, 13 moved (load bound, slots, a failed host)" '
        'class="affinity">94% of 200 turns at their home host, 5 min</small>'
    ) in html
    assert '<span class="muted">no conversation in 5 min</span>' in html
    assert html.count("turns at their home host") == 1


def test_a_long_model_list_shows_its_first_ids_a_count_and_what_was_left_out(
    clock: Clock,
) -> None:
    """Issue 27 (3): every id of every host was on the page (37 MB for one host)."""
    cfg = config({"gpu-a": "http://a"})
    states = table(cfg, clock)
    known = [f"m{i:04d}" for i in range(1000)]
    note = "lists 520,000 models: only the first 1,000 are used"
    states.record_ok("gpu-a", loaded=known[:3], known=known, listed=520_000, note=note)
    html = page(cfg, states.snapshot(), clock.seconds())
    shown = ", ".join(f'<span class="model">{m}</span>' for m in known[: render.PAGE_MODELS])
    assert (
        f'<td data-label="Known">{shown}, <span class="muted">and 980 more (1,000 in all)</span>'
        f'<br /><small class="err">{note}</small></td>'
    ) in html
    assert "m0020" not in html
    assert len(html) < 20_000


def test_a_model_the_host_failed_to_load_is_shown_with_its_back_off(clock: Clock) -> None:
    cfg = config({"gpu-a": "http://a"})
    states = table(cfg, clock)
    states.record_ok("gpu-a", loaded=["m1"], known=["m1", "m2"])
    states.load_failed("gpu-a", "m2")
    clock.advance(10)
    html = page(cfg, states.snapshot(), clock.seconds())
    assert '<span class="err">m2 failed to load (1x), not tried for 20 s</span>' in html
