"""Requests to the simulated llama-server host and readers of its answers."""

from __future__ import annotations

import json
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred

from crossbar.testing import SimulatedHost

TWO_MODELS = {"tiny-a": "loaded", "tiny-b": "unloaded"}


def watch(d: Deferred[Any]) -> list[object]:
    """A list that gets the result of ``d`` once it has one (``d.called`` is not enough)."""
    results: list[object] = []

    def seen(result: object) -> object:
        results.append(result)
        return result

    d.addBoth(seen)
    return results


def sse_payloads(body: bytes) -> list[Any]:
    events = body.split(b"\n\n")
    assert events[-1] == b""
    payloads: list[Any] = []
    for event in events[:-1]:
        assert event.startswith(b"data: ")
        data = event[len(b"data: ") :]
        payloads.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return payloads


def chat(model: str | None = "tiny-a", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi there"}], **extra}
    if model is not None:
        body["model"] = model
    return body


CHAT_PATH, TEXT_PATH = "/v1/chat/completions", "/v1/completions"


def request(path: str, **extra: Any) -> dict[str, Any]:
    """A chat or text completion request for tiny-a; a stream asks for the usage."""
    if extra.get("stream"):
        extra.setdefault("stream_options", {"include_usage": True})
    if path == CHAT_PATH:
        return chat(**extra)
    return {"model": "tiny-a", "prompt": "Once upon a time", **extra}


def stub_for(sim: SimulatedHost) -> Any:
    """treq without sockets, straight into the simulator's resource."""
    return StubTreq(sim.resource)


async def get_json(stub: Any, path: str) -> tuple[int, Any]:
    response = await stub.get("http://sim" + path)
    return response.code, await stub.json_content(response)
