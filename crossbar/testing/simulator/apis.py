"""The APIs a llama-server generates through, and what each makes of a request and an answer.

Pure data, no Twisted.  llama-server serves four: OpenAI's chat completions and text
completions, Anthropic's Messages (Claude Code) and OpenAI's Responses (Codex).  The last two
are turned into a chat completion first, so one prompt cache and one generator serve them
all; only the request's reading and the answer's shape differ.  Each also counts a prompt's
tokens without generating (``count_tokens`` / ``input_tokens``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from crossbar.testing.simulator import messages, responses
from crossbar.testing.simulator.cache import Tokens, prompt_tokens
from crossbar.testing.simulator.completions import Reply
from crossbar.testing.simulator.toolcalls import Offered, ToolCall, Written, offered, pick

Api = Literal["chat", "text", "messages", "responses"]

GENERATE: dict[str, Api] = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "text",
    "/completions": "text",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/responses": "responses",
}
"""Paths that generate, and their API (llama-server's ``server.cpp`` routes)."""

COUNT: dict[str, Api] = {
    "/v1/messages/count_tokens": "messages",
    "/v1/responses/input_tokens": "responses",
    "/responses/input_tokens": "responses",
    "/v1/chat/completions/input_tokens": "chat",
    "/chat/completions/input_tokens": "chat",
}
"""Paths that count a prompt's tokens, and the API whose request they read."""


def to_chat(api: Api, body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat (or text) completion request that ``body`` amounts to."""
    if api == "messages":
        return messages.to_chat(body)
    if api == "responses":
        return responses.to_chat(body)
    return dict(body)


def prompt(api: Api, body: Mapping[str, Any]) -> Tokens:
    """A request's prompt tokens, as the prompt cache sees them."""
    return prompt_tokens(to_chat(api, body), chat=api != "text")


def counted(api: Api, body: Mapping[str, Any]) -> dict[str, Any]:
    """The answer of a token count: ``input_tokens``, and an ``object`` on OpenAI's paths."""
    answer: dict[str, Any] = {"input_tokens": len(prompt(api, body))}
    if api != "messages":
        answer["object"] = "response.input_tokens"
    return answer


class Shaped(Protocol):
    """An answer in its API's shape."""

    @property
    def tokens(self) -> int: ...
    def kept(self, limit: int) -> str: ...
    def whole(self) -> dict[str, Any]: ...
    def events(self) -> Iterator[tuple[bool, bytes]]: ...


def _functions(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A chat request's ``function`` tools, each its ``{"name", "parameters"}``."""
    tools = body.get("tools")
    listed = tools if isinstance(tools, list) else []
    return [
        t["function"]
        for t in listed
        if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
    ]


def _forced(body: Mapping[str, Any]) -> ToolCall | None:
    """The call a chat request forces: ``tool_choice`` ``{"type": "function", "function":
    {"name": ...}}`` names it, ``"required"`` leaves it to the model (the first tool)."""
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        name = choice["function"].get("name")
        return pick(_functions(body), name, "parameters") if isinstance(name, str) else None
    if choice == "required":
        return pick(_functions(body), None, "parameters")
    return None


def _offered(api: Api, body: Mapping[str, Any]) -> list[Offered]:
    """The tools ``body`` lets the model call (none when ``tool_choice`` is ``none``)."""
    choice = body.get("tool_choice")
    if choice == "none" or (isinstance(choice, Mapping) and choice.get("type") == "none"):
        return []
    if api == "messages":
        return offered(body.get("tools"), "input_schema")
    if api == "responses":
        return offered(responses.functions(body.get("tools")), "parameters")
    return offered(_functions(body), "parameters")


@dataclass(frozen=True)
class _OpenAI(Written):
    """A chat or text completion: ``Reply`` has its shapes; a chat answer's own words or
    tool call are put in them."""

    with_usage: bool = False

    def _call(self, arguments: str) -> dict[str, Any]:
        assert self.tool is not None
        function = {"name": self.tool.name, "arguments": arguments}
        return {"type": "function", "function": function, "id": self.tool.id}

    def whole(self) -> dict[str, Any]:
        if self.tool is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [self._call(self.said)]}
            return self.reply.whole(self.size, message)
        if self.words is not None:
            return self.reply.whole(self.size, {"role": "assistant", "content": self.words})
        return self.reply.whole(self.size)

    def _deltas(self) -> Iterator[dict[str, Any]]:
        if self.tool is None:
            yield from ({"content": piece} for piece in self.pieces())
            return
        for n, piece in enumerate(self.pieces()):
            call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
            if n == 0:  # the first token names the call, in llama-server's order
                named = {"name": self.tool.name, "arguments": piece}
                call = {"index": 0, "id": self.tool.id, "type": "function", "function": named}
            yield {"tool_calls": [call]}

    def events(self) -> Iterator[tuple[bool, bytes]]:
        if self.tool is None and self.words is None:
            return self.reply.events(self.size, self.with_usage)
        return self.reply.events(self.size, self.with_usage, self._deltas())


def shape(api: Api, body: Mapping[str, Any], reply: Reply, size: int) -> Shaped:
    """``reply`` (``size`` letters a token) as ``api`` answers ``body``: the generated text,
    or a tool call (:meth:`Written.to`)."""
    tools = _offered(api, body) if api != "text" else []
    said = to_chat(api, body).get("messages") if tools else None
    asked = said if isinstance(said, list) else []
    if api == "messages":
        return messages.MessagesAnswer.to(reply, size, messages.forced_tool(body), tools, asked)
    if api == "responses":
        forced = responses.forced_tool(body)
        return responses.ResponsesAnswer.to(reply, size, forced, tools, asked)
    options = body.get("stream_options")
    with_usage = isinstance(options, Mapping) and options.get("include_usage") is True
    forced = _forced(body) if api == "chat" else None
    written = Written.to(reply, size, forced, tools, asked)
    return _OpenAI(written.reply, size, written.tool, written.words, with_usage)
