"""crossbar.sharing.placesync: while the store is up, the placements a replica makes in one
reactor turn go to the store in one call, and what the others put is read from where the
last read left off into the replica's table; while it is down, the replica places alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from crossbar.routing.affinity import Conversations
from crossbar.sharing.placesync import PlacementSync

HOSTS = ["gpu-a", "gpu-b"]
A, B, C = bytes(16), bytes([1] * 16), bytes([2] * 16)


class Commands:
    """The store: each run recorded; ``since`` answers what :attr:`placed` holds after the
    sequence number asked, or waits while :attr:`held` is set."""

    def __init__(self) -> None:
        self.runs: list[list[Any]] = []
        self.placed: list[tuple[int, str, str]] = []  # seq, key, value
        self.failing = False
        self.held: Deferred[Any] | None = None

    def eval(
        self, script: str, keys: Sequence[str] = (), args: Sequence[Any] = ()
    ) -> Deferred[Any]:
        op, rest = args[0], list(args[4:])
        self.runs.append([op, *rest])
        if self.failing:
            return fail(TimeoutError("Not received Redis response in 1.0 seconds"))
        if op == "since":
            if self.held is not None:
                return self.held
            new = [x for seq, key, value in self.placed if seq > rest[0] for x in (key, value)]
            last = max((seq for seq, _, _ in self.placed), default=0)
            return succeed([str(last), "100000", new])
        return succeed(len(json.loads(rest[1])))

    def ops(self) -> list[str]:
        return [run[0] for run in self.runs]


def started() -> tuple[PlacementSync, Conversations, Commands, Clock, list[Failure]]:
    clock, table, commands, failures = (
        Clock(),
        Conversations(dict.fromkeys(HOSTS, 1)),
        Commands(),
        [],
    )
    clock.advance(1000)
    sync = PlacementSync("r1", table, clock, lambda host: host in HOSTS)
    commands.placed = [(1, B.hex(), '["gpu-b",2,99000]')]
    sync.start(cast(Any, commands), failures.append)
    return sync, table, commands, clock, failures


def test_on_joining_a_replica_reads_every_live_placement() -> None:
    _, table, commands, _, _ = started()
    assert commands.runs == [["since", 0]]
    assert table.host_of(B) == "gpu-b"  # another replica's conversation, known here
    assert table.outgoing is not None


def test_one_reactor_turn_s_placements_go_in_one_call() -> None:
    _, table, commands, clock, _ = started()
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    table.place(C, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    assert commands.ops() == ["since"]
    clock.advance(0)
    assert commands.ops() == ["since", "put"]
    name, rows = commands.runs[-1][1], json.loads(commands.runs[-1][2])
    assert name == "r1" and [row[0] for row in rows] == [A.hex(), C.hex()]


def test_a_read_goes_on_from_where_the_last_one_left_off() -> None:
    sync, table, commands, _, _ = started()
    commands.placed.append((2, A.hex(), '["gpu-a",0,99500]'))
    sync.read()
    assert commands.runs[-1] == ["since", 1]
    assert table.host_of(A) == "gpu-a"


def test_reads_asked_during_one_come_once_after_it() -> None:
    sync, _, commands, _, _ = started()
    commands.held = Deferred()
    sync.read()
    sync.read()
    sync.read()
    assert commands.ops() == ["since", "since"]
    held, commands.held = commands.held, None
    held.callback(["1", "100000", []])
    assert commands.ops() == ["since", "since", "since"]


def test_while_the_store_is_lost_the_replica_places_alone() -> None:
    sync, table, commands, clock, _ = started()
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    sync.stop()
    clock.advance(0)
    assert commands.ops() == ["since"]  # nothing sent after
    assert table.outgoing is None
    sync.read()
    assert commands.ops() == ["since"]


def test_a_failed_call_is_handed_to_the_link() -> None:
    _, table, commands, clock, failures = started()
    commands.failing = True
    table.place(A, HOSTS, {}, 1.5, clock.seconds(), turn=0)
    clock.advance(0)
    assert len(failures) == 1 and failures[0].check(TimeoutError)
