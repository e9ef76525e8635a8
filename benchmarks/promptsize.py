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

With ``--real URL`` the true count is a real llama-server's instead: each turn is sent
(``max_tokens`` 1, not streamed) to ``URL`` (a llama-server, or a crossbar route such as
``http://127.0.0.1:8080/lab``) for ``--model``, and its answer's ``usage`` is read (prompt
tokens, cached ones included). Texts are cut to ``--system-chars`` and ``--file-chars`` so a
conversation fits the server's window (``-c``); no time is measured in this mode.

With ``--tokenizer o200k_base`` (or ``cl100k_base``) the true count is a real BPE
tokenizer's, of the prompt as the simulator's template renders it: the byte rate of a real
model's vocabulary, without a model. It runs ``benchmarks/tokens.js`` with node and the npm
package gpt-tokenizer (installed once into ``~/.cache/llama-crossbar/gpt-tokenizer``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from crossbar.routing.promptsize import FIRST_BYTES_PER_TOKEN, PromptSizes  # noqa: E402
from crossbar.testing.simulator.apis import prompt, to_chat  # noqa: E402
from crossbar.testing.simulator.cache import render  # noqa: E402

TOKENIZER_VERSION = "4.0.0"
"""The gpt-tokenizer release ``--tokenizer`` counts with."""

SYSTEM = (ROOT / "docs" / "clients.md").read_text()[:24_000]
SOURCES = sorted((ROOT / "crossbar").rglob("*.py"))
FILES = [p.read_text() for p in SOURCES if p.stat().st_size > 2000]
FILE_CHARS = 6000
"""Characters of a source file in each tool result."""


def tool_result(n: int) -> str:
    """The text of the ``n``-th tool result: a source file, cut to :data:`FILE_CHARS`."""
    return FILES[n % len(FILES)][:FILE_CHARS]


def chat_turns(turns: int) -> Iterator[dict[str, Any]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix it"}]
    for n in range(turns):
        yield {"model": "m", "messages": list(messages), "stream": True, "max_tokens": 4096}
        call = {"id": f"c{n}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": tool_result(n)},
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
                  "content": tool_result(n)}  # fmt: skip
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
             "output": tool_result(n)},
        ]  # fmt: skip


SHAPES: list[tuple[str, str, str, Callable[[int], Iterator[dict[str, Any]]]]] = [
    ("chat", "chat", "chat", chat_turns),
    ("messages", "anthropic", "messages", claude_turns),
    ("responses", "responses", "responses", codex_turns),
]


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def as_sent(name: str, body: dict[str, Any], model: str) -> dict[str, Any]:
    """``body`` as ``--real`` sends it: for ``model``, one token answered, not streamed."""
    sent = {**body, "model": model, "stream": False}
    sent.pop("max_tokens", None)
    sent["max_output_tokens" if name == "responses" else "max_tokens"] = 1
    return sent


def real_tokens(url: str, name: str, raw: bytes) -> int:
    """A real server's count of the prompt tokens of ``raw`` (its answer's ``usage``)."""
    ask = urllib.request.Request(url + PATHS[name], raw, {"Content-Type": "application/json"})
    with urllib.request.urlopen(ask, timeout=600) as answer:
        usage = json.loads(answer.read())["usage"]
    if name == "messages":  # input_tokens leaves the cached ones out
        return int(usage["input_tokens"]) + int(usage.get("cache_read_input_tokens", 0))
    return int(usage["prompt_tokens" if name == "chat" else "input_tokens"])


def true_tokens(real: str | None, name: str, sim_api: str, body: Any, raw: bytes) -> int:
    """The prompt's true tokens: the real server's at ``real``, else the simulator's."""
    if real is not None:
        return real_tokens(real, name, raw)
    return len(prompt(sim_api, body))  # type: ignore[arg-type]


def bpe_counts(encoding: str, texts: list[str]) -> list[int]:
    """The tokens of each of ``texts`` by gpt-tokenizer's ``encoding`` (installed on first use)."""
    root = Path.home() / ".cache" / "llama-crossbar" / "gpt-tokenizer"
    if not (root / "node_modules" / "gpt-tokenizer").exists():
        root.mkdir(parents=True, exist_ok=True)
        install = ["npm", "install", "--silent", "--prefix", str(root)]
        subprocess.run([*install, f"gpt-tokenizer@{TOKENIZER_VERSION}"], check=True)
    env = {**os.environ, "NODE_PATH": str(root / "node_modules")}
    counted = subprocess.run(
        ["node", str(HERE / "tokens.js"), encoding],
        input=json.dumps(texts).encode(), capture_output=True, check=True, env=env,
    )  # fmt: skip
    return [int(n) for n in json.loads(counted.stdout)]


def main() -> None:
    global SYSTEM, FILE_CHARS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--real", metavar="URL", help="count with a real llama-server at URL")
    parser.add_argument("--model", default="m", help="the model to ask for (--real)")
    parser.add_argument("--system-chars", type=int, default=24_000)
    parser.add_argument("--file-chars", type=int, default=FILE_CHARS)
    parser.add_argument("--tokenizer", metavar="ENCODING", help="count with a real BPE tokenizer")
    args = parser.parse_args()
    SYSTEM, FILE_CHARS = SYSTEM[: args.system_chars], args.file_chars
    real = args.real.rstrip("/") if args.real else None
    print(f"first rate {FIRST_BYTES_PER_TOKEN} bytes/token; errors in % of the true count")
    print(f"{'api':10} {'bytes':>15} {'tokens':>15} {'first':>13} {'learned':>13} {'conv.':>13}")
    for name, api, sim_api, turns in SHAPES:
        sizes = PromptSizes()
        errors: dict[str, list[float]] = {"first": [], "learned": [], "conversation": []}
        sized: list[tuple[int, int]] = []
        bodies = list(turns(args.turns))
        counts: list[int] | None = None
        if args.tokenizer:
            texts = [render(to_chat(sim_api, b), chat=True) for b in bodies]  # type: ignore[arg-type]
            counts = bpe_counts(args.tokenizer, texts)
        for n, body in enumerate(bodies):
            if real is not None:
                body = as_sent(name, body, args.model)
            raw = json.dumps(body).encode()
            true = counts[n] if counts else true_tokens(real, name, sim_api, body, raw)
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
    if real is not None or args.tokenizer:
        print("mean and worst error per cell: 'mean (worst)'")
        return
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
