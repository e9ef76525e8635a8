"""crossbar.sharing.placesync: while a process is joined to the others (through worker 0 or
the store), the placements it makes in one reactor turn go out in one message, and what the
others placed is taken into its table; while it is not, it places alone."""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.task import Clock

from crossbar.routing import Conversations, Placed
from crossbar.sharing.placesync import PlacementSync

HOSTS = ["gpu-a", "gpu-b"]
A, B, C = bytes(16), bytes([1] * 16), bytes([2] * 16)


def started() -> tuple[PlacementSync, Conversations, list[list[Placed]], Clock]:
    clock, table, sent = Clock(), Conversations(dict.fromkeys(HOSTS, 1)), []
    clock.advance(1000)
    sync = PlacementSync(table, clock, lambda host: host in HOSTS)

    def send(placed: Sequence[Placed]) -> None:
        sent.append(list(placed))

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
