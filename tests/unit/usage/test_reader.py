"""What an answer reports of its work, read as it streams by (crossbar.usage.reader)."""

from __future__ import annotations

import json
import time
import tracemalloc
from typing import Any

import pytest

from crossbar.usage.counts import CEILING, Bounds
from crossbar.usage.reader import MAX_BODY, MAX_EVENT, TAIL, AnswerReader, TokenUsage

TIMINGS = {
    "cache_n": 1685,
    "prompt_n": 76,
    "prompt_ms": 8.25,
    "prompt_per_token_ms": 0.108,
    "prompt_per_second": 9212.1,
    "predicted_n": 3,
    "predicted_ms": 30.0,
    "predicted_per_token_ms": 10.0,
    "predicted_per_second": 100.0,
}
OAI_USAGE = {
    "completion_tokens": 3,
    "prompt_tokens": 1761,
    "total_tokens": 1764,
    "prompt_tokens_details": {"cached_tokens": 1685},
}
CHUNK = {"created": 1, "id": "chatcmpl-1", "model": "tiny-a", "system_fingerprint": "b1"}
CHUNK |= {"object": "chat.completion.chunk"}


def data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def event(name: str, obj: Any) -> bytes:
    return f"event: {name}\n".encode() + data(obj)


def delta(d: dict[str, Any], finish: str | None = None, **top: Any) -> bytes:
    return data({"choices": [{"finish_reason": finish, "index": 0, "delta": d}], **CHUNK, **top})


def chat_stream(include_usage: bool = False) -> bytes:
    end = [delta({}, "stop")]
    if include_usage:
        end.append(data({"choices": [], **CHUNK, "usage": OAI_USAGE, "timings": TIMINGS}))
    else:
        end = [delta({}, "stop", timings=TIMINGS)]
    return b"".join(
        [
            b": ping\n\n",
            delta({"role": "assistant", "content": None}),
            delta({"content": ""}),
            delta({"reasoning_content": "hm"}),
            delta({"content": "Hi"}),
            delta({"content": "!"}),
            *end,
            b"data: [DONE]\n\n",
        ]
    )


def completion(text: str, finish: str | None = None, **top: Any) -> bytes:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    return data({"choices": [choice], **CHUNK, "object": "text_completion", **top})


COMPLETION_STREAM = b"".join(
    [
        b": ping\n\n",
        completion(""),
        completion("Hel"),
        completion("lo"),
        completion("", "stop", usage=OAI_USAGE, timings=TIMINGS),
        b"data: [DONE]\n\n",
    ]
)

ANTHROPIC_START = {
    "type": "message_start",
    "message": {
        "id": "chatcmpl-1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "tiny-a",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"cache_read_input_tokens": 1685, "input_tokens": 76, "output_tokens": 0},
    },
}


def block_delta(text: str) -> bytes:
    body = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }
    return event("content_block_delta", body)


ANTHROPIC_STREAM = b"".join(
    [
        b": ping\n\n",
        event("message_start", ANTHROPIC_START),
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        block_delta("Hel"),
        block_delta("lo"),
        block_delta("!"),
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        ),
        event("message_stop", {"type": "message_stop"}),
    ]
)
ANTHROPIC_BODY = {
    "id": "chatcmpl-1",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "Hello!"}],
    "model": "tiny-a",
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"cache_read_input_tokens": 1685, "input_tokens": 76, "output_tokens": 3},
}
RESP_USAGE = {
    "input_tokens": 1761,
    "output_tokens": 3,
    "total_tokens": 1764,
    "input_tokens_details": {"cached_tokens": 1685},
}


def responses_stream(text: str = "Hello!") -> bytes:
    state = {"id": "resp_1", "object": "response", "status": "in_progress"}
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    item = {"type": "message", "status": "completed", "id": "msg_1", "content": [part]}
    done = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed"}
    done |= {"model": "tiny-a", "output": [item | {"role": "assistant"}], "usage": RESP_USAGE}
    added = {"content": [], "id": "msg_1", "role": "assistant", "status": "in_progress"}
    return b"".join(
        [
            event("response.created", {"type": "response.created", "response": state}),
            event("response.in_progress", {"type": "response.in_progress", "response": state}),
            b": ping\n\n",
            event(
                "response.output_item.added",
                {"type": "response.output_item.added", "item": added | {"type": "message"}},
            ),
            event(
                "response.content_part.added",
                {
                    "type": "response.content_part.added",
                    "item_id": "msg_1",
                    "part": {"type": "output_text", "text": ""},
                },
            ),
            *(
                event(
                    "response.output_text.delta",
                    {"type": "response.output_text.delta", "item_id": "msg_1", "delta": piece},
                )
                for piece in (text[:3], text[3:], "")
            ),
            event(
                "response.output_text.done",
                {"type": "response.output_text.done", "item_id": "msg_1", "text": text},
            ),
            event("response.completed", {"type": "response.completed", "response": done}),
        ]
    )


RESPONSES_BODY = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
RESPONSES_BODY |= {"usage": RESP_USAGE}
CHAT_BODY = {
    "choices": [
        {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "Hi!"}}
    ],
    **CHUNK,
    "object": "chat.completion",
    "usage": OAI_USAGE,
    "timings": TIMINGS,
}

HOST = TokenUsage(prompt=1761, cached=1685, generated=3, prefill_ms=8.25, tokens_per_second=100.0)
"""What the host reported for every answer above (timings for chat and completions only)."""
NO_TIMINGS = TokenUsage(
    prompt=1761, cached=1685, generated=3, prefill_ms=None, tokens_per_second=None
)

# (api, streamed, body, the Usage read, the index of the first content event)
ANSWERS = [
    ("chat", True, chat_stream(), HOST, 3),
    ("chat", True, chat_stream(include_usage=True), HOST, 3),
    ("chat", False, json.dumps(CHAT_BODY).encode(), HOST, None),
    ("completion", True, COMPLETION_STREAM, HOST, 2),
    (
        "completion",
        False,
        json.dumps(CHAT_BODY | {"object": "text_completion"}).encode(),
        HOST,
        None,
    ),
    ("anthropic", True, ANTHROPIC_STREAM, NO_TIMINGS, 3),
    ("anthropic", False, json.dumps(ANTHROPIC_BODY).encode(), NO_TIMINGS, None),
    ("responses", True, responses_stream(), NO_TIMINGS, 5),
    ("responses", False, json.dumps(RESPONSES_BODY).encode(), NO_TIMINGS, None),
]
IDS = [f"{api}-{'streamed' if streamed else 'body'}" for api, streamed, *_ in ANSWERS]
IDS[1] += "-include-usage"


def read(api: str, streamed: bool, pieces: list[bytes], now: Any = None) -> AnswerReader:
    reader = AnswerReader(api, streamed, now or (lambda: 5.0))
    for piece in pieces:
        reader.feed(piece)
    return reader


@pytest.mark.parametrize(("api", "streamed", "body", "expected", "first"), ANSWERS, ids=IDS)
def test_each_api_reports_its_prompt_cache_hits_and_generated_tokens(
    api: str, streamed: bool, body: bytes, expected: TokenUsage, first: int | None
) -> None:
    reader = read(api, streamed, [body])
    assert reader.usage() == expected
    assert reader.first_content_event == first
    assert reader.first_content == (None if first is None else 5.0)


@pytest.mark.parametrize(("api", "streamed", "body", "expected", "first"), ANSWERS, ids=IDS)
def test_any_split_of_the_body_reads_the_same(
    api: str, streamed: bool, body: bytes, expected: TokenUsage, first: int | None
) -> None:
    for at in range(len(body) + 1):
        reader = read(api, streamed, [body[:at], body[at:]])
        assert (reader.usage(), reader.first_content_event) == (expected, first), at
    one_by_one = read(api, streamed, [body[i : i + 1] for i in range(len(body))])
    assert (one_by_one.usage(), one_by_one.first_content_event) == (expected, first)


def test_crlf_lines_read_as_lf() -> None:
    body = ANTHROPIC_STREAM.replace(b"\n", b"\r\n")
    assert read("anthropic", True, [body]).usage() == NO_TIMINGS


def test_time_to_first_token_is_the_first_content_not_pings_or_a_role() -> None:
    clock = iter(range(100))
    reader = AnswerReader("chat", True, lambda: float(next(clock)))
    for piece in chat_stream().split(b"\n\n")[:-1]:
        reader.feed(piece + b"\n\n")
        if b"reasoning_content" in piece:
            break
        assert reader.first_content is None, piece
    assert reader.first_content == 0.0
    assert reader.first_content_event == 3


def test_anthropic_speed_is_measured_from_first_content_to_the_streams_end() -> None:
    times = iter([10.0, 11.0, 12.0])
    reader = AnswerReader("anthropic", True, lambda: next(times))
    for piece in ANTHROPIC_STREAM.split(b"\n\n")[:-1]:
        reader.feed(piece + b"\n\n")  # the first content at 10.0; no chunk after asks the time
    usage = reader.usage()  # at the end: 11.0
    # three tokens: the first at 10.0, the last by 11.0: two more in one second
    assert (reader.first_content, reader.last_content) == (10.0, 11.0)
    assert usage.tokens_per_second == 2.0
    assert next(times) == 12.0  # nothing else asked the time


def test_a_responses_answer_longer_than_the_tail_still_reports_its_usage() -> None:
    text = "x" * (4 * TAIL)
    reader = read("responses", True, [responses_stream(text)])
    assert reader.usage() == NO_TIMINGS
    fork = responses_stream(text).replace(b'"total_tokens":1764}}}', b'"total_tokens":1764}},')
    fork = fork[:-3] + b'"timings":' + json.dumps(TIMINGS).encode() + b"}\n\n"
    assert read("responses", True, [fork]).usage() == HOST


HOSTILE = [-5, 10**20, 10**9 + 1, "1761", 1761.5, {"n": 1761}, [1761], True]


@pytest.mark.parametrize("value", HOSTILE, ids=[repr(v) for v in HOSTILE])
def test_bad_numbers_are_ignored_and_counted(value: Any) -> None:
    usage = OAI_USAGE | {"prompt_tokens": value}
    timings = TIMINGS | {"prompt_n": value, "prompt_ms": -1.0 if value == -5 else str(value)}
    body = json.dumps(CHAT_BODY | {"usage": usage, "timings": timings}).encode()
    got = read("chat", False, [body]).usage()
    # prompt_tokens, prompt_n and prompt_ms bad: the prompt is unknown, the rest still read
    assert (got.prompt, got.prefill_ms) == (None, None)
    assert (got.cached, got.generated, got.tokens_per_second) == (1685, 3, 100.0)
    assert got.bad == 3


def test_absent_and_null_numbers_are_unknown_not_bad() -> None:
    body = json.dumps({"usage": {"prompt_tokens": None}, "timings": {"prompt_ms": 3}}).encode()
    assert read("chat", False, [body]).usage() == TokenUsage(None, None, None, 3.0, None)


@pytest.mark.parametrize(
    "usage",
    [5, "x", [1], {"prompt_tokens_details": 7}, {"prompt_tokens_details": {"cached_tokens": "a"}}],
)
def test_wrongly_nested_usage_is_bad_not_a_crash(usage: Any) -> None:
    body = json.dumps(CHAT_BODY | {"usage": usage, "timings": None}).encode()
    got = read("chat", False, [body]).usage()
    assert got.bad >= 1
    assert got.cached is None


def test_more_cached_than_prompt_tokens_is_bad() -> None:
    usage = OAI_USAGE | {"prompt_tokens_details": {"cached_tokens": 5000}}
    body = json.dumps({"usage": usage}).encode()
    got = read("chat", False, [body]).usage()
    assert (got.prompt, got.cached, got.bad) == (1761, None, 1)


def test_anthropic_prompt_adds_the_cached_tokens_and_old_hosts_without_them() -> None:
    old = ANTHROPIC_BODY | {"usage": {"input_tokens": 1761, "output_tokens": 3}}
    got = read("anthropic", False, [json.dumps(old).encode()]).usage()
    assert (got.prompt, got.cached, got.generated) == (1761, None, 3)


def test_a_cut_anthropic_stream_does_not_report_zero_generated() -> None:
    cut = ANTHROPIC_STREAM[: ANTHROPIC_STREAM.index(b"event: message_delta")]
    got = read("anthropic", True, [cut]).usage()
    assert (got.prompt, got.cached, got.generated) == (1761, 1685, None)


def test_garbage_is_unknown_and_counted() -> None:
    got = read("chat", True, [b"data: {not json\n\n", delta({"content": "x"}), b"data: [1,\n\n"])
    # After the first content only events that carry usage are read: "[1," is not one.
    assert got.usage() == TokenUsage(None, None, None, None, None, bad=1)
    late = b'data: {"usage": [1,\n\n'
    got = read("chat", True, [b"data: {not json\n\n", delta({"content": "x"}), late])
    assert got.usage() == TokenUsage(None, None, None, None, None, bad=2)
    assert read("chat", False, [b"<html>502</html>"]).usage().bad == 1


def test_a_huge_event_is_skipped_within_the_cap() -> None:
    huge = b"data: " + b"x" * (1024 * 1024) + b"\n\n"
    body = huge + chat_stream()
    tracemalloc.start()
    try:
        reader = AnswerReader("chat", True, lambda: 1.0)
        for at in range(0, len(body), 4096):
            reader.feed(body[at : at + 4096])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_EVENT + 64 * 1024, peak
    assert reader.usage() == TokenUsage(1761, 1685, 3, 8.25, 100.0, bad=1)
    assert reader.first_content_event == 4


def test_a_body_past_the_cap_is_unknown() -> None:
    body = json.dumps(CHAT_BODY | {"pad": "x" * MAX_BODY}).encode()
    got = read("chat", False, [body[:1000], body[1000:]]).usage()
    assert got == TokenUsage(None, None, None, None, None, bad=1)


def test_an_unknown_api_reads_nothing() -> None:
    reader = read("embeddings", True, [chat_stream(include_usage=True)])
    assert reader.usage() == TokenUsage(None, None, None, None, None)
    assert reader.first_content is None


def test_cost_per_chunk_after_the_first_content() -> None:
    chunks = [delta({"content": f"t{i}"}) for i in range(10_000)]

    def run(feed: Any) -> float:
        start = time.perf_counter()
        for chunk in chunks:
            feed(chunk)
        return (time.perf_counter() - start) / len(chunks)

    def nothing(data: bytes) -> None:
        pass

    best_reader = best_nothing = 1.0
    for _ in range(3):
        head = b"".join(piece + b"\n\n" for piece in chat_stream().split(b"\n\n")[:4])
        reader = read("chat", True, [head])
        assert reader.first_content is not None
        best_reader = min(best_reader, run(reader.feed))
        best_nothing = min(best_nothing, run(nothing))
    print(
        f"per chunk after the first content: {best_reader * 1e9:.0f} ns "
        f"(a do-nothing feed: {best_nothing * 1e9:.0f} ns)"
    )
    assert best_reader < 20e-6


STREAMS = [
    ("chat", chat_stream()),
    ("chat", chat_stream(include_usage=True)),
    ("completion", COMPLETION_STREAM),
    ("anthropic", ANTHROPIC_STREAM),
    ("responses", responses_stream()),
    ("responses", responses_stream("x" * (3 * TAIL))),  # its last event longer than the tail
]


@pytest.mark.parametrize(("api", "body"), STREAMS)
def test_a_stream_is_whole_once_its_last_event_is_relayed_and_not_before(
    api: str, body: bytes
) -> None:
    """A client that leaves once it has the last event (Codex closes at once) had its
    whole answer; one that leaves a byte before did not."""
    assert read(api, True, [body]).whole()
    assert read(api, True, [body.replace(b"\n", b"\r\n")]).whole()
    assert not read(api, True, [body[:-1]]).whole()
    events = body.split(b"\n\n")
    assert not read(api, True, [b"\n\n".join(events[:-2]) + b"\n\n"]).whole()
    assert read(api, True, [body[i : i + 7] for i in range(0, len(body), 7)]).whole()


def test_a_stream_with_no_content_is_whole_at_its_last_event() -> None:
    assert read("chat", True, [delta({"role": "assistant"}), b"data: [DONE]\n\n"]).whole()
    assert not read("chat", True, [delta({"role": "assistant"})]).whole()


def test_an_answer_not_streamed_is_never_whole_by_its_events() -> None:
    assert not read("chat", False, [json.dumps(CHAT_BODY).encode()]).whole()


def relay(reader: AnswerReader, pieces: list[bytes]) -> int:
    """Feed ``pieces`` as the relay does (``StreamBody``): each to ``feed``, and ``trim``
    once the bytes relayed pass ``due``; the most bytes the tail held meanwhile."""
    sent = most = 0
    for piece in pieces:
        sent += len(piece)
        reader.feed(piece)
        if sent > reader.due:
            reader.trim(sent)
        most = max(most, sum(map(len, reader._tail)))
    return most


LONG = (  # 140 KB: trimmed some eighty times
    delta({"role": "assistant"})
    + b"".join(delta({"content": f"token {i} "}) for i in range(2_000))
    + delta({}, "stop", usage={"prompt_tokens": 9, "completion_tokens": 2_000}, timings=TIMINGS)
    + b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(("api", "body"), [*STREAMS, ("chat", LONG)])
@pytest.mark.parametrize("size", [7, 100, 4096, 70_000])
def test_the_relay_trims_the_tail_and_reads_what_feeding_it_all_reads(
    api: str, body: bytes, size: int
) -> None:
    """Kept by a bare append and trimmed by the relay every TAIL bytes, the tail holds at
    most 2 * TAIL bytes and a chunk, and tells the same usage and end as the whole stream."""
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    whole = read(api, True, [body])
    trimmed = AnswerReader(api, True, lambda: 5.0)
    most = relay(trimmed, pieces)
    assert most <= 2 * TAIL + size
    assert trimmed.whole() == whole.whole()
    assert trimmed.usage() == whole.usage()


# -- a hostile host's numbers, bounded by what is plausible (audit 3, finding 15) ----------

HUGE = 10**9  # a sound integer, believed and charged to the key before


def test_a_host_s_billion_tokens_are_dropped_and_said_in_one_line() -> None:
    lines: list[str] = []
    usage = OAI_USAGE | {"prompt_tokens": HUGE, "completion_tokens": HUGE}
    timings = TIMINGS | {"prompt_n": HUGE, "predicted_n": HUGE}
    body = json.dumps(CHAT_BODY | {"usage": usage, "timings": timings}).encode()
    reader = AnswerReader("chat", False, lambda: 5.0, said=lines.append)
    reader.feed(body)
    got = reader.usage()
    assert (got.prompt, got.cached, got.generated) == (None, None, None)
    assert got.bad == 2
    assert lines == [
        "usage dropped as implausible: prompt_tokens 1,000,000,000 over 10,000,000 "
        "(crossbar's ceiling); completion_tokens 1,000,000,000 over 10,000,000 "
        "(crossbar's ceiling)"
    ]
    reader.usage()
    assert len(lines) == 1  # said once


def test_anthropic_counts_past_the_host_s_window_are_dropped() -> None:
    usage = {"input_tokens": 30_000, "cache_read_input_tokens": 30_000, "output_tokens": 12}
    body = json.dumps(ANTHROPIC_BODY | {"usage": usage}).encode()
    reader = AnswerReader("anthropic", False, bounds=Bounds.of(window=32_768, max_tokens=16))
    reader.feed(body)
    got = reader.usage()
    assert (got.prompt, got.cached, got.generated, got.bad) == (None, None, 12, 1)


@pytest.mark.parametrize(
    ("generated", "kept"), [(100, 100), (164, 164), (165, None)], ids=["asked", "margin", "past"]
)
def test_generated_tokens_are_believed_up_to_max_tokens_and_a_margin(
    generated: int, kept: int | None
) -> None:
    usage = OAI_USAGE | {"completion_tokens": generated}
    body = json.dumps(CHAT_BODY | {"usage": usage}).encode()
    reader = AnswerReader("chat", False, bounds=Bounds.of(window=4096, max_tokens=100))
    reader.feed(body)
    got = reader.usage()
    assert (got.prompt, got.generated) == (1761, kept)


def test_bounds_of_a_request_that_says_nothing_are_the_ceiling() -> None:
    assert Bounds.of() == Bounds() == Bounds(CEILING, CEILING)
    assert Bounds.of(window=0, max_tokens=-1) == Bounds()
    assert Bounds.of(max_tokens=32_000).generated == 32_000 + 3_200
