"""Slot windows on real llama-server routers: a prompt too long for one host is answered by
another, a prompt too long for every host gets each API's own error, and the simulator
refuses a prompt too long as the real server does.

The fleet (module scope) is two routers serving the same tiny model ``tiny-a``: ``small``
with one slot of 512 tokens (``-c 512 -np 1``) and ``large`` with one of 2,048 (the tiny
models' training context, the most ``-c`` may be). The route lists ``small`` first, so a
request goes there unless crossbar knows it does not fit. The tiny models' tokenizer has
few pieces, so a text takes about one token a byte: :data:`FITS_LARGE` is about 1,000
tokens, :data:`FITS_NONE` about 3,300.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_twisted
from treq.testing import StubTreq

from crossbar.testing import SimulatedHost
from tests.integration.conftest import CrossbarProcess, CrossbarStarter, RouterStarter
from tests.support.fleet import (
    POLL,
    SEEN_TIMEOUT,
    Answer,
    crossbar_status,
    request,
    statuses_of,
    stream_raw,
    wait_until,
)

pytestmark = pytest.mark.integration

MODEL = "tiny-a"
SMALL, LARGE = 512, 2048
WINDOWS = {"small": SMALL, "large": LARGE}
FITS_LARGE = "hello world " * 90
FITS_NONE = "hello world " * 300
REFUSED = re.compile(
    r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\),"
    r" try increasing it"
)


def body_for(path: str, text: str, stream: bool) -> dict[str, Any]:
    """A request of ``path``'s API whose prompt is ``text``, answering a few tokens."""
    if path == "/v1/completions":
        shaped: dict[str, Any] = {"prompt": text, "max_tokens": 4}
    elif path == "/v1/responses":
        shaped = {"input": text, "max_output_tokens": 4}
    else:
        shaped = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return {"model": MODEL, "stream": stream, "temperature": 0, **shaped}


PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")


@dataclass
class Fleet:
    proxy: CrossbarProcess
    urls: dict[str, str]

    def post(self, path: str, text: str, stream: bool) -> Answer:
        url = f"{self.proxy.url}/lab{path}"
        body = body_for(path, text, stream)
        if stream:
            status, headers, raw = stream_raw(url, body)
            return Answer(status, headers, raw)
        return request("POST", url, body)


@pytest.fixture(scope="module")
def fleet(
    tiny_models: Any,
    module_llama_router: RouterStarter,
    module_crossbar_process: CrossbarStarter,
) -> Iterator[Fleet]:
    routers = {
        name: module_llama_router(
            tiny_models(MODEL), models_max=1, extra_args=("-c", str(window), "-np", "1")
        )
        for name, window in WINDOWS.items()
    }
    for router in routers.values():
        loaded = request("POST", f"{router.url}/models/load", {"model": MODEL})
        assert loaded.status == 200, loaded
        wait_until(
            lambda r=router: statuses_of(r)[MODEL] == "loaded",
            SEEN_TIMEOUT,
            f"{router.url} has {MODEL} loaded",
        )
    proxy = module_crossbar_process(
        {
            "poll_interval": POLL,
            "hosts": {name: r.url for name, r in routers.items()},
            "routes": {"lab": {"hosts": list(WINDOWS), "default_model": MODEL}},
        }
    )

    def windows() -> bool:
        hosts = crossbar_status(proxy)["hosts"]
        seen = {h: hosts[h].get("models", {}).get(MODEL, {}).get("window") for h in WINDOWS}
        return seen == WINDOWS

    wait_until(windows, SEEN_TIMEOUT, "crossbar's status shows each host's window")
    yield Fleet(proxy, {name: r.url for name, r in routers.items()})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", PATHS)
def test_a_prompt_too_long_for_the_first_host_is_answered_by_the_larger_one(
    fleet: Fleet, path: str, stream: bool
) -> None:
    answer = fleet.post(path, FITS_LARGE, stream)
    assert answer.status == 200, f"{answer.status}: {answer.body[:300]!r}"
    assert answer.host == "large", answer.headers
    if stream:
        assert b"data:" in answer.body
    else:
        assert "error" not in answer.json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", PATHS)
def test_a_prompt_too_long_for_every_host_gets_the_apis_own_error_with_numbers(
    fleet: Fleet, path: str, stream: bool
) -> None:
    # The real count, from the larger host itself.
    direct = request("POST", f"{fleet.urls['large']}{path}", body_for(path, FITS_NONE, False))
    tokens = direct.json()["error"]["n_prompt_tokens"]
    assert tokens > LARGE

    answer = fleet.post(path, FITS_NONE, stream)
    assert answer.status == 400, f"{answer.status}: {answer.body[:300]!r}"
    assert answer.headers["content-type"].startswith("application/json")
    doc = answer.json()
    if path == "/v1/messages":
        words = f"prompt is too long: {tokens} tokens > {LARGE} maximum"
        expected = {"type": "error", "error": {"type": "invalid_request_error", "message": words}}
        assert doc == expected
    else:
        error = doc["error"]
        assert (error["code"], error["type"]) == (
            "context_length_exceeded",
            "invalid_request_error",
        )
        assert str(tokens) in error["message"] and str(LARGE) in error["message"], error


# --------------------------------------------------------------------------------------------
# The simulator's refusal against the real server's
# --------------------------------------------------------------------------------------------


async def simulated(path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    sim = SimulatedHost({MODEL: "loaded"}, ctx=SMALL)
    stub = StubTreq(sim.resource)
    response = await stub.post("http://sim" + path, json=body)
    kind = (response.headers.getRawHeaders(b"content-type") or [b""])[0].decode()
    return response.code, kind, await stub.content(response)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", PATHS)
@pytest_twisted.ensureDeferred
async def test_the_simulator_refuses_a_prompt_too_long_as_the_real_server_does(
    fleet: Fleet, path: str, stream: bool
) -> None:
    """Status, content type, the body's keys, ``type``, ``code``, the message's words and
    ``n_ctx`` are the same. ``n_prompt_tokens`` differs: each counts with its own tokenizer
    (the tiny model's byte pieces, the simulator's word pieces); each names it in the message."""
    body = body_for(path, FITS_NONE, stream)
    real = request("POST", f"{fleet.urls['small']}{path}", body)
    code, kind, raw = await simulated(path, body)
    sim = json.loads(raw)

    assert (code, kind.split(";")[0]) == (real.status, real.headers["content-type"].split(";")[0])
    assert code == 400
    assert sim.keys() == real.json().keys() == {"error"}
    sim_error, real_error = sim["error"], real.json()["error"]
    assert sim_error.keys() == real_error.keys()
    assert sim_error["type"] == real_error["type"] == "exceed_context_size_error"
    assert sim_error["code"] == real_error["code"] == 400
    assert sim_error["n_ctx"] == real_error["n_ctx"] == SMALL
    for error in (sim_error, real_error):
        said = REFUSED.fullmatch(error["message"])
        assert said is not None, error["message"]
        assert (int(said[1]), int(said[2])) == (error["n_prompt_tokens"], SMALL)
        assert error["n_prompt_tokens"] > SMALL
