"""The simulated llama-server speaks Anthropic's Messages API (Claude Code) and OpenAI's
Responses API (Codex) as the real one does: its event names, field names, usage and errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
from treq.testing import StubTreq

from crossbar.testing import SimulatedHost

TWO_MODELS = {"tiny-a": "loaded", "tiny-b": "unloaded"}
BILLING = "x-anthropic-billing-header: cc_version=2.1.328.abc; cc_entrypoint=sdk-cli; cch={};"
BASH = {
    "name": "Bash",
    "description": "run a command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"],
    },
}
SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "array"}, "workdir": {"type": "string"}},
        "required": ["cmd", "workdir"],
    },
}


def events(body: bytes) -> list[tuple[str, Any]]:
    """``(name, data)`` of every ``event:`` / ``data:`` pair; anything else fails."""
    parsed = []
    blocks = body.split(b"\n\n")
    assert blocks[-1] == b"", body[-200:]
    for block in blocks[:-1]:
        name, data = block.split(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: "), block
        payload = json.loads(data[len(b"data: ") :])
        assert payload["type"] == name[len(b"event: ") :].decode()
        parsed.append((payload["type"], payload))
    return parsed


def anthropic(cch: str = "a1b2c", **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny-a",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": BILLING.format(cch)},
            {"type": "text", "text": "Be brief."},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "say hi"}]}],
        **extra,
    }


def responses(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny-a",
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        ],
        **extra,
    }


async def post(sim: SimulatedHost, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    stub = StubTreq(sim.resource)
    response = await stub.post("http://sim" + path, json=body)
    return response.code, await stub.content(response)


# -- Anthropic Messages -------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_messages_stream_has_anthropics_events_and_ends_by_itself() -> None:
    sim = SimulatedHost(TWO_MODELS)
    code, body = await post(sim, "/v1/messages?beta=true", anthropic(stream=True))
    assert code == 200 and b"[DONE]" not in body
    got = events(body)
    names = [name for name, _ in got]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [data["delta"] for name, data in got if name == "content_block_delta"]
    assert 8 <= len(deltas) <= 60  # an answer that ends by itself, not at max_tokens 32000
    assert "".join(d["text"] for d in deltas) == ("abcdefghijklmnopqrstuvwxyz" * 3)[: len(deltas)]
    assert {d["type"] for d in deltas} == {"text_delta"}
    message = got[0][1]["message"]
    assert message["id"].startswith("chatcmpl-") and message["model"] == "tiny-a"
    assert message["role"] == "assistant" and message["content"] == []
    assert got[1][1]["content_block"] == {"type": "text", "text": ""}
    end = got[-2][1]
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert end["usage"] == {"output_tokens": len(deltas)}
    usage = message["usage"]
    assert usage["cache_read_input_tokens"] == 0 and usage["output_tokens"] == 0
    assert usage["input_tokens"] == sim.prefills[0].prompt_n


@pytest_twisted.ensureDeferred
async def test_messages_usage_leaves_the_cached_tokens_out_of_input_tokens() -> None:
    """Claude Code's billing header changes its ``cch=`` each request: llama-server rewrites
    it, so the second turn still reuses the first one's prompt."""
    sim = SimulatedHost(TWO_MODELS)
    opening = anthropic("a1b2c")
    opening["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    first = json.loads((await post(sim, "/v1/messages", opening))[1])
    # Claude Code moves its cache_control mark to the newest message: no template renders it.
    turn = anthropic("9f8e7")
    marked = {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}}
    turn["messages"] += [
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": [marked]},
    ]
    code, body = await post(sim, "/v1/messages", turn)
    usage = json.loads(body)["usage"]
    prefill = sim.prefills[1]
    assert code == 200 and prefill.cache_n >= sim.prefills[0].prompt_n - 1  # all of turn one
    assert usage["cache_read_input_tokens"] == prefill.cache_n
    assert usage["input_tokens"] == prefill.prompt_n  # without the cached ones


@pytest_twisted.ensureDeferred
async def test_messages_whole_answer_and_its_limit() -> None:
    sim = SimulatedHost(TWO_MODELS, chunks=8)
    code, body = await post(sim, "/v1/messages", anthropic(max_tokens=5))
    answer = json.loads(body)
    assert code == 200
    assert list(answer) == [
        "id",
        "type",
        "role",
        "content",
        "model",
        "stop_reason",
        "stop_sequence",
        "usage",
    ]
    assert answer["type"] == "message" and answer["content"] == [{"type": "text", "text": "abcde"}]
    assert answer["stop_reason"] == "max_tokens" and answer["usage"]["output_tokens"] == 5


@pytest_twisted.ensureDeferred
async def test_messages_forced_tool_answers_a_tool_use() -> None:
    sim = SimulatedHost(TWO_MODELS)
    forced = anthropic(tools=[BASH], tool_choice={"type": "tool", "name": "Bash"})
    answer = json.loads((await post(sim, "/v1/messages", forced))[1])
    (block,) = answer["content"]
    assert block["type"] == "tool_use" and block["name"] == "Bash" and block["id"]
    assert block["input"] == {"command": "abcdefgh"}
    assert answer["stop_reason"] == "tool_use"
    _, body = await post(sim, "/v1/messages", {**forced, "stream": True})
    got = events(body)
    block = got[1][1]["content_block"]
    assert block == {"type": "tool_use", "id": block["id"], "name": "Bash"} and block["id"]
    parts = [d["delta"] for n, d in got if n == "content_block_delta"]
    assert {p["type"] for p in parts} == {"input_json_delta"}
    assert json.loads("".join(p["partial_json"] for p in parts)) == {"command": "abcdefgh"}
    assert got[-2][1]["delta"]["stop_reason"] == "tool_use"
    # "any" leaves the choice to the model: the simulator calls the first tool.
    anyone = anthropic(tools=[BASH], tool_choice={"type": "any"})
    assert json.loads((await post(sim, "/v1/messages", anyone))[1])["content"][0]["name"] == "Bash"


# -- OpenAI Responses ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_responses_stream_has_openais_events_and_usage() -> None:
    sim = SimulatedHost(TWO_MODELS, chunks=6)
    code, body = await post(sim, "/v1/responses", responses(stream=True))
    assert code == 200 and b"[DONE]" not in body
    got = events(body)
    names = [name for name, _ in got]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 6,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(d["delta"] for n, d in got if n == "response.output_text.delta")
    assert text == "abcdef"
    done = got[-1][1]["response"]
    assert done["status"] == "completed" and done["id"] == got[0][1]["response"]["id"]
    assert done["id"].startswith("resp_") and done["model"] == "tiny-a"
    (item,) = done["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == "abcdef"
    prefill = sim.prefills[0]
    assert done["usage"] == {
        "input_tokens": prefill.cache_n + prefill.prompt_n,  # the cached ones included
        "output_tokens": 6,
        "total_tokens": prefill.cache_n + prefill.prompt_n + 6,
        "input_tokens_details": {"cached_tokens": prefill.cache_n},
    }
    # The same conversation again: its prompt is found in the cache.
    again = json.loads((await post(sim, "/v1/responses", responses()))[1])
    assert again["usage"]["input_tokens_details"]["cached_tokens"] == sim.prefills[1].cache_n > 0
    assert (
        again["object"] == "response" and again["output"][0]["content"][0]["type"] == "output_text"
    )


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "name": "shell"}], ids=["required", "named"]
)
@pytest_twisted.ensureDeferred
async def test_responses_forced_function_answers_a_function_call(choice: object) -> None:
    sim = SimulatedHost(TWO_MODELS)
    # Codex sends tools that are not functions too: llama-server skips them.
    tools = [{"type": "web_search"}, SHELL]
    forced = responses(tools=tools, tool_choice=choice, max_output_tokens=2)
    answer = json.loads((await post(sim, "/v1/responses", forced))[1])
    (call,) = answer["output"]
    assert call["type"] == "function_call" and call["name"] == "shell"
    assert json.loads(call["arguments"]) == {"cmd": [], "workdir": "abcdefgh"}
    assert call["id"] == "fc_" + call["call_id"][len("call_") :]
    got = events((await post(sim, "/v1/responses", {**forced, "stream": True}))[1])
    added = [d["item"] for n, d in got if n == "response.output_item.added"]
    assert added[0]["type"] == "function_call" and added[0]["arguments"] == ""
    parts = [d["delta"] for n, d in got if n == "response.function_call_arguments.delta"]
    assert json.loads("".join(parts)) == {"cmd": [], "workdir": "abcdefgh"}
    assert got[-1][1]["response"]["output"][0]["name"] == "shell"


# -- counting, errors ---------------------------------------------------------------------------


async def count(sim: SimulatedHost, path: str, body: dict[str, Any]) -> int:
    """The ``input_tokens`` a count answers (200, a positive whole number)."""
    code, answer = await post(sim, path, body)
    tokens = json.loads(answer)["input_tokens"]
    assert code == 200 and isinstance(tokens, int) and tokens > 0, answer
    return tokens


@pytest_twisted.ensureDeferred
async def test_token_counts_answer_without_generating() -> None:
    sim = SimulatedHost(TWO_MODELS)
    code, body = await post(sim, "/v1/messages/count_tokens", anthropic())
    counted = json.loads(body)
    assert code == 200 and list(counted) == ["input_tokens"] and counted["input_tokens"] > 10
    code, body = await post(sim, "/v1/responses/input_tokens", responses())
    assert code == 200 and json.loads(body)["object"] == "response.input_tokens"
    chat = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
    code, body = await post(sim, "/v1/chat/completions/input_tokens", chat)
    assert code == 200 and json.loads(body)["object"] == "response.input_tokens"
    assert sim.prefills == [] and sim.chunks_sent == 0


@pytest_twisted.ensureDeferred
async def test_a_responses_count_is_the_prompt_s_tokens_as_the_chat_path_counts_them() -> None:
    """Codex's ``input_tokens``: the same for the same input, more for a longer one, and what
    the chat completions' count says of the same instructions and message."""
    sim = SimulatedHost(TWO_MODELS)
    path = "/v1/responses/input_tokens"
    tokens = await count(sim, path, responses())
    assert await count(sim, path, responses()) == tokens
    more = {"type": "input_text", "text": "and then list the files of this project, one a line"}
    longer = responses()
    longer["input"][0]["content"].append(more)
    assert await count(sim, path, longer) > tokens
    system = {"role": "system", "content": "You are a coding agent."}
    chat = {"model": "tiny-a", "messages": [system, {"role": "user", "content": "hi"}]}
    assert await count(sim, "/v1/chat/completions/input_tokens", chat) == tokens
    assert sim.prefills == [] and sim.chunks_sent == 0


@pytest.mark.parametrize(
    "path",
    ["/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/responses/input_tokens"],
)
@pytest_twisted.ensureDeferred
async def test_unknown_model_gets_the_routers_error(path: str) -> None:
    sim = SimulatedHost(TWO_MODELS)
    body = anthropic() if "messages" in path else responses()
    code, answer = await post(sim, path, {**body, "model": "nope"})
    error = {"code": 400, "message": "model 'nope' not found", "type": "invalid_request_error"}
    assert code == 400 and json.loads(answer) == {"error": error}


@pytest_twisted.ensureDeferred
async def test_malformed_requests_get_llama_servers_errors() -> None:
    sim = SimulatedHost(TWO_MODELS)
    code, body = await post(sim, "/v1/messages", {"model": "tiny-a"})
    assert (code, json.loads(body)["error"]["message"]) == (500, "'messages' is required")
    code, body = await post(sim, "/v1/responses", {"model": "tiny-a"})
    assert (code, json.loads(body)["error"]["message"]) == (400, "'input' is required")
    code, body = await post(sim, "/v1/responses", responses(previous_response_id="resp_1"))
    assert code == 400 and "previous_response_id" in json.loads(body)["error"]["message"]
