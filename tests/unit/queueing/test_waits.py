"""crossbar.queueing.waits: requests wait in crossbar when every slot of their group is
busy, go to the first slot that frees, fairly between flows, within limits that answer
429 in words. In memory: crossbar's own site and exchange, hosts played by the test."""

from __future__ import annotations

import json

from crossbar.queueing import Flow, Go, Queued, Refused
from crossbar.queueing.waits import KEEP
from crossbar.testing import ClientLine, HostLine, MemoryProxy
from tests.support.errors import api_error
from tests.support.waiting import ALICE, BOB, Told, proxy

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


def ask(memory: MemoryProxy, key: str = ALICE) -> ClientLine:
    client = memory.client()
    body = b'{"messages":[{"role":"user","content":"hi"}]}'
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (key.encode(), len(body), body)
    )
    return client


def answer(line: HostLine) -> None:
    line.send(OK)


def asked(line: HostLine) -> int:
    """Requests sent on this (kept-alive) connection so far."""
    return line.received.count(b"POST /v1/chat/completions")


def test_a_request_waits_in_crossbar_and_takes_the_first_slot_that_frees() -> None:
    memory = proxy()
    ask(memory), ask(memory)
    first, second = memory.accept(), memory.accept()
    assert {first.host, second.host} == {"gpu-a", "gpu-b"}
    waiting = ask(memory)
    assert memory.waiting == [] and waiting.received == b""  # no host sees it yet
    assert (asked(first), asked(second)) == (1, 1)
    answer(second)  # the second host frees first: the waiting request goes there
    assert memory.records[-1].waited is None
    assert (asked(first), asked(second)) == (1, 2)
    answer(second)
    record = memory.records[-1]
    assert record.status == 200 and record.waited is not None and record.host == second.host
    assert b"waited" not in waiting.received and waiting.received.startswith(b"HTTP/1.1 200")


def test_a_client_that_leaves_while_waiting_is_never_sent() -> None:
    memory = proxy()
    ask(memory), ask(memory)
    a, _ = memory.accept(), memory.accept()
    leaving = ask(memory)
    leaving.leave()
    memory.clock.advance(0)
    assert memory.records[-1].status == 499
    answer(a)
    assert memory.waiting == []  # the freed slot has nobody to take it


def test_past_a_holder_s_max_waiting_the_answer_is_429_in_words() -> None:
    memory = proxy()
    ask(memory), ask(memory)
    memory.accept(), memory.accept()
    ask(memory), ask(memory)  # alice may have 2 waiting
    third = ask(memory)
    head, _, body = third.received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429") and b"retry-after:" in head.lower()
    error = json.loads(body)["error"]
    assert error == api_error(429, error["message"])["error"]
    assert error["message"].startswith("alice: 2 requests already waiting")


def test_a_wait_past_wait_timeout_is_answered_429() -> None:
    memory = proxy(wait_timeout="5s")
    ask(memory), ask(memory)
    memory.accept(), memory.accept()
    late = ask(memory)
    memory.clock.advance(4)
    assert late.received == b""
    memory.clock.advance(2)
    assert late.received.startswith(b"HTTP/1.1 429")
    assert b"wait_timeout" in late.received


def test_the_higher_band_goes_first_when_a_slot_frees() -> None:
    memory = proxy()
    ask(memory), ask(memory)
    a, _ = memory.accept(), memory.accept()
    ask(memory, ALICE)  # normal, first in
    ask(memory, BOB)  # interactive, later
    answer(a)
    assert asked(a) == 2  # one of the two went on the freed connection: bob's
    assert memory.traffic.queue.flow("alice")[0] == 1  # alice's still waits
    assert memory.traffic.queue.flow("bob")[0] == 0
    assert b"Bearer" not in a.received  # a key for crossbar is never one for a host
    answer(a)
    assert memory.records[-1].waited is not None
    memory.clock.advance(KEEP)  # bob's slot, kept for bob's next request, which never came
    assert memory.traffic.queue.flow("alice")[0] == 0  # and then alice's


def test_queue_off_or_unknown_slots_send_every_request_on_at_once() -> None:
    for memory in (proxy(queue=False), proxy(slots=None)):
        for _ in range(4):
            ask(memory)
        assert len(memory.waiting) == 4


def test_waiting_and_shedding_are_counted_for_prometheus() -> None:
    from crossbar.stats.metrics import Metrics

    memory = proxy()
    metrics = Metrics(memory.table, memory.traffic, memory.clock)
    memory.records = []
    ask(memory), ask(memory)
    first, _ = memory.accept(), memory.accept()
    ask(memory), ask(memory)
    ask(memory)  # alice's third waiting: refused
    text = metrics.render().decode()
    assert 'crossbar_waiting_requests{route="lab"} 2.0' in text
    answer(first)
    for record in memory.records:
        metrics.request_done(record)
    text = metrics.render().decode()
    assert 'crossbar_waiting_requests{route="lab"} 1.0' in text
    assert 'crossbar_shed_requests_total{reason="limit",route="lab"} 1.0' in text
    assert "crossbar_wait_seconds_count" not in text  # the one sent has not ended yet


def test_a_stopping_crossbar_answers_whoever_waits_503_and_a_reload_keeps_them() -> None:
    memory = proxy()
    ask(memory), ask(memory)
    memory.accept(), memory.accept()
    kept, stopped = ask(memory), ask(memory, BOB)
    memory.waits.configure(memory.config)  # a reload: the routes again, nobody dropped
    assert memory.traffic.queue.waiting() == 2
    memory.waits.drain()
    for client in (kept, stopped):
        head, _, body = client.received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503")
        assert json.loads(body) == api_error(503, "crossbar is stopping")
    assert memory.traffic.queue.waiting() == 0


def test_admission_says_go_wait_or_no_and_the_slot_released_goes_to_whoever_waits() -> None:
    memory = proxy()
    waits, route, alice = memory.waits, memory.config.routes["lab"], Flow("alice", 1, None, 1)
    assert waits.admit(Told(), route, "m", alice) == Go()  # room: it goes, counted
    for host in ("gpu-a", "gpu-b"):
        memory.traffic.move(None, host, "m")  # every slot taken
    first, second = Told(), Told()
    queued = waits.admit(first, route, "m", alice)
    assert isinstance(queued, Queued) and memory.traffic.queue.waiting() == 1
    refused = waits.admit(second, route, "m", alice)  # alice may have 1 waiting
    assert isinstance(refused, Refused) and refused.status == 429
    failover, bob = Told(), Flow("bob", 1)
    waits.queue.started(bob, memory.clock.seconds())
    again = waits.admit(failover, route, "m", bob, tried=["gpu-a"], counted=True)
    assert isinstance(again, Queued)  # every host it may still use is full: it waits again
    memory.clock.advance(2)
    waits.release(None, "gpu-b", "m")  # a request left gpu-b: its slot goes to the one
    assert failover.told == [("dispatched", 2)] and first.told == []  # with none running
    waits.release(None, "gpu-a", "m")
    assert first.told == [("dispatched", 2)] and second.told == []


def test_a_conversation_waits_for_its_own_full_host_then_for_any() -> None:
    memory = proxy(policy="cache_affinity", home_wait="3s")
    body = json.dumps({"messages": [{"role": "user", "content": "a long story"}]}).encode()
    turn = json.dumps({"messages": [
        {"role": "user", "content": "a long story"},
        {"role": "assistant", "content": "{}"},
        {"role": "user", "content": "go on"},
    ]}).encode()  # fmt: skip

    def send(data: bytes) -> ClientLine:
        client = memory.client()
        client.send(
            b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer "
            b"%s\r\nContent-Length: %d\r\n\r\n%s" % (ALICE.encode(), len(data), data)
        )
        return client

    send(body)
    home = memory.accept()
    answer(home)
    other = "gpu-b" if home.host == "gpu-a" else "gpu-a"
    memory.traffic.move(None, home.host, "m")  # its home's one slot is taken
    waiting = send(turn)
    assert memory.waiting == [] and waiting.received == b""  # though the other has room
    memory.clock.advance(3)  # home_wait is over: on to a host with room
    assert memory.waiting == [other]
