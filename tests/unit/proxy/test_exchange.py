"""crossbar.proxy.exchange: one request's way through crossbar, phase by phase, without
sockets: crossbar's own site, exchange and upstream client on a ``MemoryReactorClock``,
against hosts each test plays byte by byte (crossbar.testing.MemoryProxy)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crossbar.config import parse_config
from crossbar.pages.app import StatusApp
from crossbar.stats.metrics import Metrics
from crossbar.stats.window import RecentTraffic
from crossbar.testing import ClientLine, HostLine, MemoryProxy
from tests.support.errors import api_error
from tests.support.exchange import BODY, END, EVENT, HEAD, ask, chunk, config


@pytest.fixture
def proxy() -> MemoryProxy:
    return MemoryProxy(config(header_timeout=60, idle_timeout=30), models=("m",))


def answered(proxy: MemoryProxy, events: int = 2) -> tuple[ClientLine, HostLine]:
    """A request whose host has sent its head and ``events`` events."""
    client = ask(proxy)
    host = proxy.accept()
    host.send(HEAD)
    for _ in range(events):
        host.send(chunk(EVENT))
    return client, host


def json_answer(client: ClientLine) -> tuple[int, Any]:
    head, _, body = client.received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


# -- the way through, whole ---------------------------------------------------------------


def test_the_request_reaches_the_host_and_its_answer_streams_back_event_by_event(
    proxy: MemoryProxy,
) -> None:
    client = ask(proxy)
    assert proxy.waiting == ["gpu-a"]
    host = proxy.accept()
    assert host.received.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert host.received.endswith(BODY)
    host.send(HEAD)
    host.send(chunk(EVENT))
    assert client.received.endswith(chunk(EVENT))  # relayed at once, not at the end
    host.send(chunk(EVENT) + END)
    assert client.received.endswith(END)
    [record] = proxy.records
    assert (record.route, record.host, record.status, record.tried) == (
        "lab",
        "gpu-a",
        200,
        ("gpu-a",),
    )
    assert record.sent > 0 and not record.cut_off and not record.client_left
    assert proxy.traffic.in_flight == {"gpu-a": 0, "gpu-b": 0}


def test_failover_before_the_head_tries_the_next_host(proxy: MemoryProxy) -> None:
    client = ask(proxy)
    assert proxy.refuse() == "gpu-a"
    assert proxy.waiting == ["gpu-b"]
    host = proxy.accept()
    host.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    assert client.received.endswith(b"\r\n\r\n{}")
    assert b"x-crossbar-host: gpu-b" in client.received.lower()
    [record] = proxy.records
    assert record.tried == ("gpu-a", "gpu-b") and record.status == 200
    assert record.notes() == ["tried gpu-a: connection refused, gpu-b"]
    state = proxy.table.get("gpu-a")
    assert state is not None and state.fails == 1


def test_every_host_failing_before_the_head_is_a_502(proxy: MemoryProxy) -> None:
    client = ask(proxy)
    proxy.refuse()
    proxy.refuse()
    status, error = json_answer(client)
    assert (status, error) == (502, api_error(502, "upstream failed (host gpu-b)"))


def test_a_kept_alive_connection_the_host_closed_is_retried_once_on_a_new_one(
    proxy: MemoryProxy,
) -> None:
    client = ask(proxy)
    line = proxy.accept()
    line.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    assert proxy.records[-1].status == 200
    ask(proxy)  # reuses the idle connection
    assert proxy.waiting == []
    line.close()  # the host had closed it: nothing of an answer came
    proxy.clock.advance(0)
    assert proxy.waiting == ["gpu-a"]  # sent again, on a new connection, to the same host
    again = proxy.accept()
    again.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    second = proxy.records[-1]
    assert (second.status, second.tried) == (200, ("gpu-a",))
    state = proxy.table.get("gpu-a")
    assert state is not None and state.healthy and state.fails == 0
    assert client.received.count(b"HTTP/1.1 200") == 1


# -- the client leaving, in each phase ----------------------------------------------------


def test_a_client_that_leaves_while_crossbar_connects_sends_nothing_to_the_host(
    proxy: MemoryProxy,
) -> None:
    client = ask(proxy)
    client.leave()
    proxy.clock.advance(0)
    [record] = proxy.records
    assert (record.status, record.client_left) == (499, True)
    assert proxy.clock.connectors[0].stoppedConnecting  # the attempt was called off
    assert proxy.traffic.in_flight["gpu-a"] == 0


def test_a_client_that_leaves_before_the_head_closes_the_host_connection(
    proxy: MemoryProxy,
) -> None:
    client = ask(proxy)
    host = proxy.accept()
    client.leave()
    proxy.clock.advance(0)
    assert host.closed  # the host stops working on it
    assert proxy.records[-1].status == 499


def test_a_client_that_leaves_mid_stream_stops_the_host(proxy: MemoryProxy) -> None:
    client, host = answered(proxy)
    client.leave()
    proxy.clock.advance(0)
    assert host.closed  # so the GPU stops generating
    [record] = proxy.records
    assert (record.status, record.notes()) == (499, ["client left"])
    host.send(chunk(EVENT))  # a late chunk changes nothing
    assert len(proxy.records) == 1


def test_a_client_that_leaves_once_it_has_the_last_event_had_its_whole_answer(
    proxy: MemoryProxy,
) -> None:
    """Codex closes as soon as it has read ``[DONE]``, before the host's chunked body
    ends: that answer was whole, logged 200, not 499 "client left"."""
    client, host = answered(proxy)
    content = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    host.send(chunk(content) + chunk(b"data: [DONE]\n\n"))
    client.leave()
    proxy.clock.advance(0)
    assert host.closed
    [record] = proxy.records
    assert (record.status, record.client_left, record.notes()) == (200, False, [])


# -- the host failing ---------------------------------------------------------------------


def test_a_host_that_breaks_off_mid_stream_cuts_the_client_off(proxy: MemoryProxy) -> None:
    client, host = answered(proxy)
    host.close()
    proxy.clock.advance(0)
    assert client.closed  # an SSE client sees an error, not a stream that looks whole
    [record] = proxy.records
    assert (record.status, record.notes()) == (200, ["answer cut off"])
    state = proxy.table.get("gpu-a")
    assert state is not None and state.fails == 1


def test_no_head_within_header_timeout_is_a_504_and_never_tried_elsewhere(
    proxy: MemoryProxy,
) -> None:
    client = ask(proxy)
    host = proxy.accept()
    proxy.clock.advance(59)
    assert client.received == b""
    proxy.clock.advance(1)
    status, error = json_answer(client)
    assert (status, error) == (504, api_error(504, "upstream timeout (host gpu-a)"))
    assert host.closed and proxy.waiting == []


def test_a_host_quiet_mid_answer_for_idle_timeout_is_cut_off(proxy: MemoryProxy) -> None:
    client, host = answered(proxy)
    proxy.clock.advance(29)
    host.send(chunk(EVENT))  # a chunk restarts the timer
    proxy.clock.advance(29)
    assert not client.closed
    proxy.clock.advance(1)
    assert client.closed and host.closed
    proxy.clock.advance(0)
    assert proxy.records[-1].cut_off


def test_a_host_quiet_after_its_head_and_before_any_body_is_a_504(proxy: MemoryProxy) -> None:
    client = ask(proxy)
    host = proxy.accept()
    host.send(HEAD)
    proxy.clock.advance(30)
    status, error = json_answer(client)
    assert (status, error) == (504, api_error(504, "upstream timeout (host gpu-a)"))
    assert host.closed


def test_a_client_that_reads_nothing_for_idle_timeout_ends_both_sides(proxy: MemoryProxy) -> None:
    """Pausing is backpressure, not idleness; a pause as long as ``idle_timeout`` is a
    client holding a host's connection (and its GPU) for nothing."""
    client, host = answered(proxy)
    client.stop_reading()
    assert host.paused
    proxy.clock.advance(29)
    client.read_again()  # a slow reader is no stalled one
    client.stop_reading()
    proxy.clock.advance(29)
    assert not host.closed
    proxy.clock.advance(1)
    assert host.closed and client.closed
    proxy.clock.advance(0)
    [record] = proxy.records
    assert (record.status, record.client_left) == (499, True)


# -- answers made here --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        (b"/nowhere/v1/chat/completions", 404, "unknown route"),
        (b"/lab/v1/stream", 404, "not found"),
        (b"/lab/v1/streams/lookup", 404, "not found"),
    ],
)
def test_paths_crossbar_does_not_forward_are_answered_here(
    proxy: MemoryProxy, path: bytes, status: int, error: str
) -> None:
    client = ask(proxy, path=path)
    assert json_answer(client) == (status, api_error(status, error))
    assert proxy.waiting == []


def test_a_conversation_id_never_reaches_a_host(proxy: MemoryProxy) -> None:
    """llama-server keys resumable stream sessions by it: one client's id is no other's."""
    client = proxy.client()
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\nX-Conversation-Id: theirs\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    )
    host = proxy.accept()
    assert b"theirs" not in host.received and b"conversation-id" not in host.received.lower()


# -- the policy: the page says where the next request goes --------------------------------


def test_the_page_names_the_host_the_next_round_robin_request_goes_to() -> None:
    proxy = MemoryProxy(config("round_robin"), models=("m",))
    metrics = Metrics(proxy.table, proxy.traffic)
    recent = RecentTraffic(proxy.config.hosts, proxy.clock)
    pages = StatusApp(proxy.config, proxy.table, proxy.traffic, metrics, proxy.clock, recent=recent)
    for _ in range(5):
        said = pages.choices(proxy.table.snapshot())["lab"]
        assert pages.choices(proxy.table.snapshot())["lab"] == said  # asking moves nothing
        ask(proxy)
        [went] = proxy.waiting
        assert went == said
        line = proxy.accept()
        line.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        line.close()  # the next request needs a connection of its own: it shows where
        proxy.clock.advance(0)
    assert [r.host for r in proxy.records] == ["gpu-a", "gpu-b", "gpu-a", "gpu-b", "gpu-a"]


# -- Claude Code's and Codex's APIs -------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        b"/v1/messages",
        b"/v1/messages/count_tokens",
        b"/v1/responses",
        b"/v1/responses/input_tokens",
        b"/v1/chat/completions/input_tokens",
    ],
)
def test_the_agent_apis_go_by_their_model_with_query_and_headers_unchanged(path: bytes) -> None:
    cfg = parse_config(
        {
            "hosts": {"gpu-a": "http://127.0.0.1:18081", "gpu-b": "http://127.0.0.1:18082"},
            "routes": {
                "lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "m", "api_keys": ["k" * 24]}
            },
        }
    )
    proxy = MemoryProxy(cfg)
    proxy.table.record_ok("gpu-b", ["m"], ["m"])  # only gpu-b has it loaded
    body = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
    client = proxy.client()
    client.send(
        b"POST /lab%s?beta=true HTTP/1.1\r\nHost: c\r\nX-Api-Key: %s\r\n"
        b"anthropic-version: 2023-06-01\r\nanthropic-beta: tools-2024\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path, b"k" * 24, len(body), body)
    )
    host = proxy.accept()
    assert host.host == "gpu-b"
    head, _, sent = host.received.partition(b"\r\n\r\n")
    assert head.startswith(b"POST %s?beta=true HTTP/1.1\r\n" % path)
    lower = head.lower()  # names are case-insensitive; values reach the host as sent
    assert b"anthropic-version: 2023-06-01" in lower and b"anthropic-beta: tools-2024" in lower
    assert b"k" * 24 not in head  # a key for crossbar is never one for a host
    assert json.loads(sent)["model"] == "m"  # the route's default filled in


def test_an_answer_crossbar_cuts_while_stopping_is_no_fault_of_the_host(proxy: MemoryProxy) -> None:
    """Past ``drain_timeout`` crossbar closes what is left, hosts' connections included."""
    client, host = answered(proxy)
    proxy.site.draining = True
    host.close()
    proxy.clock.advance(0)
    state = proxy.table.get("gpu-a")
    assert state is not None and state.fails == 0 and state.healthy
    assert client.closed and proxy.records[-1].cut_off


@pytest.mark.parametrize("method", [b"OPTIONS", b"GET"])
def test_a_request_for_star_gets_crossbar_s_own_json_answer(
    proxy: MemoryProxy, method: bytes
) -> None:
    client = proxy.client()
    client.send(method + b" * HTTP/1.1\r\nHost: c\r\n\r\n")
    assert json_answer(client) == (400, api_error(400, "missing route"))


# -- what the answer says of its work -----------------------------------------------------


def sse(doc: object) -> bytes:
    return chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")


def test_the_record_has_the_answer_s_tokens_and_its_first_token_not_its_head(
    proxy: MemoryProxy,
) -> None:
    from crossbar.stats.metrics import Metrics

    client = ask(proxy)
    host = proxy.accept()
    proxy.clock.advance(0.2)
    host.send(HEAD)  # the head when a slot starts: no token yet
    proxy.clock.advance(3.0)
    host.send(chunk(b": ping\n\n"))  # a prefill ping
    host.send(sse({"choices": [{"delta": {"role": "assistant", "content": None}}]}))
    proxy.clock.advance(1.0)
    host.send(sse({"choices": [{"delta": {"content": "Hi"}}]}))  # the first token, at 4.2 s
    proxy.clock.advance(1.0)
    timings = {"cache_n": 600, "prompt_n": 85, "prompt_ms": 90.5, "predicted_n": 40,
               "predicted_per_second": 41.5}  # fmt: skip
    last = {"choices": [{"delta": {}, "finish_reason": "stop"}], "timings": timings}
    host.send(sse(last) + chunk(b"data: [DONE]\n\n") + END)
    assert client.received.endswith(END)
    [record] = proxy.records
    assert (record.prompt_tokens, record.cached_tokens, record.generated_tokens) == (685, 600, 40)
    assert record.first_byte == pytest.approx(0.2) and record.first_token == pytest.approx(4.2)
    assert record.tokens_per_second == pytest.approx(41.5)
    metrics = Metrics(proxy.table, proxy.traffic, proxy.clock)
    metrics.request_done(record)
    text = metrics.render().decode()
    for kind, count in (("prompt", 685), ("cached", 600), ("generated", 40)):
        # no keys on the route: its usage goes to the route
        labels = f'host="gpu-a",key="lab",kind="{kind}",model="m",route="lab"'
        assert f"crossbar_tokens_total{{{labels}}} {count}.0" in text
