"""crossbar.sharing.storeplacements: what a replica sends the store of its placements, and
what it takes from the store's answer, checked as hostile. The script itself runs against a
real redis-server in ``tests/system/test_placescript.py``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred, succeed

from crossbar.routing.sharedplacements import Placed
from crossbar.sharing.placescript import PLACES_SCRIPT
from crossbar.sharing.storeplacements import (
    StorePlacements,
    load_heard,
    load_published,
    placed_channel,
)

KEY = bytes(range(16))


class Commands:
    def __init__(self, answer: object = 0) -> None:
        self.answer = answer
        self.calls: list[tuple[Sequence[str], list[Any]]] = []

    def eval(
        self, script: str, keys: Sequence[str] = (), args: Sequence[Any] = ()
    ) -> Deferred[Any]:
        assert script == PLACES_SCRIPT
        self.calls.append((keys, list(args)))
        return succeed(self.answer)


def test_a_put_sends_each_conversation_s_key_in_hex_with_its_host_and_turn() -> None:
    commands = Commands()
    StorePlacements(commands, most=2).put(
        "r1", [Placed(KEY, "gpu-a", 3), Placed(KEY, "gpu-b", -1), Placed(KEY, "x", 0)]
    )
    ((keys, args),) = commands.calls
    assert keys == ["crossbar:placements", "crossbar:placement-order", "crossbar:placement-ids"]
    assert args[:5] == ["put", "crossbar:", 300_000, 2, "r1"]
    assert json.loads(args[5]) == [[KEY.hex(), "gpu-a", 3], [KEY.hex(), "gpu-b", -1]]  # 2 at most
    assert placed_channel() == "crossbar:placed"


def test_a_read_gives_each_placement_its_age_by_the_store_s_clock() -> None:
    answer = [
        "12",
        "100000",
        [KEY.hex(), '["gpu-a",2,97500,"r2"]', KEY.hex(), '["gpu-b",-1,100100,"r2"]'],
    ]
    heard = StorePlacements(Commands(answer)).since(5)
    got: list[Any] = []
    heard.addCallback(got.append)
    assert got[0].seq == 12
    assert got[0].placed == (Placed(KEY, "gpu-a", 2, 2.5), Placed(KEY, "gpu-b", -1, 0.0))


def test_what_is_malformed_is_left_out() -> None:
    good = [KEY.hex(), '["gpu-a",0,1000,"r2"]']
    bad = [
        "zz" * 16, '["gpu-a",0,1000,"r2"]',  # not hex
        "ab" * 15, '["gpu-a",0,1000,"r2"]',  # too short
        KEY.hex(), '["",0,1000,"r2"]',  # no host
        KEY.hex(), '["gpu-a",-2,1000,"r2"]',  # no such turn
        KEY.hex(), '["gpu-a",true,1000,"r2"]',
        KEY.hex(), '["gpu-a",0,1.5,"r2"]',
        KEY.hex(), '["gpu-a",0,1000]',  # no member
        KEY.hex(), '["gpu-a",0,1000,"r1"]',  # this replica's own
        KEY.hex(), "[" * 3000,
        KEY.hex(), 7,
    ]  # fmt: skip
    heard = load_heard(["3", "2000", bad + good], "r1")
    assert heard.placed == (Placed(KEY, "gpu-a", 0, 1.0),)
    for answer in (None, "x", [], ["1", "2"], ["x", "1", []], ["1", "2", "x"], ["-1", "2", []]):
        assert load_heard(answer).placed == ()


def test_a_published_put_is_read_from_its_message_but_one_s_own() -> None:
    rows = [[KEY.hex(), "gpu-a", 2], [KEY.hex(), "", 0], ["xy", "gpu-a", 0], "x", [1, 2]]
    assert load_published(json.dumps(["r2", rows]), "r1") == [Placed(KEY, "gpu-a", 2)]
    assert load_published(json.dumps(["r1", rows]), "r1") == []
    for message in ("", "[]", '{"a": 1}', '["r2", {}]', "[" * 5000, "x" * (1 << 21)):
        assert load_published(message, "r1") == []
