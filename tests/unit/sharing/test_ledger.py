"""crossbar.sharing.ledger: every worker's slots, waiting heads and offered slots, as
worker 0 counts them; a freed slot is offered to the worker whose request waits first."""

from __future__ import annotations

from crossbar.sharing.ledger import HEARTBEAT, LEASE, Holding, SlotLedger

A = ("gpu-a", "m")
B = ("gpu-b", None)
CHAT = ("chat", "m")
CODE = ("code", "m")


def ledger(*names: str, now: float = 0.0) -> SlotLedger:
    found = SlotLedger()
    for name in names:
        found.join(name, now)
    return found


def test_a_member_is_shown_what_every_other_member_holds_not_its_own() -> None:
    slots = ledger("w0", "w1", "w2")
    slots.report("w0", Holding({A: 1}, {}), 1.0)
    slots.report("w1", Holding({A: 2, B: 1}, {}), 1.0)
    slots.report("w2", Holding({B: 3}, {}), 1.0)
    assert slots.others("w0").counts == {A: 2, B: 4}
    assert slots.others("w1").counts == {A: 1, B: 3}
    assert slots.others("w2").counts == {A: 3, B: 1}


def test_a_report_replaces_the_last_one_and_zero_counts_are_left_out() -> None:
    slots = ledger("w0", "w1")
    slots.report("w1", Holding({A: 2, B: 1}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    slots.report("w1", Holding({A: 0, B: 1}, {}), 2.0)
    assert slots.others("w0") == Holding({B: 1}, {}, {})
    assert slots.held("w1") == 1


def test_the_first_head_of_each_pool_among_the_others_is_shown() -> None:
    slots = ledger("w0", "w1", "w2")
    slots.report("w0", Holding({}, {CHAT: (0, 0, 0.5, "f")}), 1.0)
    slots.report("w1", Holding({}, {CHAT: (1, 0, 1.0, "f"), CODE: (0, 2, 3.0, "f")}), 1.0)
    slots.report("w2", Holding({}, {CHAT: (1, 0, 2.0, "f"), CODE: (0, 1, 9.0, "f")}), 1.0)
    assert slots.others("w0").heads == {CHAT: (1, 0, 1.0, "f"), CODE: (0, 1, 9.0, "f")}
    assert slots.others("w2").heads == {CHAT: (0, 0, 0.5, "f"), CODE: (0, 2, 3.0, "f")}


def test_a_freed_slot_is_offered_to_the_member_whose_head_is_first() -> None:
    slots = ledger("w0", "w1", "w2")
    slots.report("w0", Holding({}, {CHAT: (1, 0, 1.0, "f")}), 1.0)
    slots.report("w1", Holding({}, {CHAT: (0, 3, 5.0, "f")}), 1.0)  # a better band beats the rest
    slots.report("w2", Holding({}, {CHAT: (0, 4, 2.0, "f")}), 1.0)
    assert slots.offer(A, [CHAT]) == "w1"


def test_an_offer_looks_at_every_pool_the_slot_can_serve() -> None:
    slots = ledger("w0", "w1")
    slots.report("w0", Holding({}, {CHAT: (0, 1, 1.0, "f")}), 1.0)
    slots.report("w1", Holding({}, {CODE: (0, 0, 5.0, "f")}), 1.0)
    assert slots.offer(A, [CHAT]) == "w0"
    assert slots.offer(A, [CHAT, CODE]) == "w1"


def test_nobody_is_offered_a_slot_no_request_waits_for() -> None:
    slots = ledger("w0", "w1")
    slots.report("w1", Holding({A: 1}, {CODE: (0, 0, 1.0, "f")}), 1.0)
    assert slots.offer(A, [CHAT]) is None
    assert slots.others("w0").counts == {A: 1}  # nothing counted for nobody


def test_members_that_passed_the_slot_on_are_skipped() -> None:
    slots = ledger("w0", "w1", "w2")
    slots.report("w0", Holding({}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    slots.report("w1", Holding({}, {CHAT: (0, 0, 2.0, "f")}), 1.0)
    slots.report("w2", Holding({}, {CHAT: (0, 0, 3.0, "f")}), 1.0)
    assert slots.offer(A, [CHAT], skip=["w0"]) == "w1"
    assert slots.offer(A, [CHAT], skip=["w0", "w1"]) == "w2"
    assert slots.offer(A, [CHAT], skip=["w0", "w1", "w2"]) is None


def test_an_offered_slot_counts_as_the_offered_members_until_it_answers() -> None:
    slots = ledger("w0", "w1", "w2")
    slots.report("w1", Holding({A: 1}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    assert slots.offer(A, [CHAT]) == "w1"
    assert slots.others("w0").counts == {A: 2}
    assert slots.others("w2").counts == {A: 2}
    assert slots.others("w1").counts == {}  # its own offered slot is not shown to it
    assert slots.held("w1") == 2
    slots.answered("w1", A)
    assert slots.others("w0").counts == {A: 1}
    assert slots.held("w1") == 1


def test_each_offer_is_counted_until_its_own_answer() -> None:
    slots = ledger("w0", "w1")
    slots.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    slots.offer(A, [CHAT])
    slots.offer(A, [CHAT])
    assert slots.others("w0").counts == {A: 2}
    slots.answered("w1", A)
    assert slots.others("w0").counts == {A: 1}
    slots.answered("w1", A)
    slots.answered("w1", A)  # one answer too many counts nothing below zero
    assert slots.others("w0").counts == {}


def test_a_taken_slot_counts_once_the_member_reports_it_and_answers() -> None:
    slots = ledger("w0", "w1")
    slots.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    slots.offer(A, [CHAT])
    slots.report("w1", Holding({A: 1}, {}), 2.0)  # its request took it: reported before the answer
    slots.answered("w1", A)
    assert slots.others("w0").counts == {A: 1}


def test_a_given_slot_leaves_the_givers_count_at_once() -> None:
    slots = ledger("w0", "w1", "w2")
    slots.report("w0", Holding({A: 2}, {}), 1.0)
    slots.report("w1", Holding({}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    slots.give("w0", A)
    assert slots.offer(A, [CHAT]) == "w1"
    assert slots.others("w2").counts == {A: 2}  # one still w0's, one offered to w1: not three
    assert slots.held("w0") == 1


def test_a_gift_of_a_slot_not_held_counts_nothing_below_zero() -> None:
    slots = ledger("w0", "w1")
    slots.report("w0", Holding({A: 1}, {}), 1.0)
    slots.give("w0", A)
    slots.give("w0", A)
    slots.give("w0", B)
    slots.give("ghost", A)
    assert slots.others("w1").counts == {}
    assert slots.members() == ["w0", "w1"]


def test_an_answer_from_an_unknown_member_is_ignored() -> None:
    slots = ledger("w0")
    slots.answered("gone", A)
    assert slots.members() == ["w0"]


def test_a_member_that_leaves_takes_its_counts_heads_and_offers_with_it() -> None:
    slots = ledger("w0", "w1")
    slots.report("w1", Holding({A: 3}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    slots.offer(B, [CHAT])
    assert slots.leave("w1") is True
    assert slots.others("w0") == Holding({}, {}, {})
    assert slots.held("w1") == 0
    assert slots.offer(A, [CHAT]) is None
    assert slots.leave("w1") is False


def test_joining_again_starts_with_nothing_counted() -> None:
    slots = ledger("w0", "w1")
    slots.report("w1", Holding({A: 3}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    slots.join("w1", 2.0)
    assert slots.others("w0") == Holding({}, {}, {})
    assert slots.members() == ["w0", "w1"]


def test_a_member_silent_for_a_lease_expires_with_its_counts() -> None:
    slots = ledger("w0", "w1", now=0.0)
    slots.report("w1", Holding({A: 2}, {CHAT: (0, 0, 1.0, "f")}), 1.0)
    assert slots.expired(LEASE) == []  # w0 joined at 0: exactly a lease is not past it
    assert slots.expired(LEASE + 0.5) == ["w0"]
    assert slots.expired(1.0 + LEASE + 0.5) == ["w1"]
    assert slots.members() == []
    assert slots.held("w1") == 0


def test_reports_and_heartbeats_keep_a_member_alive() -> None:
    slots = ledger("w0", "w1", now=0.0)
    now = 0.0
    while now < 5 * LEASE:
        now += HEARTBEAT
        slots.seen("w0", now)
        slots.report("w1", Holding({A: 1}, {}), now)
        assert slots.expired(now) == []
    assert slots.others("w0").counts == {A: 1}


def test_a_heartbeat_from_an_unknown_member_does_not_make_it_one() -> None:
    slots = ledger("w0")
    slots.seen("ghost", 1.0)
    assert slots.members() == ["w0"]
    assert slots.held("ghost") == 0


def test_a_report_from_a_member_not_joined_counts_it_from_then_on() -> None:
    slots = ledger("w0")
    slots.report("w1", Holding({A: 1}, {}), 1.0)
    assert slots.members() == ["w0", "w1"]
    assert slots.others("w0").counts == {A: 1}


def test_a_shorter_lease_is_kept_as_given() -> None:
    slots = SlotLedger(lease=1.0)
    slots.join("w0", 0.0)
    assert slots.expired(1.5) == ["w0"]


def test_across_members_a_flow_is_ordered_by_its_requests_in_flight_in_all_of_them() -> None:
    slots = ledger("w0", "w1")
    slots.report("w0", Holding({}, {CHAT: (0, 1, 1.0, "heavy")}, {"heavy": 1}), 1.0)
    slots.report("w1", Holding({}, {CHAT: (0, 0, 5.0, "light")}, {"heavy": 7}), 1.0)
    assert slots.offer(A, [CHAT]) == "w1"  # heavy runs 8 in all: the light one goes first
    shown = slots.others("w1")
    assert shown.heads == {CHAT: (0, 1, 1.0, "heavy")} and shown.flows == {"heavy": 1}
