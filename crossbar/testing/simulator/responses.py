"""OpenAI's Responses API as llama-server speaks it (``/v1/responses``), for Codex.

Pure data, no Twisted.  llama-server turns a Responses request into a chat completion
(``server_chat_convert_responses_to_chatcmpl`` in ``tools/server/server-chat.cpp``: tools
other than ``function`` are skipped, ``max_output_tokens`` is the limit), generates, and
shapes the answer back (``to_json_oaicompat_resp*`` in ``server-task.cpp``); so does this.

A stream is ``event: NAME`` and ``data: JSON`` lines, no ``[DONE]``: ``response.created``,
``response.in_progress``, ``response.output_item.added`` and ``response.content_part.added``
with the first token, a ``response.output_text.delta`` a token (a function call:
``response.function_call_arguments.delta``), then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and ``response.completed``
(its ``usage.input_tokens`` counts the cached ones too, ``input_tokens_details.cached_tokens``
says how many) together.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from crossbar.testing.simulator.replies import HttpError, dumps
from crossbar.testing.simulator.toolcalls import ToolCall, Written, pick, random_id

_PASSED = ("input", "instructions", "tools", "max_output_tokens", "reasoning")


def _item(item: object) -> dict[str, Any]:
    """One input item as a chat message (what the model sees of it)."""
    if not isinstance(item, Mapping):
        raise HttpError(400, "Cannot determine type of 'item'")
    kind = item.get("type")
    if isinstance(item.get("role"), str):
        return {"role": item["role"], "content": _text(item.get("content"))}
    if kind == "function_call":
        call = {"name": item.get("name"), "arguments": item.get("arguments")}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")}
    if kind == "reasoning":
        return {"role": "assistant", "content": "", "reasoning": item.get("content")}
    raise HttpError(400, "Cannot determine type of 'item'")


def _text(content: object) -> object:
    """A message's parts as the template renders them: their text, one after another."""
    if not isinstance(content, list):
        return content
    parts = [p for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
    return "".join(p["text"] for p in parts) if len(parts) == len(content) else content


def to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion llama-server makes of a Responses request."""
    if "input" not in body:
        raise HttpError(400, "'input' is required")
    if body.get("previous_response_id"):
        raise HttpError(400, "llama.cpp does not support 'previous_response_id'.")
    chat = {k: v for k, v in body.items() if k not in _PASSED}
    messages: list[Any] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": body["instructions"]})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages += [_item(item) for item in given]
    else:
        raise HttpError(400, "'input' must be a string or array of objects")
    chat["messages"] = messages
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise HttpError(400, "'tools' must be an array of objects")
    given = functions(tools)
    if given:
        chat["tools"] = given
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


def functions(tools: object) -> list[Any]:
    """The ``function`` tools: llama-server skips the others (web search, custom ones)."""
    if not isinstance(tools, list):
        return []
    return [t for t in tools if isinstance(t, Mapping) and t.get("type") == "function"]


def forced_tool(body: Mapping[str, Any]) -> ToolCall | None:
    """The call a request forces: ``tool_choice`` ``{"type": "function", "name": ...}``
    names it, ``"required"`` leaves it to the model (the simulator takes the first)."""
    choice = body.get("tool_choice")
    given = functions(body.get("tools"))
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        name = choice.get("name")
        return pick(given, name, "parameters") if isinstance(name, str) else None
    if choice == "required":
        return pick(given, None, "parameters")
    return None


def _sse(data: dict[str, Any]) -> bytes:
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + dumps(data) + b"\n\n"


@dataclass(frozen=True)
class ResponsesAnswer(Written):
    """A generated answer in the Responses API's shape: text, or a ``tool``'s call."""

    id: str = field(default_factory=lambda: "resp_" + random_id())
    message_id: str = field(default_factory=lambda: "msg_" + random_id())

    def _usage(self) -> dict[str, Any]:
        prompt = self.reply.usage["prompt_tokens"]
        cached = self.reply.usage["prompt_tokens_details"]["cached_tokens"]
        return {
            "input_tokens": prompt,
            "output_tokens": self.tokens,
            "total_tokens": prompt + self.tokens,
            "input_tokens_details": {"cached_tokens": cached},
        }

    def _part(self) -> dict[str, Any]:
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": self.said}

    def _output(self) -> list[dict[str, Any]]:
        if self.tool is not None:
            call = self.tool
            return [
                {
                    "id": "fc_" + call.id,
                    "type": "function_call",
                    "status": "completed",
                    "arguments": call.arguments,
                    "call_id": "call_" + call.id,
                    "name": call.name,
                }
            ]
        if not self.said:
            return []
        return [
            {
                "type": "message",
                "status": "completed",
                "id": self.message_id,
                "content": [self._part()],
                "role": "assistant",
            }
        ]

    def whole(self) -> dict[str, Any]:
        now = self.reply.created
        return {
            "completed_at": now,
            "created_at": now,
            "id": self.id,
            "model": self.reply.model,
            "object": "response",
            "output": self._output(),
            "status": "completed",
            "usage": self._usage(),
        }

    def _opening(self) -> bytes:
        """The first token's events before its delta: the response, its item, its part."""
        state = {"id": self.id, "object": "response", "status": "in_progress"}
        head = _sse({"type": "response.created", "response": state})
        head += _sse({"type": "response.in_progress", "response": state})
        if self.tool is not None:
            (call,) = self._output()
            item = call | {"arguments": "", "status": "in_progress"}
            return head + _sse({"type": "response.output_item.added", "item": item})
        item = {
            "content": [],
            "id": self.message_id,
            "role": "assistant",
            "status": "in_progress",
            "type": "message",
        }
        head += _sse({"type": "response.output_item.added", "item": item})
        part = {"type": "output_text", "text": ""}
        added = {"type": "response.content_part.added", "item_id": self.message_id, "part": part}
        return head + _sse(added)

    def events(self) -> Iterator[tuple[bool, bytes]]:
        """(paced, bytes) a token; the first token's write opens the response."""
        if self.tool is None:
            kind, item_id = "response.output_text.delta", self.message_id
        else:
            kind, item_id = "response.function_call_arguments.delta", "fc_" + self.tool.id
        first = True
        for piece in self.pieces():
            delta = _sse({"type": kind, "item_id": item_id, "delta": piece})
            yield True, (self._opening() if first else b"") + delta
            first = False
        last = self._opening() if first else b""  # no token at all: opened and closed at once
        output = self._output()
        if self.tool is None and output:
            done = {"type": "response.output_text.done", "item_id": self.message_id}
            last += _sse(done | {"text": self.said})
            part = {"type": "response.content_part.done", "item_id": self.message_id}
            last += _sse(part | {"part": self._part()})
        for item in output:
            last += _sse({"type": "response.output_item.done", "item": item})
        response = {
            "id": self.id,
            "object": "response",
            "created_at": self.reply.created,
            "status": "completed",
            "model": self.reply.model,
            "output": output,
            "usage": self._usage(),
        }
        yield False, last + _sse({"type": "response.completed", "response": response})
