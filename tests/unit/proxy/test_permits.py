"""crossbar.proxy.permits: what a key may ask for (its models, its loads a minute), calls
that take no slot never wait for one, a key removed while its request waited, and a host's
500 that says it failed to load the model. Through crossbar's own site and exchange in
memory, hosts played by the test."""

from __future__ import annotations

import json
from typing import Any

from crossbar.config import parse_config
from crossbar.testing import ClientLine, MemoryProxy
from crossbar.usage.sums import COUNTS, MinuteSums

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
ALICE, BOB = "a" * 24, "b" * 24


def config(keys: list[Any], host: dict[str, Any] | None = None, **route: Any) -> dict[str, Any]:
    extra = host or {}
    return {
        "hosts": {
            "gpu-a": {"url": "http://127.0.0.1:18081", "slots": 1, **extra},
            "gpu-b": {"url": "http://127.0.0.1:18082", "slots": 1, **extra},
        },
        "api_keys": keys,
        "routes": {"lab": {"hosts": ["gpu-a", "gpu-b"], "default_model": "m", **route}},
    }


def ask(
    memory: MemoryProxy,
    key: str = ALICE,
    model: str = "m",
    path: bytes = b"/v1/chat/completions",
    method: bytes = b"POST",
) -> ClientLine:
    client = memory.client()
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    data = body.encode() if method == b"POST" else b""
    client.send(
        b"%s /lab%s HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer %s\r\nContent-Length: %d"
        b"\r\n\r\n%s" % (method, path, key.encode(), len(data), data)
    )
    return client


def answer(client: ClientLine) -> tuple[bytes, dict[str, Any]]:
    head, _, body = client.received.partition(b"\r\n\r\n")
    return head, json.loads(body)


def test_a_model_the_key_may_not_ask_for_is_answered_403_in_words() -> None:
    keys = [{"name": "alice", "key": ALICE, "models": ["m"]}]
    memory = MemoryProxy(parse_config(config(keys, models=["m", "n*"])), models=("m", "n1", "z"))

    other = ask(memory, model="n1")
    elsewhere = ask(memory, model="z")

    head, body = answer(other)
    assert head.startswith(b"HTTP/1.1 403")
    assert body["error"]["message"] == "model 'n1' is not allowed for key alice"
    assert answer(elsewhere)[1]["error"]["message"] == "model 'z' is not served on route lab"
    assert memory.waiting == []  # no host saw either


def test_a_key_past_its_loads_a_minute_is_answered_429_with_retry_after() -> None:
    keys = [{"name": "alice", "key": ALICE, "max_loads_per_minute": 1}]
    memory = MemoryProxy(parse_config(config(keys, {"models_max": 2})))
    for name in ("gpu-a", "gpu-b"):
        memory.table.record_ok(name, ("m",), ("m", "n1", "n2"))

    ask(memory, model="n1")  # loads n1 somewhere: its one load this minute
    assert len(memory.waiting) == 1
    memory.clock.advance(20)
    refused = ask(memory, model="n2")

    head, body = answer(refused)
    assert head.startswith(b"HTTP/1.1 429") and head.endswith(b"\r\nRetry-After: 40")
    assert body["error"]["message"] == (
        "key alice: 1 model load in the last minute already (max_loads_per_minute);"
        " try again in 40 s"
    )
    assert len(memory.waiting) == 1


def test_a_load_a_keyed_request_makes_is_counted_once_for_its_key_in_usage() -> None:
    both = [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}]
    memory = MemoryProxy(parse_config(config(both, {"models_max": 2, "slots": 2})))
    for name in ("gpu-a", "gpu-b"):
        memory.table.record_ok(name, ("m",), ("m", "n1"))
    ask(memory, ALICE, model="n1")  # n1 loaded nowhere: a host loads it for alice
    ask(memory, ALICE, model="n1")  # while that load is under way: no second one
    ask(memory, BOB, model="m")  # m loaded: no load
    for host in (memory.accept(), memory.accept(), memory.accept()):
        host.send(OK)

    sums = MinuteSums()
    for record in memory.records:
        sums.add(record, memory.clock.seconds())
    loads = {place[4]: 0 for place in sums.rows}
    for place, row in sums.rows.items():
        loads[place[4]] += int(row[COUNTS.index("loads")])
    assert [record.loads for record in memory.records] == [1, 0, 0]
    assert loads == {"alice": 1, "bob": 0}


def test_calls_that_take_no_slot_never_wait_for_one_nor_hold_one() -> None:
    memory = MemoryProxy(parse_config(config([{"name": "alice", "key": ALICE}])), models=("m",))
    ask(memory), ask(memory)
    memory.accept(), memory.accept()  # every slot busy
    calls = [
        (b"GET", b"/v1/models"),
        (b"POST", b"/v1/messages/count_tokens"),
        (b"POST", b"/v1/chat/completions/input_tokens"),
        (b"GET", b"/health"),
        (b"GET", b"/props"),
        (b"OPTIONS", b"/v1/chat/completions"),
    ]
    for method, path in calls:
        ask(memory, path=path, method=method)

    assert len(memory.waiting) == len(calls)  # each sent on at once
    assert memory.traffic.queue.waiting() == 0
    assert sum(memory.traffic.busy.values()) == 2  # only the two generating


def test_a_key_removed_while_its_request_waited_is_answered_401_as_it_leaves() -> None:
    both = [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}]
    memory = MemoryProxy(parse_config(config(both)), models=("m",))
    ask(memory, BOB), ask(memory, BOB)
    first, _ = memory.accept(), memory.accept()
    waiting = ask(memory)
    memory.waits.configure(parse_config(config([{"name": "bob", "key": BOB}])))  # a reload

    first.send(OK)

    head, body = answer(waiting)
    assert head.startswith(b"HTTP/1.1 401")
    assert (
        body["error"]["message"]
        == "unauthorized: the key was removed from the config while it waited"
    )
    assert memory.waiting == []  # no host saw it


FAILED_LOAD = b'{"error":{"code":500,"message":"model name=n failed to load"}}'


def test_a_spilled_request_whose_load_failed_waits_again_and_is_served() -> None:
    memory = MemoryProxy(
        parse_config(config([{"name": "alice", "key": ALICE}], {"models_max": 2}, spillover=True))
    )
    memory.table.record_ok("gpu-a", ("n",), ("n",))
    memory.table.record_ok("gpu-b", ("x",), ("n", "x"))  # a free instance to load n in
    ask(memory, model="n")
    busy = memory.accept()  # gpu-a's one slot for n taken
    spilled = ask(memory, model="n")  # spills to gpu-b, which cannot load n
    failing = memory.accept()
    assert failing.host == "gpu-b"

    failing.send(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(FAILED_LOAD), FAILED_LOAD)
    )
    memory.clock.advance(0)
    assert spilled.received == b"" and memory.traffic.queue.waiting() == 1  # waits again
    state = memory.table.view["gpu-b"]
    assert state.load_failures.backed_off("n", memory.clock.seconds())
    busy.send(OK)  # gpu-a frees its slot: the request goes there (on the kept connection)
    assert busy.received.count(b"POST /v1/chat/completions") == 2
    busy.send(OK)

    assert spilled.received.startswith(b"HTTP/1.1 200 OK")
    assert b"X-Crossbar-Host: gpu-a" in spilled.received
    assert b"failed to load" not in spilled.received


def test_a_500_that_is_no_failed_load_is_tried_elsewhere_and_the_last_one_relayed() -> None:
    memory = MemoryProxy(parse_config(config([{"name": "alice", "key": ALICE}])))
    memory.table.record_ok("gpu-a", (), ("n",))
    memory.table.record_ok("gpu-b", (), ("n",))
    client = ask(memory, model="n")
    words = b'{"error":{"message":"out of memory"}}'
    failed = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (
        len(words),
        words,
    )
    first = memory.accept()
    first.send(failed)
    assert client.received == b""  # held: another host may answer
    second = memory.accept()
    assert {first.host, second.host} == {"gpu-a", "gpu-b"}
    second.send(failed)

    assert client.received.startswith(b"HTTP/1.1 500")
    assert client.received.endswith(words)
    assert memory.waiting == []
    state = memory.table.view[first.host]
    assert not state.load_failures.backed_off("n", memory.clock.seconds())
