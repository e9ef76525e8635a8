"""crossbar.sharing.placescript against a real redis-server: placements put by one replica
are read by another from where it left off, a later turn is never overwritten by an
earlier one, the store keeps only live placements and at most so many, and what another
process wrote there is left out when malformed.

A placement's life is the store's clock's: it is made 100 ms here, and the test waits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_twisted
import txredisapi
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.task import deferLater

from crossbar.routing.sharedplacements import Placed
from crossbar.sharing.storeplacements import StorePlacements, load_published, placed_channel
from tests.support.redis import running_redis

A, B = bytes(16), bytes([1] * 16)
PORT: list[int] = []
"""The running store's port, for a test's second connection."""


@pytest_twisted.async_yield_fixture
async def connection(tmp_path: Path) -> AsyncIterator[Any]:
    with running_redis(tmp_path) as server:
        PORT[:] = [server.port]
        opened = await txredisapi.Connection(
            "127.0.0.1", server.port, reconnect=False, convertNumbers=False
        )
        try:
            yield opened
        finally:
            await opened.disconnect()


def where(heard: Any) -> dict[bytes, tuple[str, int]]:
    return {p.key: (p.host, p.turn) for p in heard.placed}


@pytest_twisted.ensureDeferred
async def test_a_replica_reads_what_another_put_from_where_it_left_off(connection: Any) -> None:
    store = StorePlacements(connection)
    await store.put("replica-1", [Placed(A, "gpu-a", 0)])
    first = await store.since(0)
    assert where(first) == {A: ("gpu-a", 0)}
    assert where(await store.since(0, "replica-1")) == {}  # its own, known there already
    assert first.placed[0].age < 5
    await store.put("replica-2", [Placed(B, "gpu-b", 0), Placed(A, "gpu-c", 1)])
    later = await store.since(first.seq)
    assert where(later) == {B: ("gpu-b", 0), A: ("gpu-c", 1)}  # only what is new
    assert where(await store.since(later.seq)) == {}


@pytest_twisted.ensureDeferred
async def test_an_earlier_turn_never_overwrites_a_later_one(connection: Any) -> None:
    store = StorePlacements(connection)
    await store.put("replica-1", [Placed(A, "gpu-a", 3)])
    kept = await store.put("replica-2", [Placed(A, "gpu-b", 2)])  # late, and behind
    assert kept == 0
    assert where(await store.since(0)) == {A: ("gpu-a", 3)}


@pytest_twisted.ensureDeferred
async def test_a_store_emptied_is_read_from_its_start(connection: Any) -> None:
    store = StorePlacements(connection)
    await store.put("replica-1", [Placed(A, "gpu-a", 0)])
    read = await store.since(0)
    await connection.execute_command("FLUSHDB")  # a new store, its sequence back to 0
    await store.put("replica-2", [Placed(B, "gpu-b", 0)])
    assert where(await store.since(read.seq + 10)) == {B: ("gpu-b", 0)}


@pytest_twisted.ensureDeferred
async def test_only_live_placements_are_kept_and_at_most_so_many(connection: Any) -> None:
    brief = StorePlacements(connection, life=0.1)
    await brief.put("replica-1", [Placed(A, "gpu-a", 0)])
    await deferLater(reactor, 0.15, lambda: None)
    await brief.put("replica-1", [Placed(B, "gpu-b", 0)])  # each put drops the dead first
    assert where(await brief.since(0)) == {B: ("gpu-b", 0)}
    few = StorePlacements(connection, most=3)
    keys = [bytes([n] * 16) for n in range(10, 16)]
    await few.put("replica-1", [Placed(key, "gpu-a", 0) for key in keys])
    assert set(where(await few.since(0))) == set(keys[:3])  # at most 3 a call
    await few.put("replica-1", [Placed(key, "gpu-a", 1) for key in keys[3:]])
    assert set(where(await few.since(0))) == set(keys[3:])  # the latest 3 kept


@pytest_twisted.ensureDeferred
async def test_what_another_process_wrote_is_left_out_when_malformed(connection: Any) -> None:
    store = StorePlacements(connection)
    await store.put("replica-1", [Placed(A, "gpu-a", 0)])
    hash_key, order = store.keys[0], store.keys[1]
    malformed = [("zz" * 16, '["gpu-a",0,1,"r"]'), ("ab" * 16, "not json"),
                 ("cd" * 16, '["gpu-a","x",1,"r"]'), ("short", '["gpu-a",0,1,"r"]')]  # fmt: skip
    for key, value in malformed:
        await connection.hset(hash_key, key, value)
        await connection.zadd(order, 100, key)
    assert where(await store.since(0)) == {A: ("gpu-a", 0)}


@pytest_twisted.ensureDeferred
async def test_a_put_is_published_with_what_was_kept(connection: Any) -> None:
    heard: list[str] = []

    class Listener(txredisapi.SubscriberProtocol):  # type: ignore[misc]
        def messageReceived(self, pattern: object, channel: str, message: str) -> None:
            heard.append(message)

    factory = txredisapi.SubscriberFactory()
    factory.protocol = Listener
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", PORT[0])
    listener = await endpoint.connect(factory)
    try:
        await listener.subscribe([placed_channel()])
        store = StorePlacements(connection)
        await store.put("replica-1", [Placed(A, "gpu-a", 3)])
        await store.put("replica-2", [Placed(A, "gpu-b", 2)])  # behind: not kept, not told
        await deferLater(reactor, 0.05, lambda: None)
        assert [json.loads(m) for m in heard] == [["replica-1", [[A.hex(), "gpu-a", 3]]]]
        assert load_published(heard[0], "replica-2") == [Placed(A, "gpu-a", 3)]
    finally:
        listener.transport.loseConnection()
