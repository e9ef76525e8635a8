"""crossbar.proxy.outcome: an exchange's outcome, filled in as it went, made into its one
record as it ended; each field from what the exchange knew, by name."""

from __future__ import annotations

import json
from typing import Any, cast

import attrs
from twisted.web.test.requesthelper import DummyRequest

from crossbar.config import parse_config
from crossbar.proxy.outcome import Outcome
from crossbar.proxy.phases import Phase
from crossbar.routing.affinity import Placement
from crossbar.stats.record import RequestRecord, refused_record
from crossbar.testing import LogCapture, MemoryProxy
from crossbar.usage.reader import AnswerReader, TokenUsage

ROUTE = parse_config({"hosts": {"gpu-a": "http://a:1"}, "routes": {"lab": {"hosts": ["gpu-a"]}}})


class Reader:
    first_content = 10.25

    def usage(self) -> TokenUsage:
        return TokenUsage(
            prompt=1200, cached=1024, generated=85, prefill_ms=None, tokens_per_second=41.5
        )

    def whole(self) -> bool:
        return False


def ended(phase: Phase = Phase.ANSWERED, **changed: Any) -> RequestRecord:
    """The record of an exchange that ended in ``phase`` at 12.0, its outcome as below."""
    request = DummyRequest([b""])
    request.method, request.code = b"POST", 200
    fields: dict[str, Any] = {
        "route": ROUTE.routes["lab"],
        "host": "gpu-b",
        "started": 10.0,
        "first_byte": 0.125,
        "model": "qwen",
        "alias": "claude-sonnet-4-5",
        "generates": False,
        "placement": Placement("gpu-b", "gpu-a", "moved"),
        "path": b"/v1/chat/completions",
        "tried": ["gpu-a", "gpu-b"],
        "failures": [("gpu-a", "connection refused")],
        "waited": 0.5,
        "shed": None,
        "flow": None,
        "reader": cast(AnswerReader, Reader()),
        "size_note": "moved: 9120 tokens > gpu-a's window 8192",
        "loads": 1,
    }
    fields.update(changed)
    return Outcome(**fields).record(request, phase, 4096, 12.0)


def test_every_field_of_the_record_comes_from_what_the_exchange_knew() -> None:
    assert attrs.asdict(ended(), recurse=False) == {
        "route": "lab",
        "host": "gpu-b",
        "status": 200,
        "seconds": 2.0,
        "first_byte": 0.125,
        "sent": 4096,
        "model": "qwen",
        "asked_model": "claude-sonnet-4-5",
        "generates": False,
        "affinity": "moved",
        "method": b"POST",
        "path": b"/v1/chat/completions",
        "tried": ("gpu-a", "gpu-b"),
        "failures": (("gpu-a", "connection refused"),),
        "cut_off": False,
        "client_left": False,
        "moved_from": "gpu-a",
        "refused": False,
        "waited": 0.5,
        "shed": None,
        "key": None,
        "prompt_tokens": 1200,
        "cached_tokens": 1024,
        "generated_tokens": 85,
        "first_token": 0.25,
        "tokens_per_second": 41.5,
        "loads": 1,
        "reason": None,
        "size_note": "moved: 9120 tokens > gpu-a's window 8192",
    }


def test_the_words_of_an_answer_crossbar_made_are_its_reason() -> None:
    """An exchange that keeps the words it answered with (``reason``) has them logged."""
    assert ended(reason="no healthy host").reason == "no healthy host"


def test_a_client_that_left_before_the_end_is_a_499_and_a_cut_answer_says_so() -> None:
    left = ended(Phase.CLIENT_LEFT)
    assert (left.status, left.client_left, left.cut_off) == (499, True, False)
    cut = ended(Phase.CUT_OFF, reader=None, placement=None)
    assert (cut.status, cut.cut_off, cut.prompt_tokens, cut.affinity) == (200, True, None, None)


def test_a_request_refused_at_the_door_has_a_record_of_its_own_kind() -> None:
    record = refused_record(413, b"POST", b"/lab/v1/chat/completions")
    assert (record.route, record.host, record.status, record.refused) == ("-", None, 413, True)
    assert (record.method, record.path, record.seconds) == (b"POST", b"/lab/v1/chat/completions", 0)


def test_a_host_s_implausible_usage_is_dropped_and_said() -> None:
    config = parse_config(
        {
            "hosts": {"gpu-a": "http://127.0.0.1:18081"},
            "routes": {"lab": {"hosts": ["gpu-a"], "default_model": "m"}},
        }
    )
    memory = MemoryProxy(config, models=("m",))
    memory.table.record_window("gpu-a", "m", 4096)
    body = json.dumps({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    client = memory.client()
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body.encode())
    )
    usage = {"prompt_tokens": 10**9, "completion_tokens": 10**9, "total_tokens": 2 * 10**9}
    answer = json.dumps({"choices": [{"message": {"content": "ok"}}], "usage": usage}).encode()
    logs = LogCapture()
    try:
        memory.accept().send(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(answer), answer)
        )
    finally:
        logs.close()

    record = memory.records[-1]
    assert record.status == 200
    assert (record.prompt_tokens, record.generated_tokens) == (None, None)
    assert logs.matching(
        "host gpu-a, model m: usage dropped as implausible: prompt_tokens 1,000,000,000"
        " over 4,096 (the host's window); completion_tokens 1,000,000,000 over 74"
        " (max_tokens 10 and a margin)"
    )
