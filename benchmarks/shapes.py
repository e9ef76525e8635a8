"""What reading a request's body costs, per API shape (chat, Anthropic Messages, Responses),
at the sizes agents send, in process:

    .venv/bin/python benchmarks/shapes.py [--before DIR] [--rounds 7]

Each body is read as the proxy reads it on a ``cache_affinity`` route (the model, the stream
flag and the conversation, in one decode) and on any other route (the model and the stream
flag). ``--before DIR`` (a tree with an older ``crossbar``, e.g. ``git archive a8749f5
crossbar | tar -x -C DIR``) also times that tree's ``peek_model`` and ``read_conversation``
on the chat bodies, the same rounds interleaved, so that the two are compared side by side.
Prints microseconds per body, the best of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from crossbar.proxy.shapes import SHAPES, read_body  # noqa: E402


def chat(system: int, turns: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": "s" * system}, {"role": "user", "content": "fix it"}]
    for n in range(turns):
        messages += [
            {"role": "assistant", "content": f"done {n} " * 40},
            {"role": "user", "content": "next " * 40},
        ]
    return {"model": "m", "messages": messages, "stream": True}


def claude(system: int, turns: int) -> dict[str, Any]:
    body = chat(0, turns)
    body["messages"] = body["messages"][1:]
    billing = "x-anthropic-billing-header: cc_version=2.1.328.a1; cc_entrypoint=cli; cch=a5145;"
    body["system"] = [{"type": "text", "text": billing}, {"type": "text", "text": "s" * system}]
    body["tools"] = [{"name": f"t{n}", "input_schema": {"type": "object"}} for n in range(12)]
    return body


def codex(system: int, turns: int) -> dict[str, Any]:
    """As Codex 0.169 sends it (``tests/fixtures/codex-0.169-sessions.json``): its own
    prompt as developer messages, its context (AGENTS.md, ``<environment_context>``) as a
    user item, then the person's prompt, and the turns' tool calls after it."""

    def message(role: str, *texts: str) -> dict[str, Any]:
        content = [{"type": "input_text", "text": text} for text in texts]
        return {"type": "message", "role": role, "content": content}

    agents = (
        "# AGENTS.md instructions for /work/lab\n\n<INSTRUCTIONS>\nRun the tests.\n</INSTRUCTIONS>"
    )
    where = "<environment_context>\n  <cwd>/work/lab</cwd>\n  <shell>bash</shell>\n"
    where += "</environment_context>"
    items = [
        message("developer", "s" * system),
        message("developer", "<permissions instructions>\n" + "p" * 2000),
        message("user", agents, where),
        message("user", "fix it"),
    ]
    for n in range(turns):
        items += [
            {"type": "function_call", "name": "shell", "arguments": "{}" * 20, "call_id": f"c{n}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": "ok " * 80},
        ]
    return {"model": "m", "input": items, "stream": True}


CASES = [
    ("chat 2 KB", b"/v1/chat/completions", chat(1500, 1)),
    ("chat 100 KB", b"/v1/chat/completions", chat(20000, 120)),
    ("messages 48 KB", b"/v1/messages", claude(30000, 20)),
    ("messages 100 KB", b"/v1/messages", claude(30000, 90)),
    ("responses 48 KB", b"/v1/responses", codex(30000, 20)),
    ("responses 100 KB", b"/v1/responses", codex(30000, 60)),
]


def best(fn: Callable[[], object], rounds: int, per: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per):
            fn()
        times.append((time.perf_counter() - started) / per)
    return min(times) * 1e6


def older(tree: Path) -> tuple[Any, Any]:
    """The older tree's peek_model and read_conversation, loaded from their files."""
    found = []
    for name in ("peek", "conversation"):
        path = tree / "crossbar" / "server" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"before_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # msgspec reads a Struct's annotations there
        spec.loader.exec_module(module)
        found.append(module)
    return found[0].peek_model, found[1].read_conversation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    before = older(args.before) if args.before else None
    print(f"{'body':18} {'bytes':>7} {'model only':>11} {'+ conversation':>15} {'before':>8}")
    for name, path, doc in CASES:
        raw = json.dumps(doc).encode()
        shape = SHAPES[path]
        per = max(20, 2_000_000 // len(raw))
        light = best(lambda s=shape, r=raw: read_body(s, r, None, False), args.rounds, per)
        full = best(lambda s=shape, r=raw: read_body(s, r, None, True), args.rounds, per)
        old = "-"
        if before is not None and path == b"/v1/chat/completions":

            def both(r: bytes = raw, p: bytes = path, old: Any = before) -> object:
                peek, conversation = old
                return conversation(p, r, peek(r).model)

            old = f"{best(both, args.rounds, per):.1f}"
        print(f"{name:18} {len(raw):>7} {light:>11.1f} {full:>15.1f} {old:>8}")


if __name__ == "__main__":
    main()
