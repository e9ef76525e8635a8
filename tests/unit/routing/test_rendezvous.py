"""crossbar.routing.rendezvous: the orders every replica computes alike from a key alone."""

from __future__ import annotations

import random
from collections import Counter

from crossbar.routing.rendezvous import rank, ranked_hosts, rendezvous, take_slot

HOSTS = ["gpu-a", "gpu-b", "gpu-c"]
SLOTS = {"gpu-a": 4, "gpu-b": 4, "gpu-c": 4}


def keys(count: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(16) for _ in range(count)]


def test_every_replica_computes_the_same_home_whatever_the_host_order() -> None:
    for key in keys(200):
        assert rendezvous(key, HOSTS) == rendezvous(key, HOSTS[::-1])


def test_losing_a_host_moves_only_its_own_conversations() -> None:
    before = {key: rendezvous(key, HOSTS)[0] for key in keys(3000)}
    after = {key: rendezvous(key, ["gpu-a", "gpu-c"])[0] for key in before}
    moved = {key for key in before if before[key] != after[key]}
    assert moved == {key for key, home in before.items() if home == "gpu-b"}
    shares = Counter(before.values())
    assert all(800 < shares[host] < 1200 for host in HOSTS), shares


def test_adding_a_host_moves_conversations_only_to_it() -> None:
    before = {key: rendezvous(key, HOSTS)[0] for key in keys(3000)}
    after = {key: rendezvous(key, [*HOSTS, "gpu-d"])[0] for key in before}
    moved = [key for key in before if before[key] != after[key]]
    assert {after[key] for key in moved} == {"gpu-d"}
    assert 600 < len(moved) < 900  # about a quarter


def test_the_ranking_depends_on_the_set_alone_and_fills_slots() -> None:
    conversations = keys(40, seed=3)
    ranked = ranked_hosts(conversations, HOSTS, {"gpu-a": 4, "gpu-b": 4})
    assert (
        ranked_hosts(reversed(conversations), list(reversed(HOSTS)), {"gpu-a": 4, "gpu-b": 4})
        == ranked
    )
    counts = Counter(ranked.values())
    assert counts["gpu-a"] == counts["gpu-b"] == 4  # full; gpu-c has no slots: no limit
    assert counts["gpu-c"] == 32
    crowded = ranked_hosts(conversations, HOSTS, SLOTS)  # 40 for 12 slots
    by_rank = sorted(conversations, key=rank, reverse=True)
    assert Counter(crowded[k] for k in by_rank[:12]) == Counter(SLOTS)
    assert all(crowded[k] == rendezvous(k, HOSTS)[0] for k in by_rank[12:])  # no room: home


def test_a_conversation_takes_its_first_host_with_a_slot_left_else_its_home() -> None:
    key = b"k" * 16
    home, second = rendezvous(key, HOSTS)[:2]
    slots = {home: 1, second: 1}
    taken = dict.fromkeys(HOSTS, 0)
    assert take_slot(key, HOSTS, slots, taken) == home
    assert take_slot(key, HOSTS, slots, taken) == second  # the home's one slot is taken
    full = dict.fromkeys(HOSTS, 1)
    assert take_slot(key, [home, second], slots, full) == home  # no slot anywhere: home
    assert (taken[home], taken[second], full[home]) == (1, 1, 2)
