"""crossbar.queueing.slotuse: each flow's use of the slots over the last five minutes."""

from __future__ import annotations

import pytest

from crossbar.queueing.slotuse import BUCKET_SECONDS, WINDOW_SECONDS, SlotTime, SlotUse

T0 = 1_000_020.0  # the start of a bucket


def test_each_flow_gets_its_part_of_the_slot_seconds_and_its_requests() -> None:
    used = SlotTime()
    for name, seconds in (("alice", 20.0), ("alice", 10.0), ("bob", 10.0)):
        used.add(name, seconds, T0)
    assert used.usage(T0 + 60) == {
        "alice": SlotUse(0.75, 30.0, 2),
        "bob": SlotUse(0.25, 10.0, 1),
    }
    assert used.shares(T0 + 60) == {"alice": 0.75, "bob": 0.25}


def test_what_ended_more_than_five_minutes_ago_no_longer_counts() -> None:
    used = SlotTime()
    used.add("alice", 30.0, T0)
    used.add("bob", 10.0, T0 + 200)
    assert used.shares(T0 + WINDOW_SECONDS - 1) == {"alice": 0.75, "bob": 0.25}
    assert used.shares(T0 + WINDOW_SECONDS + 1) == {"bob": 1.0}
    assert used.usage(T0 + 200 + WINDOW_SECONDS + BUCKET_SECONDS) == {}


def test_a_request_that_held_no_slot_time_gives_no_share() -> None:
    used = SlotTime()
    used.add("alice", 0.0, T0)
    assert used.usage(T0) == {}
    used.add("bob", 2.0, T0)
    assert used.usage(T0) == {"bob": SlotUse(1.0, 2.0, 1)}


def test_a_flow_costs_a_few_buckets_however_much_it_sends() -> None:
    used = SlotTime()
    for i in range(100_000):
        used.add("busy", 0.5, T0 + i * 0.1)  # 10,000 s: over 30 windows
    ticks = used._flows["busy"]
    assert len(ticks) <= WINDOW_SECONDS // BUCKET_SECONDS
    assert used.usage(T0 + 10_000)["busy"].requests == pytest.approx(3000, abs=300)


def test_a_forgotten_flow_is_gone_and_its_time_still_counts_in_the_whole() -> None:
    used = SlotTime()
    for i in range(1000):
        used.add(f"10.0.{i >> 8}.{i & 255}", 1.0, T0)
    used.add("alice", 1000.0, T0)
    for i in range(1000):
        used.forget(f"10.0.{i >> 8}.{i & 255}")
    assert len(used) == 1
    assert used.shares(T0) == {"alice": 0.5}
