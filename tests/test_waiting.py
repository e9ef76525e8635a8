"""crossbar.server.waiting: requests wait in crossbar when every slot of their group is
busy, go to the first slot that frees, fairly between flows, within limits that answer
429 in words. In memory: crossbar's own site and exchange, hosts played by the test."""

from __future__ import annotations

import json
from typing import Any

from crossbar.config import parse_config
from crossbar.fleet.rendezvous import rendezvous
from crossbar.server.shapes import read_conversation
from crossbar.server.waiting import KEEP
from crossbar.testing import ClientLine, HostLine, MemoryProxy

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
ALICE, BOB = "a" * 24, "b" * 24


def proxy(slots: int | None = 1, keys: list[Any] | None = None, **route: Any) -> MemoryProxy:
    def host(port: int) -> Any:
        url = f"http://127.0.0.1:{port}"
        return url if slots is None else {"url": url, "slots": slots}

    keys = [{"name": "alice", "key": ALICE, "max_waiting": 2}] + (
        keys if keys is not None else [{"name": "bob", "key": BOB, "priority": "interactive"}]
    )
    config = parse_config(
        {
            "hosts": {"gpu-a": host(18081), "gpu-b": host(18082)},
            "api_keys": keys,
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "m", **route}},
        }
    )
    return MemoryProxy(config, models=("m",))


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
    assert json.loads(body) == {"error": json.loads(body)["error"]}
    assert json.loads(body)["error"].startswith("alice: 2 requests already waiting")


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
    from crossbar.pages.metrics import Metrics

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
        assert json.loads(body) == {"error": "crossbar is stopping"}
    assert memory.traffic.queue.waiting() == 0


# -- a slot is kept a moment for the flow that just freed it --------------------------------


def alice_waits_and_bob_s_request_ends() -> tuple[MemoryProxy, HostLine]:
    """alice and bob (the same band here) each have a request on a host of one slot,
    alice two more waiting; then bob's ends: bob has nothing running or waiting, so he
    would go first. Returns bob's host."""
    memory = proxy(keys=[{"name": "bob", "key": BOB}])
    ask(memory, ALICE)
    memory.accept()
    ask(memory, BOB)
    bobs = memory.accept()
    ask(memory, ALICE), ask(memory, ALICE)
    assert memory.traffic.queue.flow("alice") == (2, 1)
    answer(bobs)
    return memory, bobs


def test_a_slot_is_kept_a_moment_for_the_next_request_of_the_flow_that_freed_it() -> None:
    memory, bobs = alice_waits_and_bob_s_request_ends()
    assert asked(bobs) == 1  # not given to alice's at once
    memory.clock.advance(KEEP / 2)
    ask(memory, BOB)  # bob's next request, a moment later: it takes the slot
    memory.clock.advance(0)
    assert asked(bobs) == 2 and memory.traffic.queue.flow("alice") == (2, 1)
    answer(bobs)
    assert memory.records[-1].waited is not None and memory.records[-1].waited < KEEP


def test_a_kept_slot_goes_to_the_queue_when_the_flow_does_not_come_back() -> None:
    memory, bobs = alice_waits_and_bob_s_request_ends()
    memory.clock.advance(KEEP * 0.9)
    assert asked(bobs) == 1
    memory.clock.advance(KEEP * 0.1)
    assert asked(bobs) == 2 and memory.traffic.queue.flow("alice") == (1, 2)


def test_a_flow_with_more_running_gets_no_slot_kept() -> None:
    memory = proxy()
    ask(memory), ask(memory)  # alice on both hosts
    a, _ = memory.accept(), memory.accept()
    ask(memory, BOB)  # bob waits
    answer(a)  # alice still has one running: the slot goes to bob at once
    assert asked(a) == 2 and memory.traffic.queue.waiting() == 0


# -- a cache_affinity turn waits for its own host, a while ------------------------------------

TURN = (
    b'{"messages":[{"role":"user","content":"fix the bug"},'
    b'{"role":"assistant","content":"done"},{"role":"user","content":"and its test"}]}'
)


def chat(memory: MemoryProxy, body: bytes) -> ClientLine:
    client = memory.client()
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (ALICE.encode(), len(body), body)
    )
    return client


def turn_waits_with_its_home_full(
    home_wait: str,
) -> tuple[MemoryProxy, HostLine, HostLine, ClientLine]:
    """Both hosts busy with a first turn each, then the other host (not the turn's own,
    which holds its conversation's cache) frees its slot, then the turn comes: its own
    host's line, the other's, the turn's client."""
    memory = proxy(policy="cache_affinity", home_wait=home_wait)
    conversation = read_conversation(b"/v1/chat/completions", TURN, "m")
    assert conversation is not None
    home = rendezvous(conversation.key, ["gpu-a", "gpu-b"])[0]
    for i in range(2):
        chat(memory, b'{"messages":[{"role":"user","content":"task %d"}]}' % i)
    lines = {line.host: line for line in (memory.accept(), memory.accept())}
    own, other = lines[home], lines[next(h for h in lines if h != home)]
    answer(other)  # its slot is free now: the turn could take it at once
    return memory, own, other, chat(memory, TURN)


def test_a_turn_waits_for_its_own_host_and_goes_there_when_it_frees_a_slot_in_time() -> None:
    memory, own, other, _ = turn_waits_with_its_home_full("2s")
    memory.clock.advance(1.5)
    assert (asked(own), asked(other)) == (1, 1)  # other's free slot is not taken
    assert memory.traffic.queue.waiting() == 1
    answer(own)
    assert (asked(own), asked(other)) == (2, 1)  # home: its cache is there
    answer(own)
    record = memory.records[-1]
    assert record.host == own.host and record.waited == 1.5
    assert record.affinity != "moved" and record.moved_from is None


def test_past_home_wait_a_turn_takes_another_host_s_free_slot() -> None:
    memory, own, other, _ = turn_waits_with_its_home_full("2s")
    memory.clock.advance(1.9)
    assert (asked(own), asked(other)) == (1, 1)
    memory.clock.advance(0.1)
    assert (asked(own), asked(other)) == (1, 2)  # moved: prefilled again over there
    answer(other)
    record = memory.records[-1]
    assert record.host == other.host and record.waited == 2.0
    assert (record.affinity, record.moved_from) == ("moved", own.host)


def test_past_home_wait_with_every_host_full_a_turn_takes_the_first_slot_that_frees() -> None:
    memory = proxy(policy="cache_affinity", home_wait="1s")
    for i in range(2):
        chat(memory, b'{"messages":[{"role":"user","content":"task %d"}]}' % i)
    first, second = memory.accept(), memory.accept()
    chat(memory, TURN)
    memory.clock.advance(3)
    assert memory.traffic.queue.waiting() == 1  # waiting for any host now
    answer(first)  # whichever host it is
    assert (asked(first), asked(second)) == (2, 1)
    answer(first)
    assert memory.records[-1].waited == 3.0  # its whole wait, both pools together


def test_a_turn_that_leaves_while_waiting_for_its_host_is_never_sent() -> None:
    memory, own, other, client = turn_waits_with_its_home_full("2s")
    client.leave()
    memory.clock.advance(0)
    assert memory.records[-1].status == 499 and memory.traffic.queue.waiting() == 0
    memory.clock.advance(5)  # its home_wait passes: nothing left to send
    answer(own)
    assert (asked(own), asked(other)) == (1, 1)


def test_with_home_wait_0_a_turn_never_waits_for_its_own_host() -> None:
    memory, own, other, _ = turn_waits_with_its_home_full("0")
    assert memory.traffic.queue.waiting() == 0
    # Sent at once, as before: to its own host (a new connection, the host queues it).
    assert (asked(own), asked(other), memory.waiting) == (1, 1, [own.host])


def test_with_spillover_a_full_model_starts_one_more_copy_rather_than_wait() -> None:
    """gpu-a has m loaded and its one slot busy; gpu-b knows m, has room for it (its
    router said so) and has it not loaded. Without spillover the next request waits for
    gpu-a; with it, it goes to gpu-b (one load); the one after waits: one load at a time."""
    from crossbar.fleet.room import Room

    for spillover, went in ((False, ["gpu-a"]), (True, ["gpu-a", "gpu-b"])):
        memory = proxy(spillover=spillover)
        memory.table.record_ok("gpu-b", [], ["m"])  # knows m, loaded nowhere but gpu-a
        memory.table.record_room("gpu-b", Room(2, True))
        ask(memory)
        first = memory.accept()
        ask(memory), ask(memory)
        sent = [first.host, *memory.waiting]  # the hosts crossbar has connected to
        assert sent == went, spillover
