"""crossbar.pages.times: times as the pages show them."""

from __future__ import annotations

from crossbar.pages.times import ago, duration, rfc3339, short_seconds


def test_times_read_as_a_person_reads_them() -> None:
    assert rfc3339(0.5) == "1970-01-01T00:00:00.500Z" and rfc3339(None) is None
    assert (ago(3.9), ago(250), ago(7300)) == ("3 s ago", "4 min ago", "2 h ago")
    assert (duration(42), duration(11520), duration(190800)) == ("42 s", "3 h 12 min", "2 d 5 h")
    assert (short_seconds(0.00045), short_seconds(0.042), short_seconds(1.5)) == (
        "0.45 ms",
        "42 ms",
        "1.5 s",
    )
