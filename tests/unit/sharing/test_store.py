"""crossbar.sharing.store: the store's reports are written compactly and read back as
hostile (anything malformed left out, never trusted in part), each ledger call is one run of
the script with its keys and arguments, and a member's view of the stored ledger is what
:class:`~crossbar.sharing.ledger.SlotLedger` would show it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from twisted.internet.defer import Deferred, succeed

from crossbar.sharing.ledger import Holding, SlotLedger
from crossbar.sharing.script import LEDGER_SCRIPT
from crossbar.sharing.store import (
    MOST_MEMBERS,
    MOST_REPORT,
    PREFIX,
    Stored,
    StoreLedger,
    changes_channel,
    dump_stored,
    load_state,
    load_stored,
    offers_channel,
)

SLOT = ("gpu-a", "qwen3-coder-30b")
POOL = ("lab", "qwen3-coder-30b")
HOME = ("lab", "qwen3-coder-30b", "gpu-a")
HOLDING = Holding(
    {SLOT: 2, ("gpu-b", None): 1},
    {POOL: (1, 0, 1733400000.25, "alice"), HOME: (0, 2, 1733400001.5, "bob")},
    {"alice": 1, "bob": 2},
)


def test_a_report_comes_back_as_it_was_written() -> None:
    assert load_stored(dump_stored(HOLDING)) == HOLDING


def test_a_report_is_compact_json_keyed_by_slot_and_pool() -> None:
    stored = json.loads(dump_stored(HOLDING))
    assert stored["counts"] == {'["gpu-a","qwen3-coder-30b"]': 2, '["gpu-b",null]': 1}
    assert stored["heads"]['["lab","qwen3-coder-30b"]'] == [1, 0, 1733400000.25, "alice"]


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '"counts"', "[" * 100_000, None, 5],
)
def test_what_is_not_a_report_is_none(text: Any) -> None:
    assert load_stored(text) is None


def test_malformed_entries_are_left_out_one_by_one() -> None:
    hostile = {
        "counts": {'["gpu-a","m"]': 1, '["gpu-a"]': 1, '["gpu-b","m"]': -3, "x": 1, '["c",1]': 1},
        "heads": {
            '["lab","m"]': [0, 0, 1.0, "ok"],
            '["lab"]': [0, 0, 1.0, "short pool"],
            '["lab","n"]': [0, 0, "soon", "bad time"],
            '["lab","o"]': [True, 0, 1.0, "a bool band"],
            '["lab","p"]': [0, 0, 1.0],
        },
        "flows": {"alice": 2, "": 1, "bob": "many", "carol": 0},
    }
    assert load_stored(json.dumps(hostile)) == Holding(
        {("gpu-a", "m"): 1}, {("lab", "m"): (0, 0, 1.0, "ok")}, {"alice": 2}
    )


def test_the_state_read_is_checked_too() -> None:
    answer = [
        ["w1", dump_stored(HOLDING), "w2", "garbage", 7, dump_stored(Holding())],
        ["w2", '["gpu-a","qwen3-coder-30b"]', "w3", "[1]"],
        ["w1", "4", "w2", "-1", "w3", "9" * 20],
    ]
    assert load_state(answer) == Stored({"w1": HOLDING}, (("w2", SLOT),), {"w1": 4})
    assert load_state("nonsense") == Stored()
    assert load_state([[], []]) == Stored()


def test_a_member_s_view_is_the_ledger_s() -> None:
    other = Holding({SLOT: 1}, {POOL: (1, 0, 5.0, "carol")}, {"carol": 1})
    stored = Stored({"w1": HOLDING, "w2": other}, (("w2", SLOT),), {"w1": 3})
    ledger = SlotLedger()
    ledger.report("w1", HOLDING, 0.0)
    ledger.report("w2", other, 0.0)
    ledger.offer(SLOT, [POOL], skip=["w1"])  # offered to w2
    view = stored.view("w1")
    assert view.others == ledger.others("w1")
    assert view.others.counts == {SLOT: 2}  # w2's one, and the one offered to it
    assert view.gifts == 3
    assert stored.view("w2").gifts == 0


class Commands:
    """A store connection that records each script run and answers from a list."""

    def __init__(self, *answers: object) -> None:
        self.calls: list[tuple[list[str], list[Any]]] = []
        self.answers = list(answers)

    def eval(
        self, script: str, keys: Sequence[str] = (), args: Sequence[Any] = ()
    ) -> Deferred[Any]:
        assert script == LEDGER_SCRIPT
        self.calls.append((list(keys), list(args)))
        return succeed(self.answers.pop(0) if self.answers else 0)


def result(d: Deferred[Any]) -> Any:
    found: list[Any] = []
    d.addBoth(found.append)
    return found[0]


def test_each_call_is_one_run_of_the_script_with_its_keys() -> None:
    commands = Commands(0, 1, "w2", 0, "", 0)
    ledger = StoreLedger(commands, lease=10.0, offer_time=2.0)
    result(ledger.report("w1", Holding({SLOT: 1})))
    assert result(ledger.beat("w1")) is True
    assert result(ledger.give("w1", SLOT, [POOL, HOME], 3)) == "w2"
    assert result(ledger.answer("w1", "17", took=False)) == 0
    assert result(ledger.give("w1", SLOT, [POOL], 4)) is None  # nobody waits for it
    assert result(ledger.beat("w1")) is False  # the store no longer knows it
    keys = [PREFIX + k for k in ("leases", "reports", "offers", "deadlines", "gifts", "offer-ids")]
    assert all(k == keys for k, _ in commands.calls)
    ops = [args[:4] for _, args in commands.calls]
    assert ops == [["report", PREFIX, 2000, "w1"], ["beat", PREFIX, 2000, "w1"],
                   ["give", PREFIX, 2000, "w1"], ["answer", PREFIX, 2000, "w1"],
                   ["give", PREFIX, 2000, "w1"], ["beat", PREFIX, 2000, "w1"]]  # fmt: skip
    assert commands.calls[0][1][4:] == [
        10_000,
        '{"counts":{"[\\"gpu-a\\",\\"qwen3-coder-30b\\"]":1},"heads":{},"flows":{}}',
    ]
    assert commands.calls[2][1][4:] == [
        '["gpu-a","qwen3-coder-30b"]',
        '["[\\"lab\\",\\"qwen3-coder-30b\\"]", "[\\"lab\\",\\"qwen3-coder-30b\\",\\"gpu-a\\"]"]',
        3,
    ]
    assert commands.calls[3][1][4:] == ["17", "0"]


def test_the_channels_are_named_for_crossbar() -> None:
    assert changes_channel() == "crossbar:changed"
    assert offers_channel("vm pid 7") == "crossbar:offer:vm pid 7"


def test_a_store_holding_too_much_is_read_only_as_far_as_its_bounds() -> None:
    """Anything may be written there: a report of megabytes is left out, and no more than
    :data:`MOST_MEMBERS` members are read."""
    huge = json.dumps({"counts": {}, "heads": {}, "flows": {"x" * 10: 1}, "pad": "y" * MOST_REPORT})
    assert load_stored(huge) is None
    many = [x for n in range(MOST_MEMBERS + 50) for x in (f"m{n}", dump_stored(Holding()))]
    assert len(load_state([many, [], []]).reports) == MOST_MEMBERS
