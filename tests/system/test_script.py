"""crossbar.sharing.script against a real redis-server: the store's ledger follows the same
rules as :class:`~crossbar.sharing.ledger.SlotLedger` (the same views, the same member
offered a freed slot), and adds what only a store can do for replicas: leases and offers
that run out by the store's own clock, a member that leaves or dies with its slots offered
to the requests waiting for them, and whatever another process wrote there left out.

The store's clock cannot be a test's: a lease or an offer's time is made 100 ms here, and
the test waits that long."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import txredisapi
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from crossbar.sharing.ledger import Holding, SlotLedger
from crossbar.sharing.store import PREFIX, StoreLedger, changes_channel, offers_channel
from tests.support.redis import RedisServer, running_redis

SLOT = ("gpu-a", "m")
CHAT = ("lab", "m")
HOME = ("lab", "m", "gpu-a")
SHORT = 0.1


class Listener(txredisapi.SubscriberProtocol):  # type: ignore[misc]
    """Every message on the channels it subscribed to, in order."""

    heard: list[tuple[str, str]]

    def messageReceived(self, pattern: object, channel: str, message: str) -> None:
        self.heard.append((channel, message))


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with running_redis(tmp_path) as server:
        yield server


async def opened(store: RedisServer) -> tuple[Any, StoreLedger, StoreLedger, StoreLedger]:
    """The store's connection (closed after the test), a ledger, one whose offers last
    100 ms, and one whose leases do."""
    connection = await txredisapi.Connection(
        "127.0.0.1", store.port, reconnect=False, convertNumbers=False
    )
    OPEN.append(connection)
    quick = StoreLedger(connection, offer_time=SHORT)
    brief = StoreLedger(connection, lease=SHORT)
    return connection, StoreLedger(connection), quick, brief


OPEN: list[Any] = []


@pytest.fixture(autouse=True)
def closing() -> Any:
    yield
    while OPEN:
        OPEN.pop().disconnect()


async def listening(server: RedisServer, *channels: str) -> Listener:
    factory = txredisapi.SubscriberFactory()
    factory.protocol = Listener
    from twisted.internet.endpoints import TCP4ClientEndpoint

    listener = await TCP4ClientEndpoint(reactor, "127.0.0.1", server.port).connect(factory)
    listener.heard = []
    await listener.whenConnected()
    await listener.subscribe(list(channels))
    return listener


def pause(seconds: float) -> Deferred[None]:
    return deferLater(reactor, seconds, lambda: None)


MEMBERS = {
    "w1": Holding({SLOT: 2}, {CHAT: (1, 0, 10.0, "alice")}, {"alice": 1, "bob": 1}),
    "w2": Holding({SLOT: 1, ("gpu-b", None): 1}, {HOME: (1, 0, 12.0, "carol")}, {"carol": 1}),
    "w3": Holding({}, {CHAT: (1, 0, 11.0, "bob")}, {}),
}


async def report_all(ledger: StoreLedger) -> SlotLedger:
    mirror = SlotLedger()
    for name, holding in MEMBERS.items():
        await ledger.report(name, holding)
        mirror.report(name, holding, 0.0)
    return mirror


@pytest_twisted.ensureDeferred
async def test_each_member_is_shown_what_the_ledger_shows_it(store: RedisServer) -> None:
    ledgers = await opened(store)
    _, ledger, _, _ = ledgers
    mirror = await report_all(ledger)
    stored = await ledger.read()
    assert set(stored.reports) == set(MEMBERS)
    for name in MEMBERS:
        assert stored.view(name).others == mirror.others(name), name


@pytest_twisted.ensureDeferred
async def test_a_freed_slot_is_offered_where_the_ledger_offers_it(store: RedisServer) -> None:
    ledgers = await opened(store)
    _, ledger, _, _ = ledgers
    mirror = await report_all(ledger)
    listener = await listening(store, changes_channel(), offers_channel("w3"))
    to = await ledger.give("w2", SLOT, [CHAT, HOME], 1)
    mirror.give("w2", SLOT)
    # bob (w3) came at 11.0 but has one request in flight (in w1); carol's at 12.0 has one
    # too; alice's (w1) at 10.0 has one: band, then flows in flight, then first come
    assert to == mirror.offer(SLOT, [CHAT, HOME]) == "w1"
    stored = await ledger.read()
    assert stored.reports["w2"].counts == {("gpu-b", None): 1}  # the slot given
    assert stored.offered == (("w1", SLOT),) and stored.gifts == {"w2": 1}
    assert stored.view("w3").others == mirror.others("w3")  # counted as w1's meanwhile
    await ledger.answer("w1", "1", took=False)  # w1 passes it on: the next is w3's bob
    await pause(0.05)
    assert ("crossbar:offer:w3", '{"id":"2","slot":"[\\"gpu-a\\",\\"m\\"]"}') in listener.heard
    assert (await ledger.read()).offered == (("w3", SLOT),)
    await ledger.answer("w3", "2", took=True)
    assert (await ledger.read()).offered == ()
    assert ("crossbar:changed", "w2") in listener.heard
    listener.transport.loseConnection()


@pytest_twisted.ensureDeferred
async def test_only_the_member_offered_answers_for_an_offer(store: RedisServer) -> None:
    ledgers = await opened(store)
    _, ledger, _, _ = ledgers
    await report_all(ledger)
    await ledger.give("w2", SLOT, [CHAT], 1)
    await ledger.answer("w3", "1", took=True)  # not offered to w3: nothing changes
    assert (await ledger.read()).offered == (("w1", SLOT),)


@pytest_twisted.ensureDeferred
async def test_an_offer_not_answered_in_time_goes_to_the_next(store: RedisServer) -> None:
    ledgers = await opened(store)
    _, _, short, _ = ledgers
    await short.report("w1", Holding({SLOT: 1}, {CHAT: (1, 0, 1.0, "alice")}, {}))
    await short.report("w2", Holding({SLOT: 1}, {CHAT: (1, 0, 2.0, "bob")}, {}))
    await short.report("w3", Holding({SLOT: 1}))
    assert await short.give("w3", SLOT, [CHAT], 1) == "w1"
    await pause(SHORT * 1.5)  # w1 silent about its offer
    assert (await short.read()).offered == (("w2", SLOT),)


@pytest_twisted.ensureDeferred
async def test_a_member_silent_for_a_lease_is_dropped_and_its_slots_offered(
    store: RedisServer,
) -> None:
    ledgers = await opened(store)
    _, _, _, short = ledgers
    await short.report("dead", Holding({SLOT: 2}, {}, {"carol": 2}))
    await pause(SHORT * 1.5)
    await short.report("w1", Holding({}, {CHAT: (1, 0, 1.0, "alice")}, {}))  # runs the sweep
    stored = await short.read()
    assert "dead" not in stored.reports
    assert stored.offered == (("w1", SLOT), ("w1", SLOT))  # w1 answers for each
    assert await short.beat("dead") is False  # it reports again when it comes back


@pytest_twisted.ensureDeferred
async def test_a_member_that_leaves_frees_its_slots_at_once(store: RedisServer) -> None:
    ledgers = await opened(store)
    _, ledger, _, _ = ledgers
    await ledger.report("w1", Holding({}, {HOME: (1, 0, 1.0, "alice")}, {}))
    await ledger.report("w2", Holding({SLOT: 1}, {}, {}))
    await ledger.leave("w2")
    stored = await ledger.read()
    assert set(stored.reports) == {"w1"}
    assert stored.offered == (("w1", SLOT),)  # w2's slot serves w1's request at gpu-a
    await ledger.leave("w2")  # twice: nothing more


@pytest_twisted.ensureDeferred
async def test_what_another_process_wrote_there_is_left_out(store: RedisServer) -> None:
    ledgers = await opened(store)
    connection, ledger, _, _ = ledgers
    await connection.hset(PREFIX + "reports", "junk", "{not json")
    await connection.hset(PREFIX + "reports", "odd", '{"heads":{"[\\"lab\\",\\"m\\"]":"x"}}')
    await connection.hset(PREFIX + "offers", "99", "[1,2")
    await ledger.report("w1", Holding({SLOT: 1}, {CHAT: (1, 0, 1.0, "alice")}, {}))
    assert await ledger.give("w1", SLOT, [CHAT], 1) == "w1"  # the script runs on
    stored = await ledger.read()
    assert set(stored.reports) == {"w1", "odd"} and stored.reports["odd"] == Holding()
