"""crossbar.routing.conversationtable: how many conversations are live on a host (their last
turn within five minutes) and which ones, newest first, read without the whole table."""

from __future__ import annotations

import attrs

from crossbar.routing.conversationtable import (
    BUCKET_SECONDS,
    BUCKETS,
    LIVE_SECONDS,
    HostOrder,
    LiveCounts,
)


@attrs.define
class Entry:
    host: str
    tick: int


def test_conversations_count_while_their_last_turn_is_in_the_window() -> None:
    live = LiveCounts()
    live.add(100)
    live.add(100)
    live.add(105)

    assert live.at(105) == 3
    assert live.at(100 + BUCKETS - 1) == 3
    assert live.at(100 + BUCKETS) == 1  # the two of tick 100 are five minutes old
    assert live.at(105 + BUCKETS) == 0
    assert BUCKETS * BUCKET_SECONDS == LIVE_SECONDS


def test_a_count_never_goes_back_when_asked_about_an_earlier_tick() -> None:
    live = LiveCounts()
    live.add(100)
    assert live.at(100 + BUCKETS) == 0
    assert live.at(100) == 0


def test_a_removed_conversation_no_longer_counts_and_a_stale_removal_does_nothing() -> None:
    live = LiveCounts()
    live.add(100)
    live.add(101)
    live.remove(100)
    assert live.at(101) == 1
    live.remove(100)  # counted once, removed once
    live.remove(100 + BUCKETS)  # same bucket, other tick: not its count
    assert live.at(101) == 1


def test_a_turn_out_of_order_counts_if_still_in_the_window() -> None:
    live = LiveCounts()
    live.add(200)
    live.add_at(180)
    live.add_at(200 - BUCKETS)  # already out of the window
    assert live.at(200) == 2


def test_a_bucket_reused_by_a_later_tick_drops_the_older_count() -> None:
    live = LiveCounts()
    live.add(100)
    live.add_at(100 + BUCKETS)  # the same slot of the ring, five minutes on
    assert live.total == 1


def turn(entries: dict[bytes, Entry], order: HostOrder, key: bytes, host: str, tick: int) -> None:
    old = entries.get(key)
    if old is not None:
        order.remove(old.host)
    entries[key] = Entry(host, tick)
    order.add(host, key, entries)


def test_a_hosts_conversations_come_newest_first_and_moved_ones_leave() -> None:
    entries: dict[bytes, Entry] = {}
    order = HostOrder()
    turn(entries, order, b"a", "gpu-a", 1)
    turn(entries, order, b"b", "gpu-a", 2)
    turn(entries, order, b"c", "gpu-a", 3)
    turn(entries, order, b"a", "gpu-a", 4)  # a turns again
    turn(entries, order, b"b", "gpu-b", 5)  # b moves

    assert [k for k, _ in order.newest("gpu-a", entries)] == [b"a", b"c"]
    assert [k for k, _ in order.newest("gpu-b", entries)] == [b"b"]
    assert [k for k, _ in order.newest("gpu-a", entries, oldest=3)] == [b"a"]


def test_a_busy_host_keeps_a_bounded_list_of_keys() -> None:
    entries: dict[bytes, Entry] = {}
    order = HostOrder()
    for tick in range(10_000):
        turn(entries, order, b"k%d" % (tick % 3), "gpu-a", tick)

    assert len(order._keys["gpu-a"]) <= 2 * 3 + 64 + 1
    assert [k for k, _ in order.newest("gpu-a", entries)] == [b"k0", b"k2", b"k1"]


def test_a_host_whose_conversations_all_left_leaves_no_trace() -> None:
    entries: dict[bytes, Entry] = {}
    order = HostOrder()
    turn(entries, order, b"a", "gpu-a", 1)
    turn(entries, order, b"a", "gpu-b", 2)

    assert list(order.newest("gpu-a", entries)) == []
    assert "gpu-a" not in order._keys
