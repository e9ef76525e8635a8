"""crossbar.testing.simulator.completions: how long a simulated answer is, where its token
limit comes from, and the OpenAI shapes of the whole answer and of its SSE events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.testing.simulator.completions import NATURAL, Reply, natural_length, text, token_limit
from crossbar.testing.simulator.replies import BUILD_INFO

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def reply(body: dict[str, Any], chunks: int | None = 3, chat: bool = True) -> Reply:
    return Reply.to(
        body,
        chat=chat,
        model="m",
        created=1,
        chunks=chunks,
        pace=0.05,
        cache_n=4,
        prompt_n=6,
        prompt_ms=12.0,
    )


def events(stream: Any) -> list[Any]:
    out = []
    for _, data in stream:
        assert data.startswith(b"data: ") and data.endswith(b"\n\n")
        payload = data[6:-2]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


def test_text_is_the_alphabet_from_an_offset() -> None:
    assert text(0, 5) == "abcde"
    assert text(24, 4) == "yzab"
    assert len(text(3, 100)) == 100


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        ({}, None),
        ({"max_tokens": 5}, 5),
        ({"n_predict": 2, "max_tokens": 5}, 2),
        ({"max_completion_tokens": 7, "max_tokens": 5}, 7),
        ({"n_predict": "2", "max_tokens": 5}, 5),
        ({"max_tokens": True}, None),
        ({"max_tokens": -1}, None),
        ({"max_tokens": 0}, 0),
    ],
)
def test_the_limit_is_the_first_integer_of_n_predict_max_completion_and_max_tokens(
    body: dict[str, Any], limit: int | None
) -> None:
    assert token_limit(body) == limit


def test_the_same_seed_or_greedy_sampling_gives_the_same_length() -> None:
    seeded = {**CHAT, "seed": 42}
    assert natural_length(seeded, "m") == natural_length(seeded, "m")
    greedy = {**CHAT, "temperature": 0}
    lengths = {natural_length({**greedy, "seed": s}, "m") for s in range(20)}
    assert len(lengths) == 1
    drawn = {natural_length({**CHAT, "seed": s}, "m") for s in range(50)}
    assert len(drawn) > 1
    assert all(NATURAL[0] <= n <= NATURAL[1] for n in drawn | lengths)


def test_an_answer_ends_by_itself_unless_the_limit_is_shorter() -> None:
    stopped = reply({**CHAT, "max_tokens": 10}, chunks=3)
    assert (stopped.tokens, stopped.finish) == (3, "stop")
    cut = reply({**CHAT, "max_tokens": 2}, chunks=3)
    assert (cut.tokens, cut.finish) == (2, "length")
    at = reply({**CHAT, "max_tokens": 3}, chunks=3)
    assert (at.tokens, at.finish) == (3, "length")


def test_usage_and_timings_count_the_prompt_cached_and_generated() -> None:
    r = reply(CHAT, chunks=3)
    assert r.usage == {
        "completion_tokens": 3,
        "prompt_tokens": 10,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert r.timings["cache_n"] == 4 and r.timings["prompt_n"] == 6
    assert r.timings["predicted_n"] == 3
    assert r.timings["predicted_ms"] == pytest.approx(150.0)
    assert r.timings["predicted_per_second"] == pytest.approx(20.0)


def test_the_whole_chat_answer_is_the_text_the_stream_adds_up_to() -> None:
    r = reply(CHAT, chunks=3)
    whole = r.whole(2)
    assert whole["object"] == "chat.completion"
    assert whole["choices"] == [
        {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "abcdef"}}
    ]
    assert whole["system_fingerprint"] == BUILD_INFO
    assert whole["id"].startswith("chatcmpl-")

    streamed = events(r.events(2, with_usage=False))
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in streamed[:-1])
    assert content == "abcdef"


def test_a_chat_stream_has_a_role_a_chunk_a_token_a_finish_and_done() -> None:
    r = reply(CHAT, chunks=2)
    stream = list(r.events(1, with_usage=False))
    assert [paced for paced, _ in stream] == [False, True, True, False, False]
    got = events(stream)
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert got[3]["choices"][0]["finish_reason"] == "stop"
    assert got[3]["timings"] == r.timings
    assert "usage" not in got[3]
    assert got[-1] == "[DONE]"
    assert {e["id"] for e in got[:-1]} == {r.id}


def test_include_usage_adds_a_last_chunk_with_usage_and_timings() -> None:
    r = reply(CHAT, chunks=1)
    got = events(r.events(1, with_usage=True))
    finish, usage, done = got[-3:]
    assert "timings" not in finish
    assert usage["choices"] == [] and usage["usage"] == r.usage and usage["timings"] == r.timings
    assert done == "[DONE]"


def test_a_text_completion_stream_ends_with_usage_in_its_last_chunk() -> None:
    r = reply({"model": "m", "prompt": "hi"}, chunks=2, chat=False)
    got = events(r.events(3, with_usage=False))
    assert [e["choices"][0]["text"] for e in got[:2]] == ["abc", "def"]
    assert got[2]["usage"] == r.usage and got[2]["choices"][0]["finish_reason"] == "stop"
    assert got[-1] == "[DONE]"
    assert r.whole(3)["choices"][0]["text"] == "abcdef"
    assert r.whole(3)["object"] == "text_completion"
