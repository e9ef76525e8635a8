"""How far off crossbar's guess of a prompt's tokens is (``crossbar.routing.promptsize``), per
API shape, on conversations that grow turn by turn as an agent's do:

    .venv/bin/python benchmarks/promptsize.py [--turns 40]

Each conversation is built in the shape Claude Code (messages), Codex (responses) and a
chat client send (``benchmarks/shapes.py``'s builders, with real text: crossbar's own
documentation as the system prompt, its source files as tool results). Its true prompt
tokens are what the simulator's answer would report in ``usage`` (its template and token
pieces, ``crossbar.testing.simulator.apis.prompt``). Three guesses are compared with them,
each made before the turn is "sent" and fed the turn's true count afterwards, as the proxy
would be fed each answer's usage:

- ``first``: the rate assumed before any answer (``FIRST_BYTES_PER_TOKEN``);
- ``learned``: the rate learned from the earlier turns (no conversation key);
- ``conversation``: the last turn's count plus the bytes added at the learned rate.

Prints the mean and the worst error, in per cent of the true count, and the time a guess
takes. The simulator's pieces are not a real tokenizer's: the rate differs on a real
model, the way the error behaves as a conversation grows does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from crossbar.routing.promptsize import FIRST_BYTES_PER_TOKEN, PromptSizes  # noqa: E402
from crossbar.testing.simulator.apis import prompt  # noqa: E402

SYSTEM = (ROOT / "docs" / "clients.md").read_text()[:24_000]
SOURCES = sorted((ROOT / "crossbar").rglob("*.py"))
FILES = [p.read_text() for p in SOURCES if p.stat().st_size > 2000]


def chat_turns(turns: int) -> Iterator[dict[str, Any]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix it"}]
    for n in range(turns):
        yield {"model": "m", "messages": list(messages), "stream": True, "max_tokens": 4096}
        call = {"id": f"c{n}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": FILES[n % len(FILES)][:6000]},
        ]


def claude_turns(turns: int) -> Iterator[dict[str, Any]]:
    billing = "x-anthropic-billing-header: cc_version=2.1.328.a1; cc_entrypoint=cli;"
    system = [{"type": "text", "text": billing}, {"type": "text", "text": SYSTEM}]
    tools = [
        {"name": f"tool{n}", "description": SYSTEM[n * 300 : n * 300 + 300],
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
        for n in range(16)
    ]  # fmt: skip
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the failing test"}]
    for n in range(turns):
        yield {"model": "m", "system": system, "tools": tools, "messages": list(messages),
               "max_tokens": 32000, "stream": True}  # fmt: skip
        use = {"type": "tool_use", "id": f"t{n}", "name": "tool1", "input": {"path": f"f{n}.py"}}
        result = {"type": "tool_result", "tool_use_id": f"t{n}",
                  "content": FILES[n % len(FILES)][:6000]}  # fmt: skip
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]


def codex_turns(turns: int) -> Iterator[dict[str, Any]]:
    def message(role: str, text: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}

    items = [message("developer", SYSTEM), message("user", "fix it")]
    tools = [{"type": "function", "name": "shell", "description": SYSTEM[:800],
              "parameters": {"type": "object"}}]  # fmt: skip
    for n in range(turns):
        yield {"model": "m", "instructions": SYSTEM[:4000], "input": list(items),
               "tools": tools, "stream": True}  # fmt: skip
        args = json.dumps({"command": ["cat", f"f{n}.py"]})
        items += [
            {"type": "function_call", "name": "shell", "arguments": args, "call_id": f"c{n}"},
            {"type": "function_call_output", "call_id": f"c{n}",
             "output": FILES[n % len(FILES)][:6000]},
        ]  # fmt: skip


SHAPES: list[tuple[str, str, str, Callable[[int], Iterator[dict[str, Any]]]]] = [
    ("chat", "chat", "chat", chat_turns),
    ("messages", "anthropic", "messages", claude_turns),
    ("responses", "responses", "responses", codex_turns),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    print(f"first rate {FIRST_BYTES_PER_TOKEN} bytes/token; errors in % of the true count")
    print(f"{'api':10} {'bytes':>15} {'tokens':>15} {'first':>13} {'learned':>13} {'conv.':>13}")
    for name, api, sim_api, turns in SHAPES:
        sizes = PromptSizes()
        errors: dict[str, list[float]] = {"first": [], "learned": [], "conversation": []}
        sized: list[tuple[int, int]] = []
        for n, body in enumerate(turns(args.turns)):
            raw = json.dumps(body).encode()
            true = len(prompt(sim_api, body))  # type: ignore[arg-type]
            sized.append((len(raw), true))
            errors["first"].append(100 * (len(raw) / FIRST_BYTES_PER_TOKEN - true) / true)
            if n:
                learned = sizes.estimate("m", api, len(raw)).tokens
                errors["learned"].append(100 * (learned - true) / true)
                by_key = sizes.estimate("m", api, len(raw), b"k").tokens
                errors["conversation"].append(100 * (by_key - true) / true)
            sizes.learn("m", api, len(raw), true, b"k")
        cells = []
        for how in ("first", "learned", "conversation"):
            found = errors[how]
            mean = sum(abs(e) for e in found) / len(found)
            worst = max(found, key=abs)
            cells.append(f"{mean:5.1f} ({worst:+5.1f})")
        span = f"{sized[0][0]:,}-{sized[-1][0]:,}"
        tokens = f"{sized[0][1]:,}-{sized[-1][1]:,}"
        print(f"{name:10} {span:>15} {tokens:>15} {cells[0]:>13} {cells[1]:>13} {cells[2]:>13}")
    sizes = PromptSizes()
    sizes.learn("m", "chat", 100_000, 25_000, b"k")
    rounds = 200_000
    started = time.perf_counter()
    for _ in range(rounds):
        sizes.estimate("m", "chat", 120_000, b"k")
    each = (time.perf_counter() - started) / rounds * 1e9
    print(f"one estimate: {each:.0f} ns (mean and worst error per cell: 'mean (worst)')")


if __name__ == "__main__":
    main()
