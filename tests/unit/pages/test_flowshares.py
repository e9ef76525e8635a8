"""crossbar.pages.flowshares: each flow's share of the slots, as the status page shows it."""

from __future__ import annotations

from twisted.web.template import flattenString, tags

from crossbar.pages.flowshares import SHOWN, FlowShares, flows_section
from crossbar.queueing.slotuse import SlotUse


def flatten(shares: FlowShares) -> str:
    done: list[object] = []
    flattenString(None, flows_section(shares, tags.div())).addBoth(done.append)
    assert len(done) == 1 and isinstance(done[0], bytes), done
    return done[0].decode()


def test_the_flows_that_used_the_most_come_first_in_words_and_numbers() -> None:
    shares = FlowShares.of(
        {
            "10.0.0.7": SlotUse(0.2, 60.0, 1),
            "alice": SlotUse(0.8, 240.0, 31),
        }
    )
    page = flatten(shares)
    assert page.index("alice") < page.index("10.0.0.7")
    assert '<td class="num" data-label="Share">80%</td>' in page
    assert ">4 min</td>" in page and ">31 requests</td>" in page and ">1 request</td>" in page
    assert shares.to_json() == {
        "window_seconds": 300,
        "top": [
            {"flow": "alice", "share": 0.8, "slot_seconds": 240.0, "requests": 31},
            {"flow": "10.0.0.7", "share": 0.2, "slot_seconds": 60.0, "requests": 1},
        ],
        "others": {"flows": 0, "share": 0, "requests": 0},
    }


def test_a_flood_of_flows_shows_the_top_ones_and_one_line_for_the_rest() -> None:
    usage = {f"10.1.{i >> 8}.{i & 255}": SlotUse(0.5 / 10_000, 0.5, 1) for i in range(10_000)}
    usage["alice"] = SlotUse(0.5, 5_000.0, 400)
    shares = FlowShares.of(usage)
    assert len(shares.top) == SHOWN and shares.top[0][0] == "alice"
    assert (shares.others, shares.others_requests) == (10_000 - SHOWN + 1, 10_000 - SHOWN + 1)
    page = flatten(shares)
    assert page.count("<tr>") == 1 + SHOWN + 1  # the head, the top flows, the rest
    assert "9981 more flows" in page and ">50%</td>" in page
    assert len(page) < 10_000
    assert len(shares.to_json()["top"]) == SHOWN


def test_a_flows_name_is_escaped() -> None:
    page = flatten(FlowShares.of({"<b>eve</b>": SlotUse(1.0, 2.0, 1)}))
    assert "&lt;b&gt;eve&lt;/b&gt;" in page and "<b>eve" not in page
    assert ">2.0 s</td>" in page


def test_with_nothing_counted_the_page_says_so() -> None:
    page = flatten(FlowShares.of({}))
    assert "No request has held a slot in the last 5 min" in page and "<table" not in page
