"""crossbar.stats.record: one frozen record per request, and what went unusually in words."""

from __future__ import annotations

import attrs
import pytest

from crossbar.stats.record import Observers, RequestRecord


def test_a_record_is_frozen_and_compared_by_value() -> None:
    record = RequestRecord(route="chat", host="gpu-a", status=200, seconds=1.5, first_byte=0.2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.status = 500  # type: ignore[misc]
    assert record == RequestRecord("chat", "gpu-a", 200, 1.5, 0.2)
    assert attrs.asdict(RequestRecord("-", None, 499, 0.0)) == {
        "route": "-",
        "host": None,
        "status": 499,
        "seconds": 0.0,
        "first_byte": None,
        "sent": 0,
        "model": None,
        "affinity": None,
        "method": None,
        "path": b"-",
        "tried": (),
        "failures": (),
        "cut_off": False,
        "client_left": False,
        "moved_from": None,
        "refused": False,
        "waited": None,
        "shed": None,
        "key": None,
        "prompt_tokens": None,
        "cached_tokens": None,
        "generated_tokens": None,
        "first_token": None,
        "tokens_per_second": None,
        "loads": 0,
        "reason": None,
        "size_note": None,
        "generates": True,
        "asked_model": None,
    }


def test_the_notes_say_what_went_unusually_in_order() -> None:
    assert RequestRecord("r", "a", 200, 1.0).notes() == []
    record = RequestRecord("r", "b", 200, 1.0, tried=("a", "b"), client_left=True, moved_from="a")
    assert record.notes() == ["client left", "tried a, b", "moved from a"]
    # An answer cut off by crossbar is not also one the client left.
    both = RequestRecord("r", "b", 200, 1.0, tried=("b",), cut_off=True, client_left=True)
    assert both.notes() == ["answer cut off"]
    waited = RequestRecord("r", "b", 200, 1.0, waited=2.25)
    assert waited.notes() == ["waited 2250ms for a slot"]


def test_every_observer_is_told_of_every_record_in_turn() -> None:
    seen: list[tuple[str, RequestRecord]] = []

    class Seen:
        def __init__(self, name: str) -> None:
            self.name = name

        def request_done(self, record: RequestRecord) -> None:
            seen.append((self.name, record))

    record = RequestRecord("r", None, 503, 0.1)
    Observers(Seen("metrics"), Seen("log")).request_done(record)
    assert seen == [("metrics", record), ("log", record)]
