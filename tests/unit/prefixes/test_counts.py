"""crossbar.prefixes.counts: the prefixes new conversations share, bounded, per route and model."""

from __future__ import annotations

from crossbar.prefixes.counts import LATELY, PrefixCounts


def test_a_prefix_is_popular_once_two_new_conversations_began_with_it() -> None:
    counts = PrefixCounts()
    assert counts.saw("lab", "m", b"p", 0.0) == 1
    assert not counts.popular("lab", "m", b"p", 1.0)
    counts.saw("lab", "m", b"p", 2.0)
    assert counts.popular("lab", "m", b"p", 3.0)
    assert not counts.popular("lab", "other", b"p", 3.0)  # another model's count is its own
    assert not counts.popular("other", "m", b"p", 3.0)


def test_a_prefix_not_seen_lately_is_forgotten() -> None:
    counts = PrefixCounts()
    counts.saw("lab", "m", b"p", 0.0)
    counts.saw("lab", "m", b"p", 1.0)
    assert not counts.popular("lab", "m", b"p", 1.0 + LATELY + 1)
    assert counts.listing(1.0 + LATELY + 1) == []


def test_the_table_is_bounded_forgetting_the_least_recently_seen() -> None:
    counts = PrefixCounts(most=2)
    for at, prefix in enumerate((b"a", b"b", b"a", b"c")):
        counts.saw("lab", "m", prefix, float(at))
    rows = counts.listing(10.0)
    assert [(r["prefix"], r["new_conversations"]) for r in rows] == [
        (b"a".hex(), 2),
        (b"c".hex(), 1),
    ]
    assert rows[0] == {
        "route": "lab",
        "model": "m",
        "prefix": b"a".hex(),
        "new_conversations": 2,
        "last_seen_ago": 8.0,
    }
