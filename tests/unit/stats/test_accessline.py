"""crossbar.stats.accessline: the access log's one line per request, and what a client sent
made fit for it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossbar.stats import accessline
from crossbar.stats.accessline import access_line, printable
from crossbar.stats.record import refused_record


@pytest.mark.parametrize(
    ("raw", "limit", "text"),
    [
        (b"/opencdoe/v1/chat/completions", 200, "/opencdoe/v1/chat/completions"),
        (b"/a\x00b\xff\r\n c", 200, "/a\\x00b\\xff\\x0d\\x0a\\x20c"),
        (b"/" + b"x" * 300, 20, "/" + "x" * 16 + "..."),
        (b"\x01" * 300, 20, "\\x01" * 4 + "\\..."),
        (b"", 10, ""),
    ],
)
def test_printable_makes_one_log_line_of_anything(raw: bytes, limit: int, text: str) -> None:
    assert printable(raw, limit) == text


def test_printable_says_the_same_when_it_remembers_and_forgets_what_it_made() -> None:
    """What comes again (a method, a path) is remembered; a shorter limit still cuts it,
    and a client that sends ever new paths only makes the table start again."""
    for raw in (b"/v1/\x00models", b"POST", b"/x" * 5):
        first = printable(raw, 200)
        assert printable(raw, 200) == first
        assert printable(raw, 8) == (first if len(first) <= 8 else first[:5] + "...")
    for n in range(accessline.SHOWN_KEPT * 3):
        assert printable(b"/p%d\x7f" % n, 200) == f"/p{n}\\x7f"
        assert len(accessline._SHOWN) <= accessline.SHOWN_KEPT


@given(st.binary(max_size=80), st.integers(min_value=4, max_value=300))
@settings(max_examples=300)
def test_printable_is_the_same_whether_or_not_it_was_seen(raw: bytes, limit: int) -> None:
    """Asked twice, with limits in any order: the text a fresh table would make."""
    accessline._SHOWN.clear()
    fresh = printable(raw, limit)
    printable(raw, 300)
    assert printable(raw, limit) == fresh


def test_a_refusal_s_line_says_why() -> None:
    """The words the client got, never the key it sent."""
    record = refused_record(401, b"POST", b"/lab/v1/chat/completions", "unauthorized: no key sent")
    assert access_line(record) == (
        "- - POST /lab/v1/chat/completions 401 0ms (unauthorized: no key sent)"
    )
