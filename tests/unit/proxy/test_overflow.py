"""crossbar.proxy.overflow and crossbar.proxy.refusalbody: a host's refusal of a prompt
longer than its slot, recognised from its body, held back from the client until it is known."""

from __future__ import annotations

import pytest

from crossbar.proxy.overflow import MAX_REFUSAL_BYTES, Overflow, may_be_refusal, read_overflow
from tests.support.refusals import REAL


def test_a_real_refusal_is_read_with_the_host_s_own_numbers() -> None:
    assert read_overflow(400, REAL) == Overflow(prompt_tokens=3528, window=2048)
    assert may_be_refusal(400, len(REAL)) and may_be_refusal(400, None)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, REAL),
        (400, b'{"error":{"code":400,"message":"model is not loaded","type":"not_found"}}'),
        (400, REAL.replace(b"3528,", b'"3528",')),
        (400, REAL.replace(b"2048}", b"0}")),
        (400, REAL.replace(b"2048}", b"1e3}")),
        (400, REAL.replace(b"3528,", b"true,")),
        (400, b'{"error":"exceed_context_size_error"}'),
        (400, b"not json"),
        (400, b"[" * 5000),
        (400, REAL[:-1] + b',"pad":"' + b"x" * MAX_REFUSAL_BYTES + b'"}'),
    ],
)
def test_anything_else_is_not_a_refusal(status: int, body: bytes) -> None:
    assert read_overflow(status, body) is None


def test_a_long_or_other_answer_is_never_held_for_it() -> None:
    assert not may_be_refusal(400, MAX_REFUSAL_BYTES + 1)
    assert not may_be_refusal(200, 10)
