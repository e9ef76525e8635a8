"""cache_affinity: each conversation kept on the host that holds its prompt cache.

The rules first (crossbar.routing.affinity: rendezvous hashing, the load bound, slots, the
bounded table), called directly; then crossbar in front of simulated hosts, in-process
and as two ``twistd`` daemons that must agree without sharing anything.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import time
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted

from crossbar.config import Config
from crossbar.proxy.shapes import read_conversation
from crossbar.routing.affinity import (
    MAX_CONVERSATIONS,
    RANK_EXACT,
    RANK_MOST,
    Conversations,
    LoadBound,
)
from crossbar.routing.conversationtable import LIVE_SECONDS
from crossbar.routing.conversationtable import LiveCounts as _LiveCounts
from crossbar.routing.rendezvous import ranked_hosts, rendezvous
from crossbar.testing import Reader, RigMaker, SimulatedHost, rigs, wait_state
from tests.support import Daemon, free_port, start_daemon, start_simulator
from tests.support.affinity import (
    CHAT,
    Shape,
    affinity_route,
    body,
    chat_turn,
    claude_turn,
    codex_turn,
    host_header,
    hosts,
)

HOSTS = ["gpu-a", "gpu-b", "gpu-c"]


def keys(count: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(16) for _ in range(count)]


def home_of(first: str, hosts: list[str]) -> str:
    found = read_conversation(b"/v1/chat/completions", json.dumps(body(first)).encode(), "tiny-a")
    assert found is not None
    return rendezvous(found.key, hosts)[0]


def homed(host: str, hosts: list[str], count: int, prefix: str = "task") -> list[str]:
    """First user messages of ``count`` conversations whose home is ``host``."""
    found = []
    n = 0
    while len(found) < count:
        n += 1
        if home_of(f"{prefix} {n}", hosts) == host:
            found.append(f"{prefix} {n}")
    return found


# -- the rules ---------------------------------------------------------------------------------


def test_a_new_conversation_then_its_next_turns_at_home() -> None:
    table = Conversations()
    key = keys(1)[0]
    home = rendezvous(key, HOSTS)[0]
    first = table.place(key, HOSTS, {}, 1.5, now=0.0)
    assert first is not None and (first.host, first.home, first.outcome) == (home, home, "new")
    again = table.place(key, HOSTS, {}, 1.5, now=1.0)
    assert again is not None and (again.host, again.outcome) == (home, "home")


def test_the_load_bound_moves_a_conversation_off_a_host_4_busier_and_its_turns_follow() -> None:
    table = Conversations()
    group = ["gpu-a", "gpu-b"]
    key = next(k for k in keys(50) if rendezvous(k, group)[0] == "gpu-a")
    three = table.place(key, group, {"gpu-a": 3, "gpu-b": 0}, 1.5, now=0.0)
    assert three is not None and three.host == "gpu-a"  # 3 busier: within the bound
    placed = table.place(key, group, {"gpu-a": 4, "gpu-b": 0}, 1.5, now=1.0)
    assert placed is not None and (placed.host, placed.home, placed.outcome) == (
        "gpu-b",
        "gpu-a",
        "moved",
    )
    idle = table.place(key, group, {}, 1.5, now=2.0)  # its cache is on gpu-b now
    assert idle is not None and (idle.host, idle.outcome) == ("gpu-b", "moved")
    alone = table.place(key, ["gpu-a"], {}, 1.5, now=3.0)  # gpu-b gone: the hash again
    assert alone is not None and (alone.host, alone.outcome) == ("gpu-a", "home")
    back = table.place(key, group, {}, 1.5, now=4.0)
    assert back is not None and (back.host, back.outcome) == ("gpu-a", "home")


def test_the_load_bound_needs_both_a_share_above_the_average_and_2_more() -> None:
    """The new request counts in the average: 2 hosts at 4 and 0 give 4 > 1.5 x 5/2."""
    assert not LoadBound(["a", "b"], {"a": 4, "b": 0}, 1.5).fits("a")
    assert LoadBound(["a", "b"], {"a": 3, "b": 0}, 1.5).fits("a")  # 3 is not above 1.5 x 4/2
    assert not LoadBound(["a", "b", "c"], {"a": 2}, 1.5).fits("a")  # 2 > 1.5 x 3/3, 2 more
    assert LoadBound(["a", "b", "c"], {"a": 2, "b": 1, "c": 1}, 1.0).fits("a")  # only 1 more
    assert LoadBound(["a", "b"], {"a": 4, "b": 0}, 3.0).fits("a")  # within a looser bound
    assert LoadBound(["a"], {"a": 50}, 1.5).fits("a")  # alone: never above its own average
    assert LoadBound(["a", "b"], {"a": 4, "b": 0}, 1.5, {"a": 5}).fits("a")  # a slot is free
    assert not LoadBound(["a", "b"], {"a": 5, "b": 0}, 1.5, {"a": 5}).fits("a")  # it would wait
    many = LoadBound(["a", "b"], {"a": 10, "b": 8}, 1.5)
    assert many.fits("a") and many.fits("b")


def test_a_retry_elsewhere_is_a_move_from_home() -> None:
    table = Conversations()
    key = keys(1)[0]
    order = rendezvous(key, HOSTS)
    retry = table.place(key, HOSTS, {}, 1.5, now=0.0, exclude=[order[0]])
    assert retry is not None and (retry.host, retry.home, retry.outcome) == (
        order[1],
        order[0],
        "moved",
    )
    assert table.place(key, HOSTS, {}, 1.5, now=0.0, exclude=HOSTS) is None


def test_slots_send_a_new_conversation_past_a_full_home() -> None:
    group = ["gpu-a", "gpu-b"]
    table = Conversations(slots={"gpu-a": 2, "gpu-b": 2})
    on_a = [k for k in keys(200) if rendezvous(k, group)[0] == "gpu-a"]
    placed = [table.place(k, group, {}, 1.5, now=0.0) for k in on_a[:3]]
    assert [(p.host, p.outcome) for p in placed if p] == [
        ("gpu-a", "new"),
        ("gpu-a", "new"),
        ("gpu-b", "moved"),  # gpu-a holds 2 live conversations: its 2 slots
    ]
    assert table.live("gpu-a", 1.0) == 2 and table.live("gpu-b", 1.0) == 1
    again = table.place(on_a[0], group, {}, 1.5, now=2.0)  # a live one stays
    assert again is not None and (again.host, again.outcome) == ("gpu-a", "home")
    for key in on_a[3:6]:  # the whole group full: home, as without slots
        table.place(k := key, group, {}, 1.5, now=3.0)
    assert table.host_of(k) == "gpu-a"
    later = LIVE_SECONDS + 20.0  # every conversation quiet for 5 minutes: room again
    assert table.live("gpu-a", later) == 0
    fresh = table.place(on_a[10], group, {}, 1.5, now=later)
    assert fresh is not None and (fresh.host, fresh.outcome) == ("gpu-a", "new")


SLOTS = {"gpu-a": 4, "gpu-b": 4, "gpu-c": 4}


def take_turns(
    tables: list[Conversations], conversations: list[bytes], rounds: int, numbered: bool = True
) -> list[list[str]]:
    """Every conversation's turns 0..rounds-1, all first turns at once, then all second
    ones...; turn ``t`` of conversation ``i`` through ``tables[(i + t) % len(tables)]``
    (``numbered``: with its turn, as a chat completion has). The hosts each went to."""
    went: list[list[str]] = [[] for _ in conversations]
    for turn in range(rounds):
        for i, key in enumerate(conversations):
            table = tables[(i + turn) % len(tables)]
            number = turn if numbered else None
            placed = table.place(key, HOSTS, {}, 1.5, now=T0 + turn, turn=number)
            assert placed is not None
            went[i].append(placed.host)
    return went


def moves(went: list[list[str]], since: int = 1) -> int:
    """Turns (from turn ``since`` on) sent to another host than the turn before."""
    return sum(hosts[t] != hosts[t - 1] for hosts in went for t in range(since, len(hosts)))


def test_two_replicas_taking_turns_agree_on_hosts_with_slots() -> None:
    """Each replica sees every other turn, and all first turns come at once: the two
    agree from the third turn on, and no host holds more conversations than slots."""
    conversations = keys(12, seed=7)
    assert max(Counter(rendezvous(k, HOSTS)[0] for k in conversations).values()) > 4
    went = take_turns([Conversations(SLOTS), Conversations(SLOTS)], conversations, 8)
    assert moves(went, since=3) == 0
    assert max(Counter(hosts[-1] for hosts in went).values()) <= 4
    blind = [Conversations(SLOTS), Conversations(SLOTS)]  # each deciding on its own view
    assert moves(take_turns(blind, conversations, 8, numbered=False), since=3) > 0


def test_behind_replicas_a_new_conversation_is_ranked_from_its_first_turn() -> None:
    """Once replicas know of each other, a conversation begun later stays on one host
    from its first turn: the replica that gets its second turn ranks it, and so did the
    one that got its first."""
    replicas = [Conversations(SLOTS), Conversations(SLOTS)]
    take_turns(replicas, keys(10, seed=7), 3)  # 10 live conversations, seen by both
    went: list[list[str]] = []
    for n, key in enumerate(keys(6, seed=8)):  # one more every second, 4 turns each
        hosts = []
        for turn in range(4):
            table = replicas[(n + turn) % 2]
            placed = table.place(key, HOSTS, {}, 1.5, now=T0 + 10 + n + turn, turn=turn)
            assert placed is not None
            hosts.append(placed.host)
        went.append(hosts)
    assert moves(went) == 0


def test_replicas_agree_on_conversations_that_come_one_after_another() -> None:
    """Six conversations in turn, each with two turns through one replica and the third
    through the other (as the integration test on real routers): every turn of each goes
    to one host, though three of the first four have gpu-a for home and it has 2 slots."""
    group = ["gpu-a", "gpu-b"]
    slots = {"gpu-a": 2, "gpu-b": 2}
    replicas = [Conversations(slots), Conversations(slots)]
    conversations = keys(6, seed=4)
    homes = [rendezvous(k, group)[0] for k in conversations]
    assert homes[:4].count("gpu-a") == 3 or homes[:4].count("gpu-b") == 3
    now = T0
    for n, key in enumerate(conversations):
        went = []
        for turn, replica in enumerate([n % 2, n % 2, (n + 1) % 2]):
            placed = replicas[replica].place(key, group, {}, 1.5, now=now, turn=turn)
            assert placed is not None
            went.append(placed.host)
            now += 0.5  # all within one 10 s bucket: the ranking is asked between changes
        assert len(set(went)) == 1, (n, went)


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many conversations each ranking computed while the test runs read."""
    import crossbar.routing.affinity as affinity

    sizes: list[int] = []

    def counted(live: Any, group: Any, slots: Any) -> dict[bytes, str]:
        live = list(live)
        sizes.append(len(live))
        return ranked_hosts(live, group, slots)

    monkeypatch.setattr(affinity, "ranked_hosts", counted)
    return sizes


def test_a_flood_of_made_up_conversations_is_not_ranked(computed: list[int]) -> None:
    """Thousands of conversations first seen mid-way (a client making them up) cannot make
    the ranking read ever more of the table: beyond 4,096 live nothing is ranked, and they
    are placed as one crossbar alone would."""
    table = Conversations(SLOTS)
    flood = keys(RANK_MOST + 1000, seed=9)
    for i, key in enumerate(flood):  # 1,000 a second for 5 seconds
        placed = table.place(key, HOSTS, {}, 1.5, now=T0 + i / 1000, turn=3)
        assert placed is not None
    assert max(computed) <= RANK_MOST
    assert len(computed) <= RANK_EXACT + 1 + 5  # exact while small, then once a second
    done = len(computed)
    for second in range(1, 4):  # crowded: no more rankings, however long it lasts
        placed = table.place(flood[0], HOSTS, {}, 1.5, now=T0 + 5 + second, turn=4)
        assert placed is not None
    assert len(computed) == done


def test_two_routes_keep_a_ranking_each(computed: list[int]) -> None:
    """Two routes with other hosts, their requests alternating: each group's ranking is
    kept, not computed again for every request of the other."""
    table = Conversations(SLOTS)
    groups = [["gpu-a", "gpu-b"], ["gpu-b", "gpu-c"]]
    conversations = keys(40, seed=12)
    for n, key in enumerate(conversations):  # first seen at turn 2: each one ranked
        table.place(key, groups[n % 2], {}, 1.5, now=T0, turn=2)
    computed.clear()
    for n, key in enumerate(conversations):  # turn 3: nobody new, at most one each
        placed = table.place(key, groups[n % 2], {}, 1.5, now=T0 + 1, turn=3)
        assert placed is not None and placed.host in groups[n % 2]
    assert len(computed) <= len(groups)


def test_a_reload_s_slots_rank_the_next_turn_at_once() -> None:
    """300 ranked conversations (more than are ranked again on every change); a reload
    gives gpu-a 50 slots: the very next turns, in the same second, keep it to 50."""
    group = ["gpu-a", "gpu-b"]
    table = Conversations({"gpu-a": 200, "gpu-b": 200})
    conversations = keys(300, seed=13)
    for key in conversations:
        table.place(key, group, {}, 1.5, now=T0, turn=2)
    table.set_slots({"gpu-a": 50, "gpu-b": 400})
    went = Counter()
    for key in conversations:
        placed = table.place(key, group, {}, 1.5, now=T0 + 0.5, turn=3)
        assert placed is not None
        went[placed.host] += 1
    assert went["gpu-a"] == 50


def test_one_crossbar_that_sees_every_turn_never_ranks() -> None:
    """Alone, the first come keep their home and the later ones move: nothing moves after."""
    conversations = keys(12, seed=7)
    table = Conversations(SLOTS)
    went = take_turns([table], conversations, 6)
    assert moves(went) == 0
    blind = Conversations(SLOTS)  # the same turns without their numbers
    for key in conversations:
        blind.place(key, HOSTS, {}, 1.5, now=T0)
    assert [hosts[0] for hosts in went] == [blind.host_of(k) for k in conversations]


def test_a_skipped_turn_or_a_late_first_sight_ranks_the_conversation() -> None:
    conversations = keys(12, seed=7)
    table = Conversations(SLOTS)
    for key in conversations:
        table.place(key, HOSTS, {}, 1.5, now=T0, turn=0)
    ranked = ranked_hosts(conversations, HOSTS, SLOTS)
    differ = [k for k in conversations if ranked[k] != table.host_of(k)]
    assert differ, "the first come and the ranking disagree on some conversation"
    key = differ[0]
    placed = table.place(key, HOSTS, {}, 1.5, now=T0 + 1, turn=1)
    assert placed is not None and placed.host == table.host_of(key) != ranked[key]
    placed = table.place(key, HOSTS, {}, 1.5, now=T0 + 2, turn=3)  # turn 2 went elsewhere
    assert placed is not None and placed.host == ranked[key]
    placed = table.place(key, HOSTS, {}, 1.5, now=T0 + 3, turn=4)  # and it stays ranked
    assert placed is not None and placed.host == ranked[key]
    stranger = Conversations(SLOTS)  # a crossbar that never saw turns 0 and 1
    for turn in (2, 3):  # it knows them all from the second round on
        for other in conversations:
            stranger.place(other, HOSTS, {}, 1.5, now=T0 + turn, turn=turn)
    assert {k: stranger.host_of(k) for k in conversations} == ranked


def test_a_burst_of_first_sights_computes_the_ranking_once_a_second(computed: list[int]) -> None:
    """A replica restarted amid 2,000 live conversations does not read them all again for
    each one it sees (quadratic work on the reactor): beyond 256, once a second at most."""
    slots = {host: 700 for host in HOSTS}
    table = Conversations(slots)
    conversations = keys(2000, seed=5)
    for i, key in enumerate(conversations):
        table.place(key, HOSTS, {}, 1.5, now=T0 + i / 4000, turn=3)  # in half a second
    assert computed == list(range(1, RANK_EXACT + 2))  # exact while small, then no more
    assert max(table.live(host, T0 + 1) for host in HOSTS) <= 700  # slots still hold
    again = table.place(conversations[0], HOSTS, {}, 1.5, now=T0 + 1.5, turn=4)
    assert computed[RANK_EXACT + 1 :] == [2000] and again is not None
    assert again.host == ranked_hosts(conversations, HOSTS, slots)[conversations[0]]


def test_the_table_drops_the_least_recently_seen_first() -> None:
    table = Conversations(capacity=3)
    one, two, three, four = keys(4)
    for n, key in enumerate([one, two, three]):
        table.place(key, HOSTS, {}, 1.5, now=float(n))
    table.place(one, HOSTS, {}, 1.5, now=5.0)  # seen again: now the most recent
    table.place(four, HOSTS, {}, 1.5, now=6.0)
    assert len(table) == 3
    assert table.host_of(two) is None
    assert None not in {table.host_of(k) for k in (one, three, four)}


def test_memory_stays_bounded_under_100000_distinct_conversations() -> None:
    """More than the cap of distinct conversations, through 3 hosts with slots: the table
    keeps the cap of entries, and its memory (each entry a fixed size) stays small."""
    table = Conversations(slots={host: 4 for host in HOSTS})
    rng = random.Random(3)
    tracemalloc.start()
    try:
        for n in range(MAX_CONVERSATIONS + 20_000):
            table.place(rng.randbytes(16), HOSTS, {}, 1.5, now=n / 1000)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(table) == MAX_CONVERSATIONS
    assert held < 24 * 1024 * 1024, f"{held / 1024 / 1024:.1f} MiB"
    # Live counts follow the conversations dropped: never more than the table holds.
    assert sum(table.live(host, 200.0) for host in HOSTS) <= MAX_CONVERSATIONS


# -- through crossbar --------------------------------------------------------------------------


@pytest_twisted.async_yield_fixture
async def make() -> AsyncIterator[RigMaker]:
    async with rigs() as maker:
        yield maker


@pytest_twisted.ensureDeferred
async def test_turns_stay_on_one_host_and_conversations_spread(make: RigMaker) -> None:
    # Each host says it runs 8 slots (learned as a router's total_slots): room for all 8
    # agents anywhere, so every conversation stays at its hash home.
    rig = await make(hosts(slots=8), routes=affinity_route())
    seen: dict[str, set[str]] = defaultdict(set)
    for turn in (1, 2, 3):
        for n in range(8):
            response, _ = await rig.post(CHAT, body(f"agent {n}", turn))
            assert response.code == 200
            seen[f"agent {n}"].add(host_header(response))
    assert all(len(where) == 1 for where in seen.values()), seen
    per_host = Counter(next(iter(where)) for where in seen.values())
    assert set(per_host) == {"gpu-a", "gpu-b"}, per_host
    for first, where in seen.items():
        assert where == {home_of(first, ["gpu-a", "gpu-b"])}

    response, text = await rig.get("/_crossbar/metrics")
    metrics = text.decode()
    for host, count in per_host.items():
        assert (
            f'crossbar_affinity_total{{host="{host}",outcome="new",route="lab"}} {count}.0'
            in metrics
        )
        assert (
            f'crossbar_affinity_total{{host="{host}",outcome="home",route="lab"}} {2 * count}.0'
            in metrics
        )
    assert 'outcome="moved"' not in metrics
    response, text = await rig.get("/_crossbar/status")
    share = json.loads(text)["routes"]["lab"]["affinity"]
    assert (share["turns"], share["home"], share["moved"], share["home_share"]) == (24, 24, 0, 1.0)


@pytest_twisted.ensureDeferred
async def test_codex_sessions_begun_in_one_directory_spread_and_keep_their_hosts(
    make: RigMaker,
) -> None:
    """Codex sends the same context (AGENTS.md, working directory) before the prompt of
    every session begun in one directory: each session is still a conversation of its own."""
    rig = await make(hosts(slots=8), routes=affinity_route())
    seen: dict[str, set[str]] = defaultdict(set)
    for turn in (1, 2, 3):
        for n in range(8):
            path, data = codex_turn(f"agent {n}", turn)
            response, _ = await rig.post(path, data)
            assert response.code == 200
            seen[f"agent {n}"].add(host_header(response))
    assert all(len(where) == 1 for where in seen.values()), seen
    assert {host for where in seen.values() for host in where} == {"gpu-a", "gpu-b"}, seen


@pytest_twisted.ensureDeferred
async def test_a_request_without_a_conversation_still_works(make: RigMaker) -> None:
    """No messages, no prompt, no JSON: the least busy host answers (its own error for a
    body it cannot read), and nothing is counted as a conversation."""
    rig = await make(hosts(), routes=affinity_route())
    for path, data in [
        ("/lab/v1/completions", {"model": "tiny-a", "max_tokens": 2}),
        (CHAT, {"model": "tiny-a", "messages": [], "max_tokens": 2}),
        ("/lab/v1/embeddings", {"model": "tiny-a", "input": "hi"}),
        (CHAT, b"{not json"),
    ]:
        response, _ = await rig.post(path, data)
        assert host_header(response) in ("gpu-a", "gpu-b")
        assert response.code < 500 or data == b"{not json"  # the host's own answer
    response, listing = await rig.get("/lab/v1/models")
    assert response.code == 200 and b"tiny-a" in listing
    _, text = await rig.get("/_crossbar/metrics")
    assert "crossbar_affinity_total{" not in text.decode()
    _, text = await rig.get("/_crossbar/status")
    assert json.loads(text)["routes"]["lab"]["affinity"]["home_share"] is None


@pytest_twisted.ensureDeferred
async def test_a_host_going_down_moves_only_its_own_conversations(make: RigMaker) -> None:
    # 16 slots a host (as it says of its model): one host alone has room for all 8 agents
    rig = await make(hosts(slots=16), routes=affinity_route())
    firsts = [f"agent {n}" for n in range(8)]
    before = {}
    for first in firsts:
        response, _ = await rig.post(CHAT, body(first))
        before[first] = host_header(response)
    await rig.sims["gpu-b"].stop()
    rig.crossbar.table.request_failed("gpu-b", "test: stopped")
    await wait_state(rig, "gpu-b", healthy=False)
    for first in firsts:
        response, _ = await rig.post(CHAT, body(first, 2))
        assert response.code == 200 and host_header(response) == "gpu-a"
    # gpu-b is back: the conversations that went on without it stay where their cache is
    # now, the others never moved.
    rig.sims["gpu-b"] = SimulatedHost({"tiny-a": "loaded"}, chunks=3)
    await rig.sims["gpu-b"].listen(_port(rig, "gpu-b"), "127.0.0.1")
    await rig.crossbar.poller.poll_now("gpu-b")
    await rig.crossbar.poller.poll_now("gpu-b")
    await wait_state(rig, "gpu-b", healthy=True)
    after = {}
    for first in firsts:
        response, _ = await rig.post(CHAT, body(first, 3))
        after[first] = host_header(response)
    assert after == dict.fromkeys(firsts, "gpu-a")
    moved = rig.logs.matching("lab gpu-a POST", "(moved from gpu-b)")
    assert len(moved) == sum(1 for host in before.values() if host == "gpu-b") > 0
    assert set(before.values()) == {"gpu-a", "gpu-b"}


@pytest_twisted.ensureDeferred
async def test_the_load_bound_moves_a_conversation_and_its_later_turns_follow(
    make: RigMaker,
) -> None:
    """Four streams held open on gpu-a; a new conversation whose home is gpu-a goes to
    gpu-b, is logged as moved, and stays on gpu-b once gpu-a is idle again."""
    rig = await make(hosts(chunk_interval=0.5), routes=affinity_route())
    group = ["gpu-a", "gpu-b"]
    busy = homed("gpu-a", group, 4, prefix="busy")
    readers: list[Reader] = []
    for first in busy:
        response, reader = await rig.stream(CHAT, {**body(first), "stream": True, "max_tokens": 20})
        assert host_header(response) == "gpu-a"
        readers.append(reader)
    assert rig.crossbar.traffic.in_flight == {"gpu-a": 4, "gpu-b": 0}
    mover = homed("gpu-a", group, 1, prefix="mover")[0]
    rig.sims["gpu-a"].chunk_interval = rig.sims["gpu-b"].chunk_interval = 0.0
    response, _ = await rig.post(CHAT, body(mover))
    assert host_header(response) == "gpu-b"
    for reader in readers:
        reader.hang_up()
        await reader.end()
    await _idle(rig)
    for turn in (2, 3):
        response, _ = await rig.post(CHAT, body(mover, turn))
        assert host_header(response) == "gpu-b"
    moved = rig.logs.matching("lab gpu-b POST /v1/chat/completions 200", "(moved from gpu-a)")
    assert len(moved) == 3
    _, text = await rig.get("/_crossbar/metrics")
    assert 'crossbar_affinity_total{host="gpu-b",outcome="moved",route="lab"} 3.0' in text.decode()
    _, page = await rig.get("/_crossbar/")
    assert re.search(r"\d+% of 7 turns at their home host", page.decode())


@pytest_twisted.ensureDeferred
async def test_a_host_whose_slots_are_taken_sends_a_new_conversation_on(make: RigMaker) -> None:
    """``slots: 1`` on each host: a second live conversation whose home is gpu-a goes to
    gpu-b, where a slot is free; the first keeps gpu-a."""

    def one_slot(config: Config) -> Config:
        hosts = {name: attrs.evolve(host, slots=1) for name, host in config.hosts.items()}
        return attrs.evolve(config, hosts=hosts)

    rig = await make(hosts(), routes=affinity_route(), adjust=one_slot)
    first, second = homed("gpu-a", ["gpu-a", "gpu-b"], 2, prefix="slot")
    where = []
    for data in (body(first), body(second), body(first, 2), body(second, 2)):
        response, _ = await rig.post(CHAT, data)
        where.append(host_header(response))
    assert where == ["gpu-a", "gpu-b", "gpu-a", "gpu-b"]
    assert len(rig.logs.matching("lab gpu-b POST", "(moved from gpu-a)")) == 2


def _port(rig: Any, name: str) -> int:
    return int(rig.crossbar.config.hosts[name].url.rsplit(":", 1)[1])


async def _idle(rig: Any) -> None:
    from crossbar.testing import eventually

    traffic = rig.crossbar.traffic
    await eventually(lambda: not any(traffic.in_flight.values()), 3.0, "no request in flight")


# -- two crossbar processes --------------------------------------------------------------------


TWO_REPLICAS = """\
poll_interval: 1s
hosts:
  gpu-a: http://127.0.0.1:{a}
  gpu-b: http://127.0.0.1:{b}
routes:
  lab:
    hosts: [gpu-a, gpu-b]
    default_model: tiny-a
    policy: cache_affinity
"""


def ask(port: int, data: dict[str, Any], path: str = CHAT) -> str:
    """One request through the crossbar on ``port`` (a chat completion unless ``path``
    says another API); the host that answered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(data), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        return str(response.getheader("x-crossbar-host"))
    finally:
        conn.close()


def ready(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/_crossbar/readyz")
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        conn.close()


TWO_REPLICAS_WITH_SLOTS = TWO_REPLICAS.replace(
    "  gpu-a: http://127.0.0.1:{a}\n  gpu-b: http://127.0.0.1:{b}\n",
    "  gpu-a:\n    url: http://127.0.0.1:{a}\n    slots: 2\n"
    "  gpu-b:\n    url: http://127.0.0.1:{b}\n    slots: 2\n",
)


def alternate(
    tmp_path: Path,
    config: str,
    firsts: list[str],
    turns: int,
    slots: int = 16,
    shape: Shape = chat_turn,
) -> list[list[str]]:
    """Conversations beginning with ``firsts``, their turns alternating between two
    ``twistd`` crossbars with ``config`` over two simulated hosts of ``slots`` slots each
    (which crossbar learns where the config gives none): where each turn went."""
    second = free_port()
    options = ["--models", "tiny-a=loaded", "--chunks", "2", "--chunk-interval", "0"]
    options += ["--slots", str(slots)]
    sim = start_simulator(
        tmp_path, *options, "--load-time", "0", "--host", f"{second}:tiny-a=loaded"
    )
    daemons: list[Daemon] = []
    try:
        for n in range(2):
            where = tmp_path / f"crossbar-{n}"
            where.mkdir()
            daemons.append(start_daemon(where, config.format(a=sim.port, b=second)))
        for daemon in daemons:
            assert daemon.wait(lambda d=daemon: ready(d.port), 10), daemon.log()
        went: list[list[str]] = [[] for _ in firsts]
        for turn in range(1, turns + 1):
            for n, first in enumerate(firsts):
                replica = daemons[(n + turn) % 2]
                path, data = shape(first, turn)
                went[n].append(ask(replica.port, data, path))
        return went
    finally:
        for daemon in daemons:
            daemon.stop()
        sim.stop()


def test_two_crossbar_processes_agree_on_every_conversations_host(tmp_path: Path) -> None:
    """Each conversation's turns alternate between two replicas with the same config:
    every turn lands on the same host, with nothing shared between the replicas."""
    went = alternate(tmp_path, TWO_REPLICAS, [f"agent {n}" for n in range(8)], 4)
    assert all(len(set(hosts)) == 1 for hosts in went), went
    assert {host for hosts in went for host in hosts} == {"gpu-a", "gpu-b"}


@pytest.mark.parametrize("shape", [claude_turn, codex_turn], ids=["claude-code", "codex"])
def test_two_replicas_keep_every_turn_of_an_agent_session_on_one_host(
    tmp_path: Path, shape: Shape
) -> None:
    """Claude Code's and Codex's sessions, their turns alternating between two replicas
    (a new billing nonce every turn for Claude Code): every turn on one host."""
    firsts = [f"agent {n}" for n in range(8)]
    went = alternate(tmp_path, TWO_REPLICAS, firsts, 4, shape=shape)
    assert all(len(set(hosts)) == 1 for hosts in went), went
    assert {host for hosts in went for host in hosts} == {"gpu-a", "gpu-b"}


def test_two_crossbar_processes_agree_on_hosts_with_slots(tmp_path: Path) -> None:
    """Four conversations whose home is gpu-a, two slots a host: each replica first puts
    the two it sees at home; from the third turn, when each has seen all four, they agree
    on two a host and every turn goes where the one before went."""
    firsts = homed("gpu-a", ["gpu-a", "gpu-b"], 4)
    went = alternate(tmp_path, TWO_REPLICAS_WITH_SLOTS, firsts, 6)
    assert all(hosts[0] == "gpu-a" for hosts in went), went
    assert all(len(set(hosts[2:])) == 1 for hosts in went), went
    assert Counter(hosts[-1] for hosts in went) == Counter({"gpu-a": 2, "gpu-b": 2}), went


# -- a reload: slots given, changed or taken away (Conversations.set_slots) ---------------------

T0 = 1_000_000.0  # a multiple of the 10 s bucket


def placed(
    turns: list[tuple[bytes, str, float]], slots: dict[str, int] | None = None
) -> Conversations:
    """A table fed ``(conversation, host, time)`` turns, as the proxy feeds it."""
    table = Conversations(slots=slots)
    for key, host, now in turns:
        table.remember(key, host, now)
    return table


def test_a_host_given_slots_counts_its_live_conversations_at_once() -> None:
    k1, k2, k3, k4, k5 = keys(5)
    turns = [
        (k1, "gpu-a", T0),  # 310 s old at the end: no longer live
        (k2, "gpu-a", T0 + 100),
        (k3, "gpu-b", T0 + 200),
        (k4, "gpu-a", T0 + 250),
        (k5, "gpu-a", T0 + 260),
        (k5, "gpu-b", T0 + 270),  # moved: live on gpu-b now, not on gpu-a
    ]
    now = T0 + 310
    table = placed(turns)
    assert table.live("gpu-a", now) == 0  # without slots nothing is counted
    table.set_slots({"gpu-a": 2, "gpu-b": 8})
    assert table.live("gpu-a", now) == 2  # k2 and k4
    assert table.live("gpu-b", now) == 2  # k3 and k5
    assert not table.has_room("gpu-a", now)
    assert table.has_room("gpu-b", now)
    # the same counts as a table that had these slots from the start
    always = placed(turns, {"gpu-a": 2, "gpu-b": 8})
    assert [always.live(h, now) for h in ("gpu-a", "gpu-b")] == [2, 2]


def test_counts_after_new_slots_go_on_as_turns_come_and_age() -> None:
    k1, k2, k3 = keys(3)
    table = placed([(k1, "gpu-a", T0), (k2, "gpu-a", T0 + 50)])
    table.set_slots({"gpu-a": 2})
    assert table.live("gpu-a", T0 + 60) == 2
    table.remember(k3, "gpu-a", T0 + 70)
    table.remember(k1, "gpu-a", T0 + 80)  # a live one again: not counted twice
    assert table.live("gpu-a", T0 + 80) == 3
    assert table.live("gpu-a", T0 + 355) == 2  # k2 (at T0 + 50) has aged out
    assert table.live("gpu-a", T0 + 390) == 0


def test_conversations_older_than_the_live_window_are_not_counted() -> None:
    table = placed([(k, "gpu-a", T0 + i) for i, k in enumerate(keys(5))])
    later = T0 + LIVE_SECONDS + 20
    table.set_slots({"gpu-a": 1})
    assert table.live("gpu-a", later) == 0
    assert table.has_room("gpu-a", later)


def test_a_conversation_a_whole_window_older_than_another_is_not_counted() -> None:
    old, new = keys(2)
    turns = [(old, "gpu-a", T0), (new, "gpu-a", T0 + LIVE_SECONDS)]  # the same ring bucket
    now = T0 + LIVE_SECONDS + 5
    assert placed(turns, {"gpu-a": 1}).live("gpu-a", now) == 1  # with slots from the start
    table = placed(turns)
    table.set_slots({"gpu-a": 1})
    assert table.live("gpu-a", now) == 1
    assert not table.has_room("gpu-a", now)


def test_slots_taken_away_leave_room_everywhere() -> None:
    table = placed([(k, "gpu-a", T0) for k in keys(3)], {"gpu-a": 2})
    assert not table.has_room("gpu-a", T0 + 1)
    table.set_slots({})
    assert table.has_room("gpu-a", T0 + 1)
    assert table.live("gpu-a", T0 + 1) == 0
    assert table.slots == {}


def test_fewer_slots_make_a_host_full() -> None:
    table = placed([(k, "gpu-a", T0) for k in keys(3)], {"gpu-a": 4})
    assert table.has_room("gpu-a", T0 + 1)
    table.set_slots({"gpu-a": 3})
    assert table.live("gpu-a", T0 + 1) == 3
    assert not table.has_room("gpu-a", T0 + 1)


def crowded_elsewhere(slots: dict[str, int]) -> tuple[Conversations, float]:
    """A table with 100,000 conversations live on two hosts of another route."""
    table = Conversations(slots=slots)
    for n, key in enumerate(keys(MAX_CONVERSATIONS, seed=7)):
        table.remember(key, ("far-1", "far-2")[n % 2], T0 + n / 1000)
    return table, T0 + 100


def test_a_ranking_reads_only_its_groups_conversations() -> None:
    """Issue 27 (4): with 100,000 conversations live on other hosts, one ranked request
    walked all of them (53 ms). 50 ranked requests, each ranking again (a new
    conversation came), took 2.6 s; now they read only the group's."""
    slots = dict.fromkeys([*HOSTS, "far-1", "far-2"], 4)
    table, now = crowded_elsewhere(slots)
    started = time.perf_counter()
    hosts = [table.place(key, HOSTS, {}, 1.5, now, turn=3) for key in keys(50, seed=8)]
    took = time.perf_counter() - started
    print(f"50 ranked requests took {took * 1000:.1f} ms")
    assert None not in hosts and len(table) == MAX_CONVERSATIONS
    assert sum(table.live(h, now) for h in HOSTS) == 50
    assert sum(table.live(h, now) for h in ("far-1", "far-2")) == MAX_CONVERSATIONS - 50
    assert took < 1.0


def test_a_reload_reads_the_table_only_for_a_host_given_slots() -> None:
    """Issue 27 (15): every reload counted the whole table again (79 ms at 100,000)."""
    slots = {"far-1": 4, "far-2": 4}
    table, now = crowded_elsewhere(slots)
    table.remember(b"k" * 16, "gpu-a", now)
    started = time.perf_counter()
    for n in range(50):
        table.set_slots(dict(slots))  # a reload that leaves slots as they are
        table.set_slots({**slots, "gpu-a": 2} if n % 2 else slots)
    took = time.perf_counter() - started
    print(f"100 reloads took {took * 1000:.1f} ms")
    assert took < 0.5  # 8 s before
    assert table.live("far-1", now) + table.live("far-2", now) == MAX_CONVERSATIONS - 1
    assert table.live("gpu-a", now) == 1  # counted when given slots


def test_live_counts_take_ticks_in_any_order_within_the_window() -> None:
    counts = _LiveCounts()
    counts.at(100)
    counts.add_at(70)  # 30 ticks old: out of the window
    counts.add_at(71)
    counts.add_at(100)
    counts.add_at(85)
    counts.add_at(85)
    assert counts.at(100) == 4
    assert counts.at(101) == 3  # tick 71 leaves
    assert counts.at(116) == 1  # the two at 85 leave too
    counts.add_at(86)  # older than what is in its bucket already: already gone
    assert counts.at(116) == 1
