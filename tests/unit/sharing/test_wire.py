"""crossbar.sharing.wire: the workers' slot-count messages and their JSON arguments, which
come back as they were sent, and which drop anything malformed or hostile without raising."""

from __future__ import annotations

import json
import math
from collections.abc import Hashable
from typing import Any, cast

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.protocols import amp
from twisted.python.failure import Failure

from crossbar.queueing import Head
from crossbar.routing import Placed
from crossbar.sharing import wire
from crossbar.testing import LogCapture

CHAT = ("chat", "m")
HOME = ("chat", None, "gpu-a")


def test_counts_come_back_as_they_were_sent() -> None:
    counts = {("gpu-a", "m"): 2, ("gpu-b", None): 1, ("gpu-a", "other"): 7}
    assert wire.load_counts(wire.dump_counts(counts)) == counts


def test_zero_counts_are_not_sent() -> None:
    assert wire.load_counts(wire.dump_counts({("gpu-a", "m"): 0})) == {}


def test_heads_come_back_with_their_pools_as_tuples() -> None:
    heads: dict[Hashable, Head] = {CHAT: (0, 1, 12.5, "f"), HOME: (2, 0, 3.0, "f")}
    assert wire.load_heads(wire.dump_heads(heads)) == heads


def test_a_head_that_came_at_a_whole_second_comes_back_as_a_float() -> None:
    (head,) = wire.load_heads('[[["chat", "m"], [0, 0, 12, "f"]]]').values()
    assert head == (0, 0, 12.0, "f")
    assert isinstance(head[2], float)


def test_a_slot_comes_back_as_it_was_sent() -> None:
    assert wire.load_slot(wire.dump_slot("gpu-a", "m")) == ("gpu-a", "m")
    assert wire.load_slot(wire.dump_slot("gpu-a", None)) == ("gpu-a", None)


def test_pools_come_back_as_tuples() -> None:
    assert wire.load_pools(wire.dump_pools([CHAT, HOME])) == [CHAT, HOME]


NOT_JSON = ["", "{", "not json", "[1, 2", "\x00", "nul"]
NOT_A_LIST = ["{}", '{"a": 1}', "1", '"text"', "null", "true"]


@pytest.mark.parametrize("text", NOT_JSON + NOT_A_LIST)
def test_anything_but_a_json_list_loads_as_nothing(text: str) -> None:
    assert wire.load_counts(text) == {}
    assert wire.load_heads(text) == {}
    assert wire.load_slot(text) is None
    assert wire.load_pools(text) == []


HUGE = "x" * 1025


@pytest.mark.parametrize(
    "item",
    [
        ["gpu-a", "m"],  # too short
        ["gpu-a", "m", 1, 2],  # too long
        ["gpu-a", "m", True],  # a bool is no count
        ["gpu-a", "m", -1],
        ["gpu-a", "m", 1.5],
        ["gpu-a", "m", "1"],
        ["gpu-a", "m", 1 << 31],
        ["gpu-a", "m", None],
        ["", "m", 1],
        [HUGE, "m", 1],
        ["gpu-a", HUGE, 1],
        ["gpu-a", "", 1],
        [1, "m", 1],
        [["gpu-a"], "m", 1],
        ["gpu-a", 7, 1],
        {"host": "gpu-a"},
        "gpu-a",
    ],
)
def test_a_malformed_count_is_dropped_and_the_rest_kept(item: Any) -> None:
    text = json.dumps([item, ["gpu-b", None, 2]])
    assert wire.load_counts(text) == {("gpu-b", None): 2}


def test_the_largest_count_and_longest_name_are_kept() -> None:
    name = "x" * 1024
    text = json.dumps([[name, name, (1 << 31) - 1]])
    assert wire.load_counts(text) == {(name, name): (1 << 31) - 1}


@pytest.mark.parametrize(
    "item",
    [
        [["chat", "m"]],
        [["chat", "m"], [0, 0, 1.0]],
        [["chat", "m"], [0, 0, 1.0, 4]],
        [["chat", "m"], [True, 0, 1.0, "f"]],
        [["chat", "m"], [0, False, 1.0, "f"]],
        [["chat", "m"], [-1, 0, 1.0, "f"]],
        [["chat", "m"], [0, -1, 1.0, "f"]],
        [["chat", "m"], [0.5, 0, 1.0, "f"]],
        [["chat", "m"], [0, 0, "1.0", "f"]],
        [["chat", "m"], [0, 0, None, "f"]],
        [["chat", "m"], [1 << 31, 0, 1.0, "f"]],
        [["chat", 1], [0, 0, 1.0, "f"]],
        [["chat", ["m"]], [0, 0, 1.0, "f"]],
        ["chat", [0, 0, 1.0, "f"]],
        [["chat", "m"], {"band": 0}],
        ["x"],
        7,
    ],
)
def test_a_malformed_head_is_dropped_and_the_rest_kept(item: Any) -> None:
    text = json.dumps([item, [["code", None], [1, 2, 3.0, "f"]]])
    assert wire.load_heads(text) == {("code", None): (1, 2, 3.0, "f")}


@pytest.mark.parametrize(
    "item",
    [
        ["gpu-a"],
        ["gpu-a", "m", "x"],
        ["", "m"],
        [HUGE, "m"],
        ["gpu-a", HUGE],
        ["gpu-a", ""],
        [1, "m"],
        ["gpu-a", 1],
        [None, None],
        ["gpu-a", True],
    ],
)
def test_a_malformed_slot_loads_as_none(item: Any) -> None:
    assert wire.load_slot(json.dumps(item)) is None


def test_pools_that_are_not_lists_are_dropped() -> None:
    assert wire.load_pools('[["chat", "m"], "chat", 1, null, {"a": 1}]') == [CHAT]


DEEP = "[" * 50_000 + "]" * 50_000  # well within one AMP value (64 KiB)


@pytest.mark.parametrize(
    "load", [wire.load_counts, wire.load_heads, wire.load_slot, wire.load_pools]
)
def test_deeply_nested_lists_load_as_nothing(load: Any) -> None:
    assert not load(DEEP)


def test_pools_that_cannot_be_looked_up_are_dropped() -> None:
    pools = wire.load_pools('[["chat", {"a": 1}], ["chat", ["m"]], ["chat", "m"]]')
    assert pools == [CHAT]
    for pool in pools:
        hash(pool)


@pytest.mark.parametrize("arrived", ["true", "NaN", "Infinity", "-Infinity"])
def test_a_head_that_came_at_no_real_time_is_dropped(arrived: str) -> None:
    text = '[[["chat", "m"], [0, 0, ' + arrived + ', "f"]], [["code", null], [1, 2, 3.0, "f"]]]'
    heads = wire.load_heads(text)
    assert heads == {("code", None): (1, 2, 3.0, "f")}
    assert all(math.isfinite(head[2]) for head in heads.values())


def test_a_pool_with_a_huge_name_is_dropped() -> None:
    heads = json.dumps([[["chat", HUGE], [0, 0, 1.0, "f"]], [["code", None], [1, 2, 3.0, "f"]]])
    assert wire.load_heads(heads) == {("code", None): (1, 2, 3.0, "f")}
    assert wire.load_pools(json.dumps([["chat", HUGE], list(CHAT)])) == [CHAT]


# -- the commands -----------------------------------------------------------------------------


def test_only_the_heartbeat_and_the_offer_wait_for_an_answer() -> None:
    answered = {
        c.__name__
        for c in (wire.Join, wire.Report, wire.Give, wire.Beat, wire.Others, wire.Offer)
        if c.requiresAnswer
    }
    assert answered == {"Join", "Beat", "Offer"}


def test_an_offer_is_answered_with_whether_it_was_taken() -> None:
    box = wire.Offer.makeArguments({"slot": wire.dump_slot("gpu-a", "m")}, amp.AMP())
    assert wire.load_slot(wire.Offer.parseArguments(box, amp.AMP())["slot"]) == ("gpu-a", "m")
    for took in (True, False):
        answer = wire.Offer.makeResponse({"took": took}, amp.AMP())
        assert wire.Offer.parseResponse(answer, amp.AMP()) == {"took": took}


def test_a_refused_join_is_known_to_both_sides_as_a_permission_error() -> None:
    assert wire.Join.errors[PermissionError] == b"REFUSED"


@pytest.mark.parametrize("quiet", [True, False])
def test_a_workers_connection_says_nothing_when_it_opens_and_closes(quiet: bool) -> None:
    protocol = wire.CountConnection() if quiet else amp.AMP()
    logs = LogCapture()
    try:
        protocol.makeConnection(StringTransport())
        protocol.connectionLost(Failure(ConnectionDone()))
    finally:
        logs.close()
    assert (logs.lines == []) is quiet  # plain AMP logs both, which this leaves out
    assert protocol.transport is None or not quiet


def test_flows_in_flight_come_back_and_hostile_ones_are_dropped() -> None:
    assert wire.load_flows(wire.dump_flows({"alice": 2, "key-1a2b": 1, "idle": 0})) == {
        "alice": 2,
        "key-1a2b": 1,
    }
    hostile = json.dumps([["ok", 1], ["neg", -1], ["bool", True], [HUGE, 1], [7, 1], "x"])
    assert wire.load_flows(hostile) == {"ok": 1}
    assert wire.load_flows("[" * 100_000) == {}


def test_placements_go_in_messages_an_amp_value_holds_and_come_back_as_sent() -> None:
    sent: list[str] = []

    class Connection:
        def callRemote(self, command: Any, placed: str) -> Deferred[object]:
            assert command is wire.Place
            sent.append(placed)
            return answers[-1] if len(sent) == 2 else succeed({})  # the second not yet

    answers: list[Deferred[object]] = [Deferred()]

    host = "gpu-a-with-a-long-name"
    many = [Placed(n.to_bytes(16, "big"), host, 10**6, 299.5) for n in range(1200)]
    answered: list[object] = []
    wire.send_placed(cast(Any, Connection()), many).addCallback(answered.append)
    assert [len(json.loads(text)) for text in sent] == [wire.MOST_PLACED, wire.MOST_PLACED, 200]
    assert answered == []  # the worker's turns wait until every message is answered
    answers[0].callback({})
    assert len(answered) == 1
    assert max(len(text.encode()) for text in sent) < 0xFFFF
    assert [p for text in sent for p in wire.load_placed(text)] == many


@pytest.mark.parametrize(
    "item",
    [
        ["00" * 15, "gpu-a", 0, 0.0],  # a key too short
        ["zz" * 16, "gpu-a", 0, 0.0],  # not hex
        ["00" * 16, "", 0, 0.0],
        ["00" * 16, "x" * 1025, 0, 0.0],
        ["00" * 16, "gpu-a", -2, 0.0],
        ["00" * 16, "gpu-a", True, 0.0],
        ["00" * 16, "gpu-a", 2**21, 0.0],
        ["00" * 16, "gpu-a", 0, math.inf],
        ["00" * 16, "gpu-a", 0, "1"],
        ["00" * 16, "gpu-a", 0],
        "x",
    ],
)
def test_a_malformed_placement_is_dropped_and_the_rest_kept(item: Any) -> None:
    good = ["11" * 16, "gpu-b", 3, 1.5]
    text = json.dumps([item, good]).replace("Infinity", "1e999")
    assert wire.load_placed(text) == [Placed(bytes([0x11] * 16), "gpu-b", 3, 1.5)]
