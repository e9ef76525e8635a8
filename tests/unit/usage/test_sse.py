"""Server-sent events as bytes: an event's fields, and the events of a stream's tail that
carry usage, found by their keys (checked against reading every event, at every cut)."""

from __future__ import annotations

import json

from crossbar.usage.sse import events_with, fields, trailing_objects

KEYS = (b'"usage"', b'"timings"')


def chunk(**data: object) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


STREAM = (
    b"event: message_start\n" + chunk(type="message_start", message={"usage": {"input_tokens": 9}})
    + b": ping\n\n"
    + b"".join(chunk(choices=[{"delta": {"content": f"t{i}"}}]) for i in range(6))
    + chunk(choices=[], usage={"prompt_tokens": 12, "completion_tokens": 6})
    + chunk(choices=[], timings={"prompt_n": 8, "cache_n": 4}, usage={"completion_tokens": 6})
    + b"data: [DONE]\n\n"
)  # fmt: skip


def every_event(tail: bytes) -> list[tuple[int, bytes]]:
    """What :func:`events_with` finds, the slow way: every event, read."""
    found, at = [], 0
    for event in tail.split(b"\n\n"):
        if any(key in event for key in KEYS):
            found.append((at, event))
        at += len(event) + 2
    return found


def test_the_events_with_usage_are_found_in_order_each_once() -> None:
    found = list(events_with(STREAM, KEYS))
    assert [fields(event)[1][:24] for _, event in found] == [
        b'{"type":"message_start",',
        b'{"choices":[],"usage":{"',
        b'{"choices":[],"timings":',  # both keys: one event
    ]
    assert found == every_event(STREAM)


def test_a_tail_cut_anywhere_finds_what_reading_every_event_finds() -> None:
    for at in range(len(STREAM) + 1):
        tail = STREAM[at:]
        assert list(events_with(tail, KEYS)) == every_event(tail), at


def test_the_first_event_of_a_cut_tail_starts_at_zero() -> None:
    tail = STREAM[STREAM.index(b'"usage":{"prompt') - 5 :]
    (start, first), *_ = events_with(tail, KEYS)
    assert start == 0 and first.startswith(b'":[],"usage"')


def test_a_tail_without_usage_has_no_events_to_read() -> None:
    assert list(events_with(b"".join(chunk(choices=[]) for _ in range(3)), KEYS)) == []
    assert list(events_with(b"", KEYS)) == []


def test_fields_join_data_lines_and_read_the_name() -> None:
    assert fields(b'event: message_delta\ndata: {"a":1}') == (b"message_delta", b'{"a":1}')
    assert fields(b"data:one\ndata: two\n: a comment") == (b"", b"one\ntwo")
    assert fields(b": ping") == (b"", b"")


def test_trailing_objects_are_the_last_of_each_key_in_a_cut_event() -> None:
    usage = b'{"input_tokens":5,"input_tokens_details":{"cached_tokens":2}}'
    cut = b'xt":"usage is high"},"usage":' + usage + b"}"
    assert dict(trailing_objects(cut)) == {b"usage": usage}
    both = b'"usage":{"a":1},"timings":{"prompt_n":3},"usage":{"b":2}}'
    assert dict(trailing_objects(both)) == {b"usage": b'{"b":2}', b"timings": b'{"prompt_n":3}'}
    assert list(trailing_objects(b'"usage": 5')) == []
