"""The fair queue's rules (crossbar.queueing.queue): which waiting request a freed slot takes,
what is refused and in which words, and that a flood of clients costs bounded memory and
time. Pure: each call is given the time, nothing waits."""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import defaultdict
from itertools import count

import pytest

from crossbar.queueing.queue import FairQueue, Flow, PoolLimit, Refused, Waiting

T0 = 1_700_000_000.0
POOL = ("opencode", "qwen")
OTHER = ("opencode", "llama")


def queued(q: FairQueue[str], pool: object, flow: Flow, item: str, now: float = T0) -> Waiting[str]:
    got = q.push(pool, flow, item, now)
    assert isinstance(got, Waiting), got
    return got


def drain(q: FairQueue[str], pools: list[object], now: float = T0) -> list[str]:
    """Pop until nothing is left for ``pools`` (the popped stay in flight)."""
    out = []
    while (got := q.pop(pools, now)) is not None:
        out.append(got.item)
    return out


def test_bands_are_strict() -> None:
    q: FairQueue[str] = FairQueue()
    batch, chat = Flow("nightly", band=1), Flow("alice", band=0)
    for _ in range(4):
        q.started(chat, T0)  # alice is busy and has used a lot: her band still goes first
    q.finished(chat, 5000.0, T0)
    queued(q, POOL, batch, "n1")
    queued(q, POOL, chat, "a1")
    queued(q, POOL, batch, "n2")
    queued(q, POOL, chat, "a2")

    assert drain(q, [POOL]) == ["a1", "a2", "n1", "n2"]


def test_the_flow_with_the_least_service_goes_first_not_the_one_that_queued_most() -> None:
    q: FairQueue[str] = FairQueue()
    many, few, one = Flow("many"), Flow("few"), Flow("one")
    for i in range(5):
        queued(q, POOL, many, f"m{i}")
    for i in range(2):
        queued(q, POOL, few, f"f{i}")
    queued(q, POOL, one, "o0")

    # each pop puts one more in flight for its flow: the next goes to one with fewer
    assert drain(q, [POOL]) == ["m0", "f0", "o0", "m1", "f1", "m2", "m3", "m4"]


def test_requests_in_flight_count_before_any_past() -> None:
    q: FairQueue[str] = FairQueue()
    heavy, veteran = Flow("heavy"), Flow("veteran")
    for _ in range(16):
        q.started(heavy, T0)
    q.started(veteran, T0)
    q.finished(veteran, 50_000.0, T0)  # a long past, but nothing running now
    queued(q, POOL, heavy, "h")
    queued(q, POOL, veteran, "v")

    assert q.pop([POOL], T0).item == "v"  # type: ignore[union-attr]


def simulate(seconds: float) -> tuple[dict[str, list[float]], float, dict[str, float]]:
    """The issue's scenario: 6 slots, each request holding one 12 s, so one slot frees
    every 2 s; "batch-bot" keeps 16 requests going; alice, bob and carol send one at a
    time, 1 s after their last answer. Returns the light flows' waits, Jain's index of
    slot-time over each flow's max-min fair share, and the queue's shares at the end."""
    hold, think, slots = 12.0, 1.0, 6
    q: FairQueue[str] = FairQueue()
    heavy = Flow("batch-bot")
    flows = {name: Flow(name) for name in ("batch-bot", "alice", "bob", "carol")}
    events: list[tuple[float, int, str, str, float]] = []
    order = count()
    for i in range(slots):  # all six slots busy with batch-bot's, ending 2 s apart
        q.started(heavy, 0.0)
        heapq.heappush(events, (2.0 * (i + 1), next(order), "free", heavy.name, 0.0))
    for _ in range(16 - slots):
        queued(q, POOL, heavy, heavy.name, 0.0)
    for i, name in enumerate(("alice", "bob", "carol")):
        heapq.heappush(events, (0.5 * (i + 1), next(order), "arrive", name, 0.0))
    waits: dict[str, list[float]] = defaultdict(list)
    used: dict[str, float] = defaultdict(float)
    asked: dict[str, float] = defaultdict(float)  # light flows: seconds with one outstanding
    now, free = 0.0, 0
    while events and events[0][0] <= seconds:
        now, _, kind, name, arrived = heapq.heappop(events)
        if kind == "arrive":
            queued(q, POOL, flows[name], name, now)
        else:
            q.finished(flows[name], hold, now)
            used[name] += hold
            free += 1
            if name == heavy.name:
                queued(q, POOL, heavy, name, now)
            else:
                asked[name] += now - arrived
                heapq.heappush(events, (now + think, next(order), "arrive", name, 0.0))
        while free and (got := q.pop([POOL], now)) is not None:
            free -= 1
            if got.flow != heavy:
                waits[got.item].append(now - got.arrived)
            heapq.heappush(events, (now + hold, next(order), "free", got.item, got.arrived))
    # Max-min fair shares: a light flow can use one slot while it has a request out (less
    # than 6 slots / 4 flows), so its share is that time; batch-bot's is all the rest.
    fair = dict(asked)
    fair[heavy.name] = slots * now - sum(asked.values())
    x = [used[name] / fair[name] for name in fair]
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x))
    return waits, jain, q.shares(now)


def test_light_flows_wait_about_one_slot_interval_beside_a_heavy_one() -> None:
    waits, jain, shares = simulate(3600.0)
    every = [w for name in ("alice", "bob", "carol") for w in waits[name]]
    mean = sum(every) / len(every)
    print(
        f"\nlight waits: mean {mean:.2f} s, max {max(every):.2f} s over {len(every)} requests;"
        f" Jain's index {jain:.3f}; shares of the last 5 min "
        + ", ".join(f"{name} {share:.2f}" for name, share in sorted(shares.items()))
    )

    # a slot frees every 2 s: a light request waits for the next one, not behind the
    # ten of batch-bot's already waiting (about 20 s first come first served)
    assert mean <= 2.0
    assert max(every) <= 3 * 2.0  # at worst all three arrived within one interval
    assert jain >= 0.95
    # each light flow holds a slot 12 s of every 14 (1 s thinking, 1 s waiting)
    assert shares["alice"] == pytest.approx(12 / 14 / 6, abs=0.02)
    assert shares["batch-bot"] == pytest.approx(1 - 3 * 12 / 14 / 6, abs=0.03)


def test_first_come_first_served_within_a_flow_in_each_pool() -> None:
    q: FairQueue[str] = FairQueue()
    alice = Flow("alice")
    for i in range(4):
        queued(q, POOL, alice, f"qwen{i}", T0 + i)
        queued(q, OTHER, alice, f"llama{i}", T0 + i)

    assert drain(q, [OTHER]) == ["llama0", "llama1", "llama2", "llama3"]
    assert drain(q, [POOL]) == ["qwen0", "qwen1", "qwen2", "qwen3"]


def test_a_slot_serving_two_pools_takes_the_earlier_arrival_among_equals() -> None:
    q: FairQueue[str] = FairQueue()
    queued(q, ("elsewhere",), Flow("carol"), "not ours", T0)
    queued(q, POOL, Flow("alice"), "early", T0 + 1)
    queued(q, OTHER, Flow("bob"), "late", T0 + 2)

    assert drain(q, [OTHER, POOL], T0 + 3) == ["early", "late"]
    assert q.waiting() == 1


def test_max_waiting_per_flow_is_refused_in_words() -> None:
    q: FairQueue[str] = FairQueue()
    alice = Flow("alice", max_waiting=32)
    for i in range(32):
        queued(q, POOL if i % 2 else OTHER, alice, str(i), T0)

    refused = q.push(POOL, alice, "33rd", T0 + 7.2)
    assert refused == Refused(429, "alice: 32 requests already waiting", retry_after=8)
    assert q.waiting() == 32
    queued(q, POOL, Flow("bob"), "others still wait", T0 + 7.2)
    never = q.push(POOL, Flow("carol", max_waiting=0), "x", T0)
    assert never == Refused(429, "carol: every slot is busy, none may wait", 1)


def test_max_waiting_per_pool_is_refused_in_words() -> None:
    q: FairQueue[str] = FairQueue()
    limit = PoolLimit("opencode", 64)
    for i in range(64):
        got = q.push(POOL, Flow(f"agent-{i % 8}"), str(i), T0 + i / 100, pool_limit=limit)
        assert isinstance(got, Waiting)

    refused = q.push(POOL, Flow("agent-9"), "65th", T0 + 3.0, pool_limit=limit)
    assert refused == Refused(429, "opencode: 64 requests already waiting", retry_after=3)
    queued(q, OTHER, Flow("agent-9"), "another pool has room")
    q.pop([POOL], T0 + 3)
    again = q.push(POOL, Flow("agent-9"), "room again", T0 + 3, pool_limit=limit)
    assert isinstance(again, Waiting)


def test_a_flow_at_max_in_flight_is_passed_over_without_blocking_others() -> None:
    q: FairQueue[str] = FairQueue()
    capped, other = Flow("capped", max_in_flight=2), Flow("other")
    for i in range(4):
        queued(q, POOL, capped, f"c{i}", T0)
    queued(q, POOL, other, "o0", T0 + 1)
    queued(q, POOL, other, "o1", T0 + 1)

    assert drain(q, [POOL]) == ["c0", "o0", "c1", "o1"]
    assert q.pop([POOL], T0) is None  # c2 waits: capped has 2 running
    assert q.flow("capped") == (2, 2)

    q.finished(capped, 3.0, T0 + 3)
    assert drain(q, [POOL], T0 + 3) == ["c2"]


def test_a_client_that_leaves_is_never_popped() -> None:
    q: FairQueue[str] = FairQueue()
    alice, bob = Flow("alice"), Flow("bob")
    first = queued(q, POOL, alice, "a0", T0)
    middle = queued(q, POOL, alice, "a1", T0 + 1)
    queued(q, POOL, alice, "a2", T0 + 2)
    only = queued(q, POOL, bob, "b0", T0 + 3)

    q.remove(first)
    q.remove(middle)
    q.remove(only)
    q.remove(only)  # twice is nothing
    assert (q.waiting(POOL), q.flow("alice"), q.oldest(POOL, T0 + 10)) == (1, (1, 0), 8.0)
    assert drain(q, [POOL]) == ["a2"]
    assert q.waiting() == 0 and q.oldest(POOL, T0) is None


def test_expired_gives_the_requests_past_their_deadline_once() -> None:
    q: FairQueue[str] = FairQueue()
    alice = Flow("alice")
    soon = q.push(POOL, alice, "soon", T0, deadline=T0 + 30)
    q.push(POOL, alice, "later", T0, deadline=T0 + 60)
    q.push(POOL, alice, "never", T0, deadline=math.nan)  # no usable deadline: none
    gone = q.push(POOL, alice, "left", T0, deadline=T0 + 10)
    assert isinstance(gone, Waiting)
    q.remove(gone)

    assert q.expired(T0 + 29.9) == []
    assert q.expired(T0 + 30) == [soon]
    assert q.expired(T0 + 31) == []
    assert drain(q, [POOL], T0 + 31) == ["later", "never"]
    assert q.expired(T0 + 1e6) == []  # a popped request has no deadline here any more


def test_what_a_flow_used_long_ago_is_forgiven() -> None:
    q: FairQueue[str] = FairQueue(half_life=60.0)
    old, recent, other = Flow("old"), Flow("recent"), Flow("other")
    for flow, seconds, at in ((old, 1000.0, T0), (recent, 10.0, T0 + 590)):
        q.started(other, at)  # each beside another flow that wanted the slots too
        q.started(flow, at)
        q.finished(flow, seconds, at)  # a lot, ten minutes ago; a little, ten seconds ago
        q.finished(other, 0.0, at)
    queued(q, POOL, recent, "recent", T0 + 600)
    queued(q, POOL, old, "old", T0 + 600)

    # each took twice its share beside one other; old's excess has decayed away (it
    # starts level with a flow never seen), recent's has not
    queued(q, POOL, Flow("new"), "new", T0 + 600)
    assert q.service("old", T0 + 600) == q.service("new", T0 + 600)
    assert q.service("recent", T0 + 600) - q.service("new", T0 + 600) == pytest.approx(
        5 * 2 ** (-10 / 60)
    )
    assert drain(q, [POOL], T0 + 600) == ["old", "new", "recent"]


def test_days_and_years_of_uptime_never_overflow() -> None:
    q: FairQueue[str] = FairQueue(half_life=1.0)  # short: the exponent grows fastest
    a, b = Flow("a"), Flow("b")
    now = T0
    for _ in range(2000):  # an hour apart: 3600 half-lives at each step
        for flow, seconds in ((a, 2.0), (b, 1.0)):
            q.started(flow, now)
            q.finished(flow, seconds, now)
        now += 3600.0
    now = 1e15  # and far in the future
    for flow in (a, b):  # each with one running and one waiting
        q.started(flow, now)
        queued(q, POOL, flow, flow.name, now)
    q.finished(a, 2.0, now)
    q.finished(b, 1.0, now + 0.5)

    assert math.isfinite(q.service("a", now + 1)) and q.service("a", now + 1) == 1.0
    assert drain(q, [POOL], now + 1) == ["b", "a"]  # b: 1 s half a second earlier


def test_shares_of_slot_time_over_the_last_five_minutes() -> None:
    q: FairQueue[str] = FairQueue()
    for name, seconds in (("alice", 30.0), ("bob", 10.0)):
        q.started(Flow(name), T0)
        q.finished(Flow(name), seconds, T0)

    assert q.shares(T0 + 60) == {"alice": 0.75, "bob": 0.25}
    assert q.shares(T0 + 301) == {}


def test_a_flood_of_flows_is_forgotten() -> None:
    q: FairQueue[str] = FairQueue(max_flows=1000)
    roomy: FairQueue[str] = FairQueue(max_flows=1_000_000)
    now = T0
    for i in range(100_000):
        for queue in (q, roomy) if i % 10 == 0 else (q,):
            flow = Flow(f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}")
            queued(queue, POOL, flow, "x", now)
            queue.pop([POOL], now)
            queue.finished(flow, 0.5, now + 0.5)
        assert q.remembered <= 1000
        now += 0.01
    assert roomy.remembered > 1000  # the recent ones are remembered ...

    now += 3600.0  # ... until their service has decayed to nothing
    roomy.started(Flow("last"), now)
    assert roomy.remembered == 1
    assert roomy.waiting() == 0 and roomy.entries == 0


def test_ten_thousand_waiting_cost_log_time_and_linear_memory() -> None:
    q: FairQueue[int] = FairQueue()
    rng = random.Random(24)
    flows = [Flow(f"agent-{i}", band=i % 2, max_in_flight=8) for i in range(500)]
    pools = [("route", m) for m in range(4)]
    n = 10_000
    handles = []
    begin = time.perf_counter()
    for i in range(n):
        got = q.push(rng.choice(pools), rng.choice(flows), i, T0 + i / n, deadline=T0 + 60)
        assert isinstance(got, Waiting)
        handles.append(got)
    pushed = time.perf_counter() - begin
    most = q.entries
    for got in rng.sample(handles, n // 10):
        q.remove(got)  # a tenth leave
    popped, took, running = 0, 0.0, list[Waiting[int]]()
    while q.waiting():
        begin = time.perf_counter()
        next_one = q.pop(pools, T0 + 1)
        if next_one is None or len(running) >= 64:  # a slot frees: a request ends
            done = running.pop(rng.randrange(len(running)))
            q.finished(done.flow, rng.uniform(0.1, 30), T0 + 1)
        took += time.perf_counter() - begin
        if next_one is not None:
            running.append(next_one)
            popped += 1
        if popped % 50 == 0:
            most = max(most, q.entries)
            # each waiting request is in at most 4 places (its flow's line, its pool's,
            # the deadlines, a heap entry), and each may hold as many stale ones again,
            # plus the tenth removed from the middle of lines
            assert q.entries <= 8 * q.waiting() + n // 10 + 16 * 2 * len(pools)
    print(
        f"\n{n} waiting: push {pushed / n * 1e6:.1f} us, pop and finish"
        f" {took / popped * 1e6:.1f} us each; at most {most} heap and line entries"
    )
    assert popped == n - n // 10
    assert most <= 4 * n


def test_a_time_before_the_last_rescaling_is_answered_not_raised() -> None:
    q: FairQueue[str] = FairQueue(half_life=1.0)
    patient = queued(q, POOL, Flow("patient"), "waits", T0)
    q.started(Flow("done"), T0 + 86_400.0)  # a day later: t0 moves on
    q.finished(Flow("done"), 5.0, T0 + 86_400.0)

    # a page or a leaving client may carry a time from before then
    assert q.service("done", T0) == 5.0
    q.remove(patient)
    assert q.waiting() == 0


def test_first_says_whether_a_flow_asking_now_would_go_before_those_waiting() -> None:
    q: FairQueue[str] = FairQueue()
    alice, bob, batch = Flow("alice"), Flow("bob"), Flow("night", band=2)
    q.started(alice, T0)
    queued(q, POOL, alice, "a", T0)
    assert q.first("bob", [POOL]) is False  # never seen: nothing to go by
    q.started(bob, T0)
    q.finished(bob, 2.0, T0 + 2)
    assert q.first("bob", [POOL])  # none running against alice's one
    q.started(batch, T0)
    q.finished(batch, 0.1, T0 + 2)
    assert not q.first("night", [POOL])  # a lower band waits behind any higher one
    q.started(bob, T0 + 2)
    q.started(bob, T0 + 2)
    assert not q.first("bob", [POOL])  # two running now: alice's goes first


def test_a_new_flow_starts_level_with_those_served_not_ahead_of_them() -> None:
    q: FairQueue[str] = FairQueue()
    victim = Flow("victim")
    q.started(victim, T0)
    q.finished(victim, 12.0, T0 + 12)  # served alone: no more than its share
    queued(q, POOL, victim, "victim", T0 + 13)
    queued(q, POOL, Flow("10.0.0.7"), "newcomer", T0 + 13.5)

    assert drain(q, [POOL], T0 + 14) == ["victim", "newcomer"]


def rotating(seconds: float) -> list[float]:
    """The audit's attack on a keyless route: 4 slots, each request holding one 12 s;
    an attacker keeps 8 requests waiting, each from an address never seen before; the
    victim, from one address, sends one at a time, 1 s after its last answer. Returns
    the victim's waits (``inf`` for the one still waiting at the end)."""
    hold, think, slots, flood = 12.0, 1.0, 4, 8
    q: FairQueue[str] = FairQueue()
    victim, addresses = Flow("10.0.0.1"), count(2)
    events: list[tuple[float, int, str, Flow]] = []
    order = count()

    def attacker() -> Flow:
        n = next(addresses)
        return Flow(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")

    for i in range(slots):
        flow = attacker()
        q.started(flow, 0.0)
        heapq.heappush(events, (3.0 * (i + 1), next(order), "free", flow))
    heapq.heappush(events, (0.5, next(order), "arrive", victim))
    waits, asked = [], None
    while events and events[0][0] <= seconds:
        now, _, kind, flow = heapq.heappop(events)
        if kind == "arrive":
            queued(q, POOL, victim, "victim", now)
            asked = now
        else:
            q.finished(flow, hold, now)
            if flow is victim:
                heapq.heappush(events, (now + think, next(order), "arrive", victim))
            got = None
            while q.waiting() < flood or got is None:
                if q.waiting() < flood:
                    queued(q, POOL, attacker(), "attacker", now)
                    continue
                got = q.pop([POOL], now)
            if got.flow is victim:
                assert asked is not None
                waits.append(now - asked)
                asked = None
            heapq.heappush(events, (now + hold, next(order), "free", got.flow))
    return waits + ([math.inf] if asked is not None else [])


def test_many_addresses_do_not_keep_one_client_waiting_for_ever() -> None:
    waits = rotating(600.0)
    print(f"\nvictim's waits beside a rotating flood: {[round(w, 1) for w in waits]}")

    # 13 flows active (4 running, 8 waiting, the victim): each gets about a 13th of
    # the 4 slots, so the victim waits about 13 slot-frees of 3 s for each turn
    assert len(waits) >= 8
    assert max(waits) <= 13 * 3.0 + 3.0


LAB_POOLS = [("lab", "m1"), ("lab", "m2"), ("lab", "m1", "gpu-a")]  # models, a home host


def test_a_route_s_max_waiting_counts_every_pool_of_it() -> None:
    q: FairQueue[str] = FairQueue()
    limit = PoolLimit("lab", 4)
    for i in range(4):
        got = q.push(LAB_POOLS[i % 3], Flow(f"agent-{i}"), str(i), T0 + i, pool_limit=limit)
        assert isinstance(got, Waiting)

    for pool in LAB_POOLS:
        refused = q.push(pool, Flow("late"), "x", T0 + 5.5, pool_limit=limit)
        assert refused == Refused(429, "lab: 4 requests already waiting", 6)
    assert q.waiting() == 4
    queued(q, ("code", "m1"), Flow("late"), "another route has its own room")
    q.pop([("lab", "m2")], T0 + 6)
    assert isinstance(
        q.push(("lab", "m1"), Flow("late"), "room again", T0 + 6, None, limit), Waiting
    )


def test_a_request_moved_to_another_pool_of_its_route_keeps_its_one_place() -> None:
    q: FairQueue[str] = FairQueue()
    limit = PoolLimit("lab", 2)
    home = q.push(("lab", "m1", "gpu-a"), Flow("alice"), "turn", T0, T0 + 120, limit)
    assert isinstance(home, Waiting)
    queued_with = q.push(("lab", "m1"), Flow("bob"), "b", T0 + 1, pool_limit=limit)
    assert isinstance(queued_with, Waiting)
    q.remove(home)  # its home_wait is over: to any host of its group
    moved = q.push(("lab", "m1"), home.flow, home.item, T0 + 5, home.deadline, limit, home.arrived)
    assert isinstance(moved, Waiting) and moved.arrived == T0

    assert isinstance(q.push(("lab", "m2"), Flow("carol"), "c", T0 + 6, pool_limit=limit), Refused)


def test_a_full_room_sheds_the_newest_of_the_flow_holding_the_most_places() -> None:
    q: FairQueue[str] = FairQueue()
    limit, hog, carol = PoolLimit("lab", 20), Flow("hog"), Flow("carol", band=0)
    for i in range(20):
        assert isinstance(q.push(LAB_POOLS[i % 2], hog, f"h{i}", T0 + i / 10, None, limit), Waiting)
    assert isinstance(
        q.push(LAB_POOLS[2], carol, "c", T0 + 3, pool_limit=limit), Refused
    )  # as before

    made = q.make_room(carol, limit, T0 + 3)
    assert made is not None
    shed, refused = made
    assert shed.item == "h19" and not shed.live
    assert refused == Refused(
        429,
        "lab: 20 requests already waiting, 20 of them this client's, the most of any: its"
        " newest gave way to another client's",
        3,
    )
    assert isinstance(q.push(LAB_POOLS[2], carol, "c", T0 + 3, pool_limit=limit), Waiting)
    assert q.waiting() == 20 and q.flow("hog") == (19, 0)
    assert q.make_room(hog, limit, T0 + 3) is None  # the biggest holder makes none for itself
    assert q.make_room(Flow("dave", max_waiting=0), limit, T0 + 3) is None  # may not wait
    assert q.make_room(Flow("dave"), PoolLimit("lab", 21), T0 + 3) is None  # room left

    for i in range(18):  # one newcomer after another, each holding nothing yet
        newcomer = Flow(f"client-{i}")
        assert q.make_room(newcomer, limit, T0 + 4) is not None
        assert isinstance(q.push(LAB_POOLS[2], newcomer, "n", T0 + 4, pool_limit=limit), Waiting)
    assert q.flow("hog") == (1, 0)
    assert q.make_room(Flow("client-99"), limit, T0 + 4) is None  # each holds one: fair
    assert drain(q, LAB_POOLS, T0 + 5)[0] == "c"  # still waiting, first


def test_among_equal_holders_the_lowest_band_gives_way_first() -> None:
    q: FairQueue[str] = FairQueue()
    limit = PoolLimit("lab", 6)
    for flow in (Flow("night", band=2), Flow("alice", band=1), Flow("bob", band=0)):
        for i in range(2):
            assert isinstance(q.push(POOL, flow, f"{flow.name}{i}", T0, None, limit), Waiting)
    made = q.make_room(Flow("new"), limit, T0)
    assert made is not None and made[0].item == "night1"


def test_a_flow_at_its_max_in_flight_may_not_start_even_with_a_slot_free() -> None:
    q: FairQueue[str] = FairQueue()
    capped, other = Flow("capped", max_in_flight=1), Flow("other")
    assert q.may_start(capped)
    q.started(capped, T0)  # sent at once: a slot was free
    assert not q.may_start(capped)
    assert q.may_start(other)
    queued(q, POOL, capped, "waits for its own to end", T0)
    assert q.pop([POOL], T0) is None
    q.finished(capped, 3.0, T0 + 3)
    assert q.may_start(capped)
    assert q.pop([POOL], T0 + 3).item == "waits for its own to end"  # type: ignore[union-attr]
    assert not q.may_start(capped)  # a popped one runs too


def test_each_pool_s_first_request_and_each_flow_s_running_count_for_the_other_workers() -> None:
    queue: FairQueue[str] = FairQueue()
    heavy, light = Flow("heavy", 1), Flow("light", 1)
    queue.started(heavy, 0.0)
    queue.push("chat", heavy, "heavy's", 1.0)
    queue.push("chat", light, "light's", 2.0)
    queue.push("code", heavy, "heavy's too", 3.0)
    assert queue.heads() == {"chat": (1, 0, 2.0, "light"), "code": (1, 1, 3.0, "heavy")}
    assert queue.heads(["code", "gone"]) == {"code": (1, 1, 3.0, "heavy")}
    assert queue.running() == {"heavy": 1}


def test_a_flow_busy_in_the_other_processes_waits_behind_one_idle_everywhere() -> None:
    """With replicas, a heavy flow whose requests all run in another replica has none
    running here: it still goes after a light flow with none running anywhere, and the
    pool's first request, which the others are told of, is the light one."""
    queue: FairQueue[str] = FairQueue()
    heavy, light = Flow("heavy"), Flow("light")
    queue.started(light, T0)
    queue.finished(light, 30.0, T0)  # the light flow has been served here lately
    queued(queue, POOL, heavy, "heavy's")
    queued(queue, POOL, light, "light's")
    assert queue.heads()[POOL][3] == "heavy"  # by what runs here alone, heavy's is first
    queue.elsewhere({"heavy": 4})
    assert queue.heads()[POOL][1::2] == (0, "light")
    assert queue.pop([POOL], T0).item == "light's"  # type: ignore[union-attr]
    queue.elsewhere({})  # the others' word is gone: each process counts its own again
    queued(queue, POOL, light, "light's next")
    assert queue.pop([POOL], T0).item == "heavy's"  # type: ignore[union-attr]
