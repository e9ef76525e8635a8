"""crossbar.proxy.exchange with saved prefixes: a new conversation's first turn is sent only
once its shared prefix was restored on its host; a client that leaves meanwhile is never
sent; a host that does not answer the restore holds the turn two seconds at most. Without
sockets: MemoryProxy for the turn, StubTreq for the slot asks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from crossbar.prefixes import PrefixCounts, PrefixKeeper, PrefixSaves
from crossbar.prefixes.keeper import TIMEOUT
from crossbar.proxy.shapes import read_conversation
from crossbar.testing import MemoryProxy
from tests.support.exchange import BODY, ask, config

ANSWERS = {
    b"/props": {"build_info": "b1", "media_marker": "x"},
    b"/slots": [{"id": 0, "is_processing": False}],
    b"/slots/0": {"n_restored": 900},
}


class HeldHost(Resource):
    """Every slot ask waits until the test answers it (:meth:`answer`)."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Request] = []

    def render(self, request: Request) -> Any:
        self.held.append(request)
        return NOT_DONE_YET

    def answer(self, stub: StubTreq) -> bytes:
        """Answers the oldest ask as llama-server would; its path."""
        request = self.held.pop(0)
        request.write(json.dumps(ANSWERS[request.path]).encode())
        request.finish()
        stub.flush()
        return request.path  # type: ignore[no-any-return]


@pytest.fixture
def held() -> HeldHost:
    return HeldHost()


@pytest.fixture
def stub(held: HeldHost) -> StubTreq:
    return StubTreq(held)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def proxy(stub: StubTreq, clock: Clock) -> MemoryProxy:
    conversation = read_conversation(b"/v1/chat/completions", BODY, "m")
    assert conversation is not None and conversation.prefix is not None
    saves = PrefixSaves(lambda host: 8)
    for host in ("gpu-a", "gpu-b"):
        saves.saved(host, ("m", "b1 x", conversation.prefix), "crossbar-prefix-0.bin", 900)
    urls = {"gpu-a": "http://a", "gpu-b": "http://b"}
    keeper = PrefixKeeper(stub, urls, clock, saves, PrefixCounts())
    return MemoryProxy(config("cache_affinity"), ("m",), prefixes=keeper)


def test_the_turn_is_sent_once_its_prefix_is_restored(
    proxy: MemoryProxy, held: HeldHost, stub: StubTreq
) -> None:
    ask(proxy)
    assert proxy.waiting == []  # restoring first
    assert [held.answer(stub) for _ in range(2)] == [b"/props", b"/slots"]
    assert proxy.waiting == []
    assert held.answer(stub) == b"/slots/0"
    assert len(proxy.waiting) == 1


def test_a_client_that_left_during_the_restore_is_never_sent(
    proxy: MemoryProxy, held: HeldHost, stub: StubTreq
) -> None:
    client = ask(proxy)
    client.leave()
    proxy.clock.advance(0)
    for _ in range(3):
        held.answer(stub)
    assert proxy.waiting == []
    [record] = proxy.records
    assert record.status == 499 and record.host is not None
    assert proxy.traffic.in_flight[record.host] == 0  # its slot freed at once


def test_a_restore_never_answered_holds_the_turn_two_seconds_at_most(
    proxy: MemoryProxy, held: HeldHost, stub: StubTreq, clock: Clock
) -> None:
    ask(proxy)
    clock.advance(TIMEOUT - 0.1)
    assert proxy.waiting == []
    clock.advance(0.1)
    assert len(proxy.waiting) == 1
