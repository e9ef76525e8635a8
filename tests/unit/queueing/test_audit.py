"""The fair queue's promises against a client that plays it, through crossbar's own site
and exchange in memory (hosts played by the test): an unnamed key waits its turn, one
key cannot fill a route's waiting room, ``max_in_flight`` holds while slots are free, and
clients behind a trusted proxy are each a flow of their own, and a turn done waiting for
its own host still counts in its route's waiting room."""

from __future__ import annotations

import json
from typing import Any

from crossbar.config import parse_config
from crossbar.testing import ClientLine, HostLine, MemoryProxy

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
ALICE, CAROL, UNNAMED = "a" * 24, "c" * 24, "u" * 24


def proxy(keys: list[Any], **route: Any) -> MemoryProxy:
    hosts = {
        "gpu-a": {"url": "http://127.0.0.1:18081", "slots": 1},
        "gpu-b": {"url": "http://127.0.0.1:18082", "slots": 1},
    }
    config = parse_config(
        {
            "hosts": hosts,
            "api_keys": keys,
            "trusted_proxies": ["127.0.0.0/8"],
            "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "m", **route}},
        }
    )
    return MemoryProxy(config, models=("m",))


def ask(memory: MemoryProxy, key: str | None = ALICE, head: bytes = b"") -> ClientLine:
    client = memory.client()
    body = b'{"messages":[{"role":"user","content":"hi"}]}'
    auth = b"Authorization: Bearer %s\r\n" % key.encode() if key is not None else b""
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\n%s%sContent-Length: %d\r\n\r\n%s"
        % (auth, head, len(body), body)
    )
    return client


def asked(line: HostLine) -> int:
    return line.received.count(b"POST /v1/chat/completions")


def test_an_unnamed_key_waits_behind_a_named_normal_key_that_came_first() -> None:
    memory = proxy(
        [
            {"name": "carol", "key": CAROL, "priority": "interactive"},
            {"name": "alice", "key": ALICE},
            UNNAMED,
        ]
    )
    ask(memory, CAROL), ask(memory, CAROL)
    a, _ = memory.accept(), memory.accept()
    ask(memory, ALICE)
    ask(memory, UNNAMED)
    a.send(OK)  # carol's first ends: the freed slot takes alice's, who came first

    assert asked(a) == 2
    assert memory.traffic.queue.flow("alice") == (0, 1)


def test_one_key_cannot_shut_everyone_else_out_of_a_full_waiting_room() -> None:
    memory = proxy(
        [{"name": "alice", "key": ALICE}, {"name": "carol", "key": CAROL}], max_waiting=4
    )
    ask(memory), ask(memory)
    memory.accept(), memory.accept()
    mine = [ask(memory) for _ in range(4)]  # alice fills the room
    ask(memory, CAROL)

    assert memory.traffic.queue.flow("carol") == (1, 0)  # let in
    head, _, body = mine[-1].received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429")
    assert json.loads(body)["error"]["message"] == (
        "lab: 4 requests already waiting, 4 of them this client's, the most of any: its"
        " newest gave way to another client's"
    )


def test_a_key_past_its_max_in_flight_waits_even_with_a_slot_free() -> None:
    memory = proxy([{"name": "alice", "key": ALICE, "max_in_flight": 1}])
    ask(memory)
    first = memory.accept()
    ask(memory)

    assert memory.waiting == []  # the other slot stays free
    assert memory.traffic.queue.flow("alice") == (1, 1)
    first.send(OK)
    assert asked(first) == 2  # now it goes (on the connection kept alive)


def test_behind_a_trusted_proxy_each_forwarded_client_is_a_flow() -> None:
    memory = proxy([])
    ask(memory, None, b"X-Forwarded-For: 192.0.2.7\r\n")
    ask(memory, None, b"X-Forwarded-For: 192.0.2.8\r\n")

    assert memory.traffic.queue.flow("192.0.2.7") == (0, 1)
    assert memory.traffic.queue.flow("192.0.2.8") == (0, 1)


def test_a_turn_done_waiting_for_its_home_still_counts_in_the_route_s_waiting_room() -> None:
    memory = proxy(
        [{"name": "alice", "key": ALICE}, {"name": "carol", "key": CAROL}],
        max_waiting=1,
        policy="cache_affinity",
        home_wait="3s",
    )
    story = [{"role": "user", "content": "a long story"}]
    turn = [*story, {"role": "assistant", "content": "{}"}, {"role": "user", "content": "go on"}]

    def send(key: str, messages: list[Any]) -> ClientLine:
        client, body = memory.client(), json.dumps({"messages": messages}).encode()
        client.send(
            b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer "
            b"%s\r\nContent-Length: %d\r\n\r\n%s" % (key.encode(), len(body), body)
        )
        return client

    send(ALICE, story)
    memory.accept().send(OK)
    memory.traffic.move(None, "gpu-a", "m"), memory.traffic.move(None, "gpu-b", "m")  # busy
    send(ALICE, turn)  # waits for its home, then (3 s on) for any host
    memory.clock.advance(3)
    late = ask(memory, CAROL)

    head, _, body = late.received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429")
    assert json.loads(body)["error"]["message"] == "lab: 1 request already waiting"


def test_a_host_that_dies_sends_its_requests_and_the_queue_to_the_host_still_up() -> None:
    hosts = {
        "dies": {"url": "http://127.0.0.1:18081", "slots": 1, "max_fails": 1},
        "slow": {"url": "http://127.0.0.1:18082", "slots": 1},
    }
    config = parse_config(
        {"hosts": hosts, "routes": {"lab": {"hosts": ["dies", "slow"], "default_model": "m"}}}
    )
    memory = MemoryProxy(config, models=("m",))
    clients = [ask(memory, None) for _ in range(3)]  # one on each host, one waiting
    lines = {line.host: line for line in (memory.accept(), memory.accept())}

    lines["dies"].close()  # reset before answering: it is marked down
    memory.clock.advance(0)
    assert memory.waiting == [] and [c.received for c in clients] == [b""] * 3
    for _ in range(3):
        lines["slow"].send(OK)
        memory.clock.advance(0)

    assert [c.received.split(b"\r\n")[0] for c in clients] == [b"HTTP/1.1 200 OK"] * 3
    assert {r.host for r in memory.records} == {"slow"}


def test_spillover_evicts_no_model_used_within_min_idle_before_evict() -> None:
    hosts = {
        "gpu-a": {"url": "http://127.0.0.1:18081", "slots": 1, "models_max": 1},
        "gpu-b": {"url": "http://127.0.0.1:18082", "slots": 1, "models_max": 1},
    }
    route = {"hosts": ["gpu-a", "gpu-b"], "default_model": "m", "spillover": True}
    config = parse_config(
        {"hosts": hosts, "routes": {"lab": {**route, "min_idle_before_evict": "30s"}}}
    )
    memory = MemoryProxy(config)
    memory.table.record_ok("gpu-a", ("m",), ("m",))
    memory.table.record_ok("gpu-b", ("agent",), ("agent", "m"))
    memory.traffic.move(None, "gpu-b", "agent")
    memory.traffic.move("gpu-b", None, "agent", memory.clock.seconds())  # its turn just ended
    memory.clock.advance(5)  # the agent thinks
    ask(memory, None)
    memory.accept()
    ask(memory, None)  # gpu-a is full: spilling would evict the agent's model

    assert memory.waiting == [] and memory.traffic.queue.waiting() == 1
    memory.clock.advance(25)  # the agent has been idle 30 s: a copy of m may start there
    assert memory.waiting == ["gpu-b"] and memory.traffic.queue.waiting() == 0
