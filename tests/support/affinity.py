"""A cache-affinity route on two simulated hosts, and a conversation's turns as each API
(chat completions, Claude Code's messages, Codex's responses) sends them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crossbar.config import RouteConfig
from crossbar.testing import SimulatedHost
from tests.support.codex_requests import codex_turn_body

CHAT = "/lab/v1/chat/completions"


def body(first: str, turn: int = 1, model: str = "tiny-a") -> dict[str, Any]:
    """Turn ``turn`` of the conversation that began with the user message ``first``."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": first},
    ]
    for n in range(1, turn):
        messages += [
            {"role": "assistant", "content": f"done {n}"},
            {"role": "user", "content": f"next {n}"},
        ]
    return {"model": model, "messages": messages, "max_tokens": 4}


def affinity_route(**changes: Any) -> dict[str, RouteConfig]:
    return {"lab": RouteConfig("lab", ("gpu-a", "gpu-b"), "tiny-a", "cache_affinity", **changes)}


def hosts(**kwargs: Any) -> dict[str, SimulatedHost]:
    return {
        name: SimulatedHost({"tiny-a": "loaded"}, chunks=3, **kwargs) for name in ("gpu-a", "gpu-b")
    }


def host_header(response: Any) -> str:
    return str(response.headers.getRawHeaders(b"x-crossbar-host")[0].decode())


Shape = Callable[[str, int], tuple[str, dict[str, Any]]]
"""A conversation's turn as some API sends it: (path, body), from its first words and turn."""


def chat_turn(first: str, turn: int) -> tuple[str, dict[str, Any]]:
    return CHAT, body(first, turn)


def claude_turn(first: str, turn: int) -> tuple[str, dict[str, Any]]:
    """Turn ``turn`` of a Claude Code session: its billing header's nonce new every time."""
    billing = (
        f"x-anthropic-billing-header: cc_version=2.1.328.a1; cc_entrypoint=cli; cch={turn:05x};"
    )
    system = [{"type": "text", "text": billing}, {"type": "text", "text": "You are Claude Code."}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for n in range(1, turn):
        messages += [
            {"role": "assistant", "content": f"done {n}"},
            {"role": "user", "content": f"next {n}"},
        ]
    data = {"model": "tiny-a", "system": system, "messages": messages, "max_tokens": 4}
    return "/lab/v1/messages", data


def codex_turn(first: str, turn: int) -> tuple[str, dict[str, Any]]:
    """Turn ``turn`` of a Codex session, every one begun in the same directory: Codex's
    context first, as it sends it, then the prompt ``first``; each answer a function call
    and its output."""
    return "/lab/v1/responses", codex_turn_body(first, turn, model="tiny-a")
