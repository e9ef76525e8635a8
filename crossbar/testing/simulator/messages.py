"""Anthropic's Messages API as llama-server speaks it (``/v1/messages``), for Claude Code.

Pure data, no Twisted.  llama-server turns a Messages request into a chat completion
(``server_chat_convert_anthropic_to_oai`` in ``tools/server/server-chat.cpp``), generates,
and shapes the answer back (``to_json_anthropic*`` in ``server-task.cpp``); so does this.

A stream is ``event: NAME`` and ``data: JSON`` lines, no ``[DONE]``: ``message_start`` (its
``usage.input_tokens`` leaves out the ``cache_read_input_tokens``) with the first token,
``content_block_start``, a ``content_block_delta`` a token, then ``content_block_stop``,
``message_delta`` (``stop_reason`` and ``usage.output_tokens``) and ``message_stop`` together.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from crossbar.testing.simulator.replies import HttpError, dumps
from crossbar.testing.simulator.toolcalls import ToolCall, Written, pick

_BILLING = "x-anthropic-billing-header:"
_NONCE = 5  # letters of the billing header's cch= nonce


def _normalize_billing(system: str) -> str:
    """Claude Code's billing header with its per-request ``cch=`` nonce as ``fffff``, as
    llama-server rewrites it so that the prompt cache reaches past it."""
    if not system.startswith(_BILLING):
        return system
    at = system.find("cch=", len(_BILLING))
    start = at + 4
    if at < 0 or start + _NONCE >= len(system) or system[start + _NONCE] != ";":
        return system
    return system[:start] + "f" * _NONCE + system[start + _NONCE :]


def _system(value: object) -> str | None:
    if isinstance(value, str):
        return _normalize_billing(value)
    if isinstance(value, list):
        blocks = [b for b in value if isinstance(b, Mapping) and b.get("type") == "text"]
        return "".join(_normalize_billing(str(b.get("text", ""))) for b in blocks)
    return None


def _message(message: object) -> list[Any]:
    """One Anthropic message as chat messages: its text and tool calls, then tool results."""
    if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
        return [message]
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in message["content"]:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":  # its text only: a template renders no cache_control
            content.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                {"id": block.get("id"), "name": block.get("name"), "input": block.get("input")}
            )
        elif kind == "tool_result":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": block.get("content"),
                }
            )
    converted = []
    if content or calls:
        converted.append({"role": message.get("role"), "content": "".join(content)})
        if calls:
            converted[0]["tool_calls"] = calls
    return converted + results


def to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion llama-server makes of a Messages request: what its prompt is,
    what limits it (``max_tokens``, 4096 when absent) and how it samples."""
    messages = body.get("messages")
    if messages is None:
        raise HttpError(500, "'messages' is required")  # sic: a runtime_error, so 500
    chat: dict[str, Any] = {"max_tokens": body.get("max_tokens", 4096)}
    system = _system(body.get("system"))
    rendered = [] if system is None else [{"role": "system", "content": system}]
    for message in messages if isinstance(messages, list) else []:
        rendered += _message(message)
    chat["messages"] = rendered
    if isinstance(body.get("tools"), list):
        chat["tools"] = body["tools"]
    for key in ("temperature", "top_p", "top_k", "stream"):
        if key in body:
            chat[key] = body[key]
    return chat


def forced_tool(body: Mapping[str, Any]) -> ToolCall | None:
    """The call a request forces: ``tool_choice`` ``{"type": "tool", "name": ...}`` names
    it, ``{"type": "any"}`` leaves it to the model (the simulator takes the first tool)."""
    choice = body.get("tool_choice")
    if not isinstance(choice, Mapping):
        return None
    if choice.get("type") == "tool" and isinstance(choice.get("name"), str):
        return pick(body.get("tools"), choice["name"], "input_schema")
    if choice.get("type") == "any":
        return pick(body.get("tools"), None, "input_schema")
    return None


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


@dataclass(frozen=True)
class MessagesAnswer(Written):
    """A generated answer in the Messages API's shape: text, or a ``tool``'s call."""

    def _stop_reason(self) -> str:
        if self.tool is not None:
            return "tool_use"
        return "max_tokens" if self.reply.finish == "length" else "end_turn"

    def _usage(self) -> dict[str, int]:
        cached = self.reply.usage["prompt_tokens_details"]["cached_tokens"]
        return {
            "cache_read_input_tokens": cached,
            "input_tokens": self.reply.usage["prompt_tokens"] - cached,
            "output_tokens": self.tokens,
        }

    def _block(self) -> dict[str, Any]:
        if self.tool is None:
            return {"type": "text", "text": ""}
        return {"type": "tool_use", "id": self.tool.id, "name": self.tool.name}

    def whole(self) -> dict[str, Any]:
        if self.tool is None:
            content = [{"type": "text", "text": self.said}] if self.said else []
        else:
            content = [self._block() | {"input": _json(self.tool.arguments)}]
        return {
            "id": self.reply.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.reply.model,
            "stop_reason": self._stop_reason(),
            "stop_sequence": None,
            "usage": self._usage(),
        }

    def events(self) -> Iterator[tuple[bool, bytes]]:
        """(paced, bytes) a token; the first token's write starts the message and its block."""
        start = _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self.reply.id,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": self.reply.model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": self._usage() | {"output_tokens": 0},
                },
            },
        )
        opened = start + _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": self._block()},
        )
        if self.tool is None:
            kind, field = "text_delta", "text"
        else:
            kind, field = "input_json_delta", "partial_json"
        first = True
        for piece in self.pieces():
            delta = {"type": kind, field: piece}
            event = {"type": "content_block_delta", "index": 0, "delta": delta}
            yield True, (opened if first else b"") + _sse("content_block_delta", event)
            first = False
        # No token at all (a limit of 0): the message starts and ends in one write.
        stop = {"type": "content_block_stop", "index": 0}
        last = start if first else _sse("content_block_stop", stop)
        ending = {"stop_reason": self._stop_reason(), "stop_sequence": None}
        usage = {"output_tokens": self.tokens}
        last += _sse("message_delta", {"type": "message_delta", "delta": ending, "usage": usage})
        yield False, last + _sse("message_stop", {"type": "message_stop"})


def _json(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}
