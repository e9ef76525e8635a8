"""crossbar.proxy.exchange with placements shared (workers, replicas): a turn whose
conversation was placed anew is sent only once the other processes know its host, so that
its next turn, in whichever process, goes to the same host; a client that leaves meanwhile
is never sent; a turn whose host the others know goes at once. Without sockets."""

from __future__ import annotations

from twisted.internet.defer import Deferred

from crossbar.testing import MemoryProxy
from tests.support.exchange import ask, config


class Others:
    """The other processes: each new host of a conversation is told when the test says."""

    def __init__(self, known: bool = False) -> None:
        self.known = known
        self.asked: list[bytes] = []
        self.held: list[Deferred[None]] = []

    def told(self, key: bytes) -> Deferred[None] | None:
        self.asked.append(key)
        if self.known:
            return None
        held: Deferred[None] = Deferred()
        self.held.append(held)
        return held


def test_a_turn_placed_anew_is_sent_once_the_others_know_its_host() -> None:
    others = Others()
    proxy = MemoryProxy(config("cache_affinity"), ("m",), placements=others)
    ask(proxy)
    assert len(others.asked) == 1 and len(others.asked[0]) == 16  # the conversation's key
    assert proxy.waiting == []
    others.held[0].callback(None)
    assert len(proxy.waiting) == 1


def test_a_turn_whose_host_the_others_know_goes_at_once() -> None:
    proxy = MemoryProxy(config("cache_affinity"), ("m",), placements=Others(known=True))
    ask(proxy)
    assert len(proxy.waiting) == 1


def test_a_client_that_left_while_its_turn_was_held_is_never_sent() -> None:
    others = Others()
    proxy = MemoryProxy(config("cache_affinity"), ("m",), placements=others)
    client = ask(proxy)
    client.leave()
    proxy.clock.advance(0)
    others.held[0].callback(None)
    assert proxy.waiting == []
    [record] = proxy.records
    assert record.status == 499
    assert record.host is not None and proxy.traffic.in_flight[record.host] == 0


def test_a_policy_that_places_no_conversation_never_waits() -> None:
    others = Others()
    proxy = MemoryProxy(config("least_busy"), ("m",), placements=others)
    ask(proxy)
    assert others.asked == [] and len(proxy.waiting) == 1
