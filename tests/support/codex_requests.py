"""The ``POST /v1/responses`` bodies Codex 0.169.0 sent, recorded
(``tests/fixtures/codex-0.169-sessions.json``), and Codex-shaped turns built from them.

The recording, in its order: ``codex exec --skip-git-repo-check "<prompt>"`` (the sandbox
and config of :func:`tests.support.agents.codex`) in one directory holding an AGENTS.md, for the
prompts "fix the failing test in parser.py" (session ``fix``) and "add a README section on
install" (``readme``); ``codex exec resume --last "now run the linter too"`` after the first
(``fix`` again); and ``codex exec "say hi"`` in another directory, without an AGENTS.md
(``elsewhere``). A relay between Codex and ``crossbar --demo`` wrote down each body as Codex
sent it, and on a request without a tool's output yet set ``tool_choice`` to Codex's
``exec_command`` before passing it on: the simulator answered with that call, Codex ran it
and sent its output back, a second request. Then, for the fixture, every text and tool
output longer than 600 characters was cut to its first 240 (the same in every body) and the
tools kept only their type and name; ids, roles, types, order and all else are as sent.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parents[1] / "fixtures" / "codex-0.169-sessions.json"


@cache
def _recorded() -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["requests"]
    return requests


def recorded() -> list[dict[str, Any]]:
    """Each request as ``{"session": name, "turn": answers so far, "body": ...}``."""
    return copy.deepcopy(_recorded())


def opening() -> list[dict[str, Any]]:
    """What Codex sends before the person's prompt in directory ``fix`` and ``readme`` ran
    in: two developer messages, then one user item with the AGENTS.md and the
    ``<environment_context>``."""
    return recorded()[0]["body"]["input"][:3]


def codex_turn_body(first: str, turn: int, model: str = "qwen3-coder-30b") -> dict[str, Any]:
    """Turn ``turn`` (1, 2, ...) of a Codex session begun in that directory with the prompt
    ``first``: each answer a function call, then its output, as Codex sends them back."""
    prompt = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": first}]}
    items = [*opening(), prompt]
    for n in range(1, turn):
        call = {"type": "function_call", "name": "exec_command", "arguments": '{"cmd":"ls"}'}
        items.append({**call, "call_id": f"call_{n}"})
        items.append({"type": "function_call_output", "call_id": f"call_{n}", "output": "ok"})
    return {"model": model, "input": items, "stream": True, "store": False}
