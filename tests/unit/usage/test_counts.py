"""crossbar.usage.counts: the numbers a host reports of an answer's work, checked as they
come; anything not a sound number is ignored and counted, never summed."""

from __future__ import annotations

import msgspec
import pytest

from crossbar.usage.counts import MOST_TOKENS, Tally


def test_sound_numbers_are_kept_and_a_later_report_replaces_an_earlier_one() -> None:
    tally = Tally()
    tally.counts(
        msgspec.Raw(b'{"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 8}}')
    )
    tally.counts(msgspec.Raw(b'{"prompt_tokens": 13}'))
    tally.timings(msgspec.Raw(b'{"prompt_ms": 9, "predicted_per_second": 41.5}'))
    assert tally.fields == {
        "prompt_tokens": 13,
        "cached_tokens": 8,
        "prompt_ms": 9,
        "predicted_per_second": 41.5,
    }
    assert tally.bad == 0


@pytest.mark.parametrize(
    "usage",
    [
        b'{"prompt_tokens": -1}',
        b'{"prompt_tokens": 4.0}',
        b'{"prompt_tokens": "4"}',
        b'{"prompt_tokens": true}',
        b'{"prompt_tokens": %d}' % (MOST_TOKENS + 1),
        b'{"prompt_tokens": [1]}',
        b'{"prompt_tokens_details": 3}',
        b"[1, 2]",
        b"not json",
    ],
)
def test_a_number_that_is_not_sound_is_ignored_and_counted(usage: bytes) -> None:
    tally = Tally()
    tally.counts(msgspec.Raw(usage))
    assert tally.fields == {} and tally.bad == 1


def test_absent_and_null_are_unknown_not_bad() -> None:
    tally = Tally()
    tally.counts(msgspec.Raw(b'{"prompt_tokens": null}'))
    tally.counts(None)
    tally.timings(msgspec.Raw(b"null"))
    assert tally.fields == {} and tally.bad == 0
