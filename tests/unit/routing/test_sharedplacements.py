"""crossbar.routing.sharedplacements, and ``cache_affinity``'s table when it shares them:
what one replica placed and another heard keeps a conversation's turns on one host, and
counts against that host's slots, whichever replica placed it."""

from __future__ import annotations

from collections import Counter

from crossbar.routing.affinity import Conversations
from crossbar.routing.conversationtable import LIVE_SECONDS
from crossbar.routing.rendezvous import rendezvous
from crossbar.routing.sharedplacements import OutgoingPlacements, Placed, replaces

HOSTS = ["gpu-a", "gpu-b", "gpu-c"]
ONE_SLOT = dict.fromkeys(HOSTS, 1)
T0 = 1_000_000.0


def keys(count: int, seed: int = 1) -> list[bytes]:
    return [bytes([seed, n]) * 8 for n in range(count)]


# -- the placements waiting to be sent ------------------------------------------------------


def test_waiting_placements_keep_each_conversation_s_latest_oldest_first() -> None:
    ready: list[int] = []
    outgoing = OutgoingPlacements(lambda: ready.append(len(outgoing)))
    a, b = keys(2)
    outgoing.add(a, "gpu-a", 0)
    outgoing.add(b, "gpu-b", None)
    outgoing.add(a, "gpu-c", 1)  # a's latest, after b's
    assert ready == [1]  # told once, when the first came
    assert outgoing.take(10) == ([Placed(b, "gpu-b", -1), Placed(a, "gpu-c", 1)], set())
    outgoing.add(a, "gpu-a", 2)
    assert ready == [1, 1]  # and again after a take


def test_a_store_that_is_down_lets_no_more_than_so_many_wait() -> None:
    outgoing = OutgoingPlacements(most=3)
    for key in keys(5):
        outgoing.add(key, "gpu-a", 0)
    assert [p.key for p in outgoing.take(2)[0]] == keys(5)[2:4]  # the oldest two dropped
    assert [p.key for p in outgoing.take(2)[0]] == keys(5)[4:]


def test_a_placement_is_fresh_when_the_others_cannot_know_its_host() -> None:
    table, outgoing = shared(dict.fromkeys(HOSTS, 2))
    a, b = keys(2)
    first = table.place(a, HOSTS, {}, 1.5, T0, turn=0)
    assert first is not None
    table.heard([Placed(b, "gpu-b", 0)], T0)
    table.place(b, HOSTS, {}, 1.5, T0, turn=1)  # where the others placed it
    placed, fresh = outgoing.take(10)
    assert [p.key for p in placed] == [a, b] and fresh == {a}  # a: new here
    table.place(a, HOSTS, {}, 1.5, T0, turn=1, exclude=[first.host])  # moved: a failover
    assert outgoing.take(10)[1] == {a}
    table.place(a, HOSTS, {}, 1.5, T0, turn=2)
    assert outgoing.take(10)[1] == set()  # stays where it was


def test_a_heard_placement_replaces_an_entry_of_an_earlier_turn_or_on_another_host() -> None:
    (key,) = keys(1)
    assert replaces(Placed(key, "gpu-b", 3), 2, "gpu-a")
    assert not replaces(Placed(key, "gpu-b", 1), 2, "gpu-a")  # an older turn
    assert replaces(Placed(key, "gpu-b", 2), 2, "gpu-a")  # placed again, elsewhere
    assert not replaces(Placed(key, "gpu-a", 2), 2, "gpu-a")  # the same
    assert replaces(Placed(key, "gpu-b", -1), -1, "gpu-a")  # no turns: the one heard last


# -- the table, shared ----------------------------------------------------------------------


def shared(slots: dict[str, int] | None = None) -> tuple[Conversations, OutgoingPlacements]:
    table = Conversations(slots or ONE_SLOT)
    table.outgoing = OutgoingPlacements()
    return table, table.outgoing


def relay(sender: OutgoingPlacements, receivers: list[Conversations], now: float) -> None:
    placed, _ = sender.take(1000)
    for table in receivers:
        table.heard(placed, now)


def test_replicas_that_share_their_placements_never_move_a_conversation() -> None:
    """Ten conversations on three hosts of one slot, every turn through the other replica
    than the turn before, each placement heard by the other before the next turn: every
    conversation stays where its first turn went, and they are spread as one crossbar
    would spread them."""
    (one, one_out), (two, two_out) = shared(), shared()
    conversations = keys(10, seed=3)
    went: list[list[str]] = [[] for _ in conversations]
    for turn in range(6):
        now = T0 + 20 * turn
        for i, key in enumerate(conversations):
            table = (one, two)[(i + turn) % 2]
            placed = table.place(key, HOSTS, {}, 1.5, now, turn=turn)
            assert placed is not None
            went[i].append(placed.host)
            relay(one_out, [two], now)
            relay(two_out, [one], now)
    assert all(len(set(hosts)) == 1 for hosts in went), went
    alone = Conversations(ONE_SLOT)
    firsts = [alone.place(k, HOSTS, {}, 1.5, T0, turn=0) for k in conversations]
    assert Counter(hosts[0] for hosts in went) == Counter(p.host for p in firsts if p)


def test_conversations_heard_count_against_their_host_s_slots() -> None:
    table, _ = shared({"gpu-a": 1, "gpu-b": 1})
    key, other = keys(2, seed=5)
    home = rendezvous(other, ["gpu-a", "gpu-b"])[0]
    table.heard([Placed(key, home, 0, age=2.0)], T0)
    assert table.live(home, T0) == 1
    placed = table.place(other, ["gpu-a", "gpu-b"], {}, 1.5, T0, turn=0)
    assert placed is not None and placed.host != home  # its home's one slot is taken


def test_a_placement_heard_late_or_of_an_earlier_turn_changes_nothing() -> None:
    table, outgoing = shared()
    key, quiet = keys(2, seed=6)
    placed = table.place(key, HOSTS, {}, 1.5, T0, turn=4)
    assert placed is not None
    elsewhere = next(h for h in HOSTS if h != placed.host)
    table.heard([Placed(key, elsewhere, 3), Placed(quiet, "gpu-a", 0, LIVE_SECONDS + 1)], T0)
    assert table.host_of(key) == placed.host
    assert table.host_of(quiet) is None  # long over: not live, not learned
    assert [p.host for p in outgoing.take(10)[0]] == [placed.host]  # what was heard is not sent


def test_while_shared_nothing_is_ranked() -> None:
    """A conversation first met at a later turn is ranked by a replica on its own; one
    sharing placements places it as new (its other turns' placements come from the
    store), so the two ways never mix."""
    alone, (table, _) = Conversations(ONE_SLOT), shared()
    for n, key in enumerate(keys(3, seed=9)):
        alone.place(key, HOSTS, {}, 1.5, T0, turn=n + 2)
        table.place(key, HOSTS, {}, 1.5, T0, turn=n + 2)
    assert alone._entries[keys(1, seed=9)[0]].ranked
    assert not any(entry.ranked for entry in table._entries.values())


def test_a_turn_placed_again_elsewhere_is_followed() -> None:
    """A turn that waited at its busy home and went elsewhere is placed twice with the same
    turn: the process that heard the first placement takes the second too."""
    (one, one_out), (two, _) = shared(), shared()
    (key,) = keys(1, seed=11)
    first = one.place(key, HOSTS, {}, 1.5, T0, turn=0)
    assert first is not None
    relay(one_out, [two], T0)
    again = one.place(key, HOSTS, {}, 1.5, T0 + 1, exclude=[first.host], turn=0)
    assert again is not None and again.host != first.host
    relay(one_out, [two], T0 + 1)
    assert two.host_of(key) == again.host
