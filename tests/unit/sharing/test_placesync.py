"""crossbar.sharing.placesync: while a process is joined to the others (through worker 0 or
the store), the placements it makes in one reactor turn go out in one message, and what the
others placed is taken into its table; while it is not, it places alone."""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from crossbar.routing import Conversations, Placed
from crossbar.sharing.placesync import MOST_HELD, PlacementSync

HOSTS = ["gpu-a", "gpu-b"]
A, B, C = bytes(16), bytes([1] * 16), bytes([2] * 16)


def started(
    answers: list[Deferred[object]] | None = None,
) -> tuple[PlacementSync, Conversations, list[list[Placed]], Clock]:
    """A process joined to the others; each message's answer is put in ``answers`` (none
    given: each is answered at once)."""
    clock, table, sent = Clock(), Conversations(dict.fromkeys(HOSTS, 1)), []
    clock.advance(1000)
    sync = PlacementSync(table, clock, lambda host: host in HOSTS)

    def send(placed: Sequence[Placed]) -> Deferred[object]:
        sent.append(list(placed))
        answer: Deferred[object] = Deferred()
        if answers is None:
            answer.callback(None)
        else:
            answers.append(answer)
        return answer

    sync.start(send)
    return sync, table, sent, clock


def test_one_reactor_turn_s_placements_go_in_one_message() -> None:
    sync, table, sent, clock = started()
    assert sync.sharing
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    table.place(C, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    assert sent == []
    clock.advance(0)
    assert [[p.key for p in message] for message in sent] == [[A, C]]


def test_what_others_placed_is_taken_hosts_not_in_the_config_left_out() -> None:
    sync, table, sent, clock = started()
    sync.heard([Placed(B, "gpu-b", 2, 1.0), Placed(C, "gpu-z", 0)])
    assert table.host_of(B) == "gpu-b" and table.host_of(C) is None
    clock.advance(0)
    assert sent == []  # what was heard is not sent back


def test_while_the_link_is_lost_the_process_places_alone() -> None:
    sync, table, sent, clock = started()
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    sync.stop()
    clock.advance(0)
    assert sent == [] and table.outgoing is None and not sync.sharing
    sync.heard([Placed(B, "gpu-b", 2)])
    assert table.host_of(B) is None  # nothing heard while not joined


# -- a turn placed anew waits until the others know its host ----------------------------------


def fired(told: Deferred[None] | None) -> list[object]:
    seen: list[object] = []
    assert told is not None
    told.addCallback(seen.append)
    return seen


def test_a_new_conversation_s_turn_goes_once_the_others_have_its_host() -> None:
    answers: list[Deferred[object]] = []
    sync, table, sent, clock = started(answers)
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    went = fired(sync.told(A))
    clock.advance(0)  # sent, not yet answered
    assert len(sent) == 1 and went == []
    answers[0].callback(None)
    assert went == [None]
    assert sync.told(A) is None  # the others know it now


def test_a_turn_that_stays_on_its_host_goes_at_once() -> None:
    sync, table, _, clock = started()
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    clock.advance(0)
    host = table.host_of(A)
    placed = table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=1)
    assert placed is not None and placed.host == host
    assert sync.told(A) is None  # sent with the turn's others, but nobody waits for it
    sync.heard([Placed(B, "gpu-b", 2)])
    table.place(B, HOSTS, {}, 1.5, clock.seconds(), turn=3)
    assert sync.told(B) is None  # heard here: the others know it already


def test_a_store_that_does_not_answer_holds_a_turn_no_longer_than_its_limit() -> None:
    answers: list[Deferred[object]] = []
    sync, table, _, clock = started(answers)
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    went = fired(sync.told(A))
    clock.advance(MOST_HELD - 0.01)
    assert went == []
    clock.advance(0.01)
    assert went == [None]
    answers[0].callback(None)  # late: nothing more happens
    assert went == [None] and not clock.getDelayedCalls()


def test_a_lost_link_lets_every_held_turn_go() -> None:
    answers: list[Deferred[object]] = []
    sync, table, _, clock = started(answers)
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    table.place(C, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    first, second = fired(sync.told(A)), fired(sync.told(C))
    sync.stop()
    assert first == second == [None]
    assert not clock.getDelayedCalls()
