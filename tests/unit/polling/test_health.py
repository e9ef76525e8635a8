"""crossbar.polling.health: the health table, fed by hand (no poller) with a Clock for time.

What polls and real requests do to a host's state: when it goes up and down, how many good
polls win back trust, how many failed requests in a row take it out, and who is told."""

from __future__ import annotations

import attrs
import pytest
from twisted.internet.task import Clock

from crossbar.config import HostSettings
from crossbar.polling.health import HealthTable, HostState


def make_table(**settings: HostSettings) -> tuple[HealthTable, Clock]:
    """Hosts ``gpu-a`` and ``gpu-b``, with ``settings`` for some; the clock at 1000 s."""
    clock = Clock()
    clock.advance(1000)
    urls = {"gpu-a": "http://10.0.0.1:8080", "gpu-b": "http://10.0.0.2:8080"}
    return HealthTable(urls, clock, settings), clock


def get(table: HealthTable, name: str = "gpu-a") -> HostState:
    state = table.get(name)
    assert state is not None
    return state


def test_a_host_starts_unknown() -> None:
    table, _ = make_table()
    assert table.names == ["gpu-a", "gpu-b"]
    assert get(table).to_json() == {
        "url": "http://10.0.0.1:8080",
        "healthy": False,
        "state": "unknown",
        "loaded": [],
        "known": [],
        "consecutive": 0,
        "last_ok": None,
        "last_err": "",
    }
    assert table.get("nobody") is None


def test_hosts_without_settings_get_the_defaults() -> None:
    own = HostSettings(max_fails=3)
    table, _ = make_table(**{"gpu-a": own})
    assert table.settings == {"gpu-a": own, "gpu-b": HostSettings()}


# -- polls ------------------------------------------------------------------------------------


def test_a_good_poll_brings_an_unknown_host_up() -> None:
    table, clock = make_table()
    clock.advance(5)
    table.record_ok("gpu-a", ["m2", "m1", "m2"], ["m3", "m1", "m2", "m1"])
    state = get(table)
    assert (state.state, state.healthy) == ("up", True)
    assert (state.loaded, state.known) == (("m1", "m2"), ("m1", "m2", "m3"))
    assert (state.consecutive, state.polls, state.poll_failures) == (1, 1, 0)
    assert state.last_ok == 1005.0
    assert get(table, "gpu-b").state == "unknown"


def test_a_failed_poll_takes_an_unknown_host_down() -> None:
    table, _ = make_table()
    table.record_failure("gpu-a", "health: HTTP 503")
    state = get(table)
    assert (state.state, state.healthy) == ("down", False)
    assert (state.last_err, state.last_ok) == ("health: HTTP 503", None)
    assert (state.consecutive, state.polls, state.poll_failures) == (0, 1, 1)


def test_a_failure_keeps_the_models_last_seen_and_a_good_poll_clears_the_error() -> None:
    table, clock = make_table()
    table.record_ok("gpu-a", ["m1"], ["m1", "m2"])
    clock.advance(5)
    table.record_failure("gpu-a", "health: timed out after 5s")
    state = get(table)
    assert (state.loaded, state.known, state.last_ok) == (("m1",), ("m1", "m2"), 1000.0)
    table.record_ok("gpu-a", [], ["m2"])
    state = get(table)
    assert (state.last_err, state.loaded, state.known) == ("", (), ("m2",))


@pytest.mark.parametrize("recovery_polls", [1, 2, 3])
def test_after_a_failure_recovery_polls_good_polls_in_a_row_are_needed(
    recovery_polls: int,
) -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(recovery_polls=recovery_polls)})
    table.record_ok("gpu-a", [], [])
    table.record_failure("gpu-a", "health: HTTP 500")
    seen = []
    for _ in range(recovery_polls + 1):
        table.record_ok("gpu-a", [], [])
        seen.append((get(table).healthy, get(table).consecutive))
    assert seen == [(n >= recovery_polls, n) for n in range(1, recovery_polls + 2)]


def test_a_failure_during_recovery_starts_the_count_again() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(recovery_polls=2)})
    table.record_failure("gpu-a", "refused")
    table.record_ok("gpu-a", [], [])
    table.record_failure("gpu-a", "refused")
    table.record_ok("gpu-a", [], [])
    assert (get(table).healthy, get(table).consecutive) == (False, 1)
    table.record_ok("gpu-a", [], [])
    assert (get(table).healthy, get(table).consecutive) == (True, 2)


def test_a_host_that_never_failed_is_trusted_at_its_first_good_poll() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(recovery_polls=3)})
    table.record_ok("gpu-a", [], [])
    assert get(table).healthy


def test_mark_down_takes_a_host_out_at_once_and_is_not_a_poll() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(max_fails=5)})
    table.record_ok("gpu-a", ["m1"], ["m1"])
    table.mark_down("gpu-a", "connection refused")
    state = get(table)
    assert (state.state, state.consecutive) == ("down", 0)
    assert state.last_err == "marked down: connection refused"
    assert (state.polls, state.poll_failures, state.loaded) == (1, 0, ("m1",))
    table.record_ok("gpu-a", ["m1"], ["m1"])
    assert not get(table).healthy
    table.record_ok("gpu-a", ["m1"], ["m1"])
    assert get(table).healthy


def test_mark_down_of_a_host_never_polled_makes_it_down() -> None:
    table, _ = make_table()
    table.mark_down("gpu-a", "connection refused")
    state = get(table)
    assert (state.state, state.polled, state.polls) == ("down", False, 0)


def test_unknown_host_names_are_ignored() -> None:
    table, _ = make_table()
    before = table.snapshot()
    table.record_ok("nobody", ["m"], ["m"])
    table.record_failure("nobody", "x")
    table.mark_down("nobody", "x")
    table.request_failed("nobody", "x")
    table.request_ok("nobody")
    assert table.snapshot() == before
    assert table.names == ["gpu-a", "gpu-b"]


# -- real requests (passive health) -----------------------------------------------------------


def test_a_host_is_marked_down_at_the_max_fails_th_failure_in_a_row() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(max_fails=3)})
    table.record_ok("gpu-a", [], [])
    table.request_failed("gpu-a", "connection reset")
    table.request_failed("gpu-a", "connection reset")
    state = get(table)
    assert (state.healthy, state.fails, state.last_err) == (True, 2, "")
    table.request_failed("gpu-a", "answer broken: connection lost")
    state = get(table)
    assert (state.healthy, state.fails) == (False, 3)
    assert state.last_err == "marked down: answer broken: connection lost"
    assert (state.polls, state.poll_failures) == (1, 0)  # requests are not polls


def test_one_failed_request_marks_a_host_down_by_default() -> None:
    table, _ = make_table()
    table.record_ok("gpu-a", [], [])
    table.request_failed("gpu-a", "connection refused")
    assert (get(table).healthy, get(table).fails) == (False, 1)
    assert get(table, "gpu-b").fails == 0


def test_a_good_request_ends_the_run_of_failures() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(max_fails=3)})
    table.record_ok("gpu-a", [], [])
    table.request_failed("gpu-a", "reset")
    table.request_failed("gpu-a", "reset")
    table.request_ok("gpu-a")
    assert get(table).fails == 0
    table.request_failed("gpu-a", "reset")
    table.request_failed("gpu-a", "reset")
    assert (get(table).healthy, get(table).fails) == (True, 2)


def test_a_host_back_up_needs_max_fails_new_failures_to_go_down_again() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(max_fails=2, recovery_polls=2)})
    table.record_ok("gpu-a", [], [])
    table.request_failed("gpu-a", "reset")
    table.request_failed("gpu-a", "reset")
    assert not get(table).healthy
    table.record_ok("gpu-a", [], [])
    assert get(table).fails == 2  # still down: the run is not forgotten yet
    table.record_ok("gpu-a", [], [])
    assert (get(table).healthy, get(table).fails) == (True, 0)
    table.request_failed("gpu-a", "reset")
    assert get(table).healthy


def test_judge_answer_counts_an_unhealthy_status_as_a_failure() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(unhealthy_status=frozenset({502, 503}))})
    table.record_ok("gpu-a", [], [])
    table.judge_answer("gpu-a", 503, 0.1)
    assert (get(table).healthy, get(table).last_err) == (False, "marked down: HTTP 503")


def test_judge_answer_ignores_statuses_not_listed() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(unhealthy_status=frozenset({503}))})
    table.record_ok("gpu-a", [], [])
    for code in (200, 404, 500):
        table.judge_answer("gpu-a", code, 0.1)
    table.judge_answer("gpu-b", 503, 0.1)  # gpu-b has no unhealthy_status
    assert (get(table).healthy, get(table).fails, get(table, "gpu-b").fails) == (True, 0, 0)


def test_judge_answer_counts_an_answer_slower_than_unhealthy_latency() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(unhealthy_latency=10.0, max_fails=2)})
    table.record_ok("gpu-a", [], [])
    table.judge_answer("gpu-a", 200, 10.0)  # exactly the limit is not over it
    assert get(table).fails == 0
    table.judge_answer("gpu-a", 200, 12.34)
    assert get(table).fails == 1
    table.judge_answer("gpu-a", 200, 60.0)
    state = get(table)
    assert (state.healthy, state.last_err) == (False, "marked down: answered after 60.0s")


def test_judge_answer_resets_the_run_on_a_good_answer() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(unhealthy_latency=1.0, max_fails=2)})
    table.record_ok("gpu-a", [], [])
    table.judge_answer("gpu-a", 200, 5.0)
    assert get(table).fails == 1
    table.judge_answer("gpu-a", 200, 0.5)
    assert get(table).fails == 0
    table.judge_answer("gpu-a", 200, 5.0)
    assert (get(table).healthy, get(table).fails) == (True, 1)


# -- listeners and readers --------------------------------------------------------------------


def test_listeners_hear_each_change_of_state_once_not_each_poll() -> None:
    table, _ = make_table(**{"gpu-a": HostSettings(max_fails=2, recovery_polls=2)})
    seen: list[tuple[str, str, str]] = []
    table.on_change(lambda old, new: seen.append((new.name, old.state, new.state)))
    also: list[str] = []
    table.on_change(lambda old, new: also.append(new.state))

    table.record_ok("gpu-a", [], [])
    table.record_ok("gpu-a", ["m"], ["m"])  # models changed, state did not
    table.request_failed("gpu-a", "reset")  # below max_fails
    table.request_failed("gpu-a", "reset")
    table.record_failure("gpu-a", "refused")
    table.record_ok("gpu-a", [], [])  # one good poll: still down
    table.record_ok("gpu-a", [], [])
    table.record_failure("gpu-b", "refused")
    table.record_failure("gpu-b", "refused")

    assert seen == [
        ("gpu-a", "unknown", "up"),
        ("gpu-a", "up", "down"),
        ("gpu-a", "down", "up"),
        ("gpu-b", "unknown", "down"),
    ]
    assert also == ["up", "down", "up", "down"]


def test_the_view_is_live_and_read_only() -> None:
    table, _ = make_table()
    view = table.view
    assert view["gpu-a"].state == "unknown"
    table.record_ok("gpu-a", ["m"], ["m"])
    assert view["gpu-a"].state == "up"  # the same view sees the change
    with pytest.raises(TypeError):
        view["gpu-a"] = HostState(name="gpu-a", url="http://x")  # type: ignore[index]
    with pytest.raises(TypeError):
        del view["gpu-a"]  # type: ignore[attr-defined]
    assert list(view) == ["gpu-a", "gpu-b"]


def test_readers_cannot_change_the_table() -> None:
    table, _ = make_table()
    table.record_ok("gpu-a", ["m"], ["m"])
    snapshot = table.snapshot()
    snapshot.pop("gpu-a")
    assert table.get("gpu-a") is not None
    got = get(table)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        got.healthy = False  # type: ignore[misc]
    exported = got.to_json()
    exported["loaded"].append("zzz")
    assert get(table).loaded == ("m",)


# -- a reload: set_hosts and remove ------------------------------------------------------------

URL_A, URL_B, URL_C = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"


def test_a_reload_keeps_the_state_of_a_host_that_stays() -> None:
    table, _ = make_table()
    table.record_ok("gpu-a", ["m1"], ["m1", "m2"])
    before = get(table)
    retuned = HostSettings(max_fails=4)
    table.set_hosts({"gpu-a": URL_A, "gpu-b": URL_B}, {"gpu-a": retuned})
    assert get(table) is before  # healthy, loaded, counters: all as they were
    assert (get(table).state, get(table).loaded) == ("up", ("m1",))
    assert table.settings == {"gpu-a": retuned, "gpu-b": HostSettings()}


def test_a_new_host_starts_unknown_and_the_live_view_shows_it() -> None:
    table, _ = make_table()
    view = table.view
    table.set_hosts({"gpu-a": URL_A, "gpu-b": URL_B, "gpu-c": URL_C}, {})
    assert table.view is view
    assert list(view) == ["gpu-a", "gpu-b", "gpu-c"]
    assert view["gpu-c"] == HostState(name="gpu-c", url=URL_C)
    assert view["gpu-c"].state == "unknown"
    assert table.names == ["gpu-a", "gpu-b", "gpu-c"]
    table.record_ok("gpu-c", ["m9"], ["m9"])
    assert view["gpu-c"].state == "up" and table.knows("m9")


@pytest.mark.parametrize(
    ("urls", "fresh"),
    [({"gpu-a": "http://10.0.0.99:8080"}, ()), ({"gpu-a": URL_A}, ("gpu-a",))],
    ids=["new url", "fresh"],
)
def test_a_host_at_a_new_address_starts_unknown(
    urls: dict[str, str], fresh: tuple[str, ...]
) -> None:
    table, _ = make_table()
    table.record_ok("gpu-a", ["m1"], ["m1"])
    table.record_ok("gpu-b", ["m2"], ["m2"])
    table.set_hosts({**urls, "gpu-b": URL_B}, {}, fresh=fresh)
    assert get(table) == HostState(name="gpu-a", url=urls["gpu-a"])
    assert get(table).state == "unknown"
    assert get(table, "gpu-b").state == "up"  # the other one untouched
    assert not table.knows("m1")  # what the old address had is not assumed
    assert table.knows("m2")


def test_a_host_left_out_and_not_kept_is_gone() -> None:
    table, _ = make_table()
    view = table.view
    table.record_ok("gpu-b", ["m2"], ["m2", "m3"])
    table.record_ok("gpu-a", ["m1"], ["m1", "m3"])
    table.set_hosts({"gpu-a": URL_A}, {})
    assert table.get("gpu-b") is None
    assert table.names == ["gpu-a"] and list(view) == ["gpu-a"]
    assert "gpu-b" not in table.settings
    assert not table.knows("m2")
    assert table.knows("m1") and table.knows("m3")  # gpu-a lists m3 too


def test_a_kept_host_stays_with_its_old_settings_until_removed() -> None:
    own = HostSettings(max_fails=3)
    table, _ = make_table(**{"gpu-b": own})
    table.record_ok("gpu-b", ["m2"], ["m2"])
    before = get(table, "gpu-b")
    table.set_hosts({"gpu-a": URL_A}, {"gpu-a": HostSettings(max_fails=2)}, keep=["gpu-b"])
    assert get(table, "gpu-b") is before
    assert table.settings["gpu-b"] == own
    assert table.knows("m2")
    table.request_failed("gpu-b", "reset")  # its own max_fails still applies: 1 of 3
    assert get(table, "gpu-b").healthy

    table.remove("gpu-b")
    assert table.get("gpu-b") is None
    assert table.names == ["gpu-a"] and "gpu-b" not in table.settings
    assert not table.knows("m2")


def test_keep_names_only_hosts_the_table_had() -> None:
    table, _ = make_table()
    table.set_hosts({"gpu-a": URL_A}, {}, keep=["gpu-x"])
    assert table.names == ["gpu-a"]


def test_a_reload_tells_no_listener_and_later_changes_are_told() -> None:
    table, _ = make_table()
    seen: list[tuple[str, str, str]] = []
    table.on_change(lambda old, new: seen.append((new.name, old.state, new.state)))
    table.record_ok("gpu-a", [], [])
    table.record_failure("gpu-b", "refused")
    table.set_hosts({"gpu-a": "http://10.0.0.99:8080", "gpu-c": URL_C}, {})  # up -> unknown
    table.remove("gpu-c")
    assert seen == [("gpu-a", "unknown", "up"), ("gpu-b", "unknown", "down")]
    table.record_failure("gpu-a", "refused")
    assert seen[-1] == ("gpu-a", "unknown", "down")


def test_remove_forgets_a_host_and_its_models() -> None:
    table, _ = make_table()
    view = table.view
    table.record_ok("gpu-a", ["m1"], ["m1", "shared"])
    table.record_ok("gpu-b", ["m2"], ["m2", "shared"])
    table.remove("gpu-a")
    assert table.get("gpu-a") is None and "gpu-a" not in view
    assert table.names == ["gpu-b"]
    assert table.settings == {"gpu-b": HostSettings()}
    assert not table.knows("m1")
    assert table.knows("shared") and table.knows("m2")
    table.record_ok("gpu-a", ["m1"], ["m1"])  # a late poll of it is ignored
    assert table.get("gpu-a") is None and not table.knows("m1")
    table.remove("gpu-a")  # twice: nothing
    assert table.names == ["gpu-b"]


def test_slots_are_kept_for_loaded_models_only_and_read_through_capacity() -> None:
    table, _ = make_table()
    table.record_slots("gpu-a", "m1", 4)  # not listed as loaded yet: not kept
    assert get(table).slots == {} and get(table).capacity("m1") is None
    table.record_ok("gpu-a", ["m1", "m2"], ["m1", "m2", "m3"])
    table.record_slots("gpu-a", "m1", 4)
    table.record_slots("gpu-a", "m2", 2)
    table.record_slots("gpu-a", "m3", 8)  # known, not loaded
    table.record_slots("nobody", "m1", 4)
    state = get(table)
    assert state.slots == {"m1": 4, "m2": 2}
    assert (state.capacity("m1"), state.capacity("m2"), state.capacity("m3")) == (4, 2, None)
    assert state.to_json()["slots"] == {"m1": 4, "m2": 2}
    assert state.healthy and get(table, "gpu-b").slots == {}

    table.record_slots("gpu-a", "m2", None)  # an answer that says nothing usable
    assert get(table).slots == {"m1": 4}
    table.record_ok("gpu-a", ["m2"], ["m1", "m2"])  # m1 unloaded: forgotten
    assert get(table).slots == {} and "slots" not in get(table).to_json()


def test_slots_cannot_be_changed_by_a_reader_and_a_state_still_hashes() -> None:
    table, _ = make_table()
    table.record_ok("gpu-a", ["m1"], ["m1"])
    table.record_slots("gpu-a", "m1", 4)
    state = get(table)
    with pytest.raises(TypeError):
        state.slots["m1"] = 64  # type: ignore[index]
    assert get(table).capacity("m1") == 4
    assert hash(state) == hash(attrs.evolve(state, slots={"m1": 1}))  # slots are not hashed


def test_learning_slots_tells_no_listener() -> None:
    table, _ = make_table()
    told: list[tuple[str, str]] = []
    table.on_change(lambda old, new: told.append((old.state, new.state)))
    table.record_ok("gpu-a", ["m1"], ["m1"])
    table.record_slots("gpu-a", "m1", 4)
    assert told == [("unknown", "up")]


def test_what_a_host_says_of_its_slots_is_told_once_it_changes() -> None:
    told: list[int] = []
    table = HealthTable({"gpu-a": "http://a"}, Clock(), slots_learned=lambda: told.append(1))
    table.record_ok("gpu-a", ["m"], ["m"])
    table.record_slots("gpu-a", "m", 4)
    table.record_slots("gpu-a", "m", 4)  # the same again: nothing to tell
    table.record_slots("gpu-a", "m", 2)
    assert len(told) == 2


# -- a router's room: what its /props said, and models_max: in the config ----------------------


def test_a_router_s_room_is_what_it_said_unless_the_config_says_otherwise() -> None:
    from crossbar.polling.routerprops import Room

    table, _ = make_table(**{"gpu-b": HostSettings(models_max=1)})
    assert get(table).max_instances is None and get(table, "gpu-b").max_instances == 1
    table.record_room("gpu-a", Room(4, True))
    table.record_room("gpu-b", Room(4, False))
    assert (get(table).max_instances, get(table).autoload) == (4, True)
    assert (get(table, "gpu-b").max_instances, get(table, "gpu-b").autoload) == (1, False)
    urls = {"gpu-a": "http://10.0.0.1:8080", "gpu-b": "http://10.0.0.2:8080"}
    table.set_hosts(urls, {"gpu-a": HostSettings(models_max=2)})  # a reload
    assert get(table).max_instances == 2 and get(table, "gpu-b").max_instances == 4
    table.record_room("nope", Room(4, True))  # an unknown host: ignored


def test_a_host_at_a_new_address_forgets_what_its_old_router_said_of_its_room() -> None:
    from crossbar.polling.routerprops import Room

    table, _ = make_table()
    table.record_room("gpu-a", Room(4, True))
    table.record_room("gpu-b", Room(2, True))
    urls = {"gpu-a": "http://10.0.0.9:8080", "gpu-b": "http://10.0.0.2:8080"}
    table.set_hosts(urls, {})
    assert get(table).max_instances is None and get(table, "gpu-b").max_instances == 2


def test_a_window_learned_from_a_refusal_is_kept_while_the_model_is_loaded() -> None:
    """What a host's ``exceed_context_size_error`` showed (its ``n_ctx``) is its window."""
    table = HealthTable({"a": "http://a"}, Clock())
    table.record_ok("a", ["m"], ["m", "n"], trained={"m": 32768, "n": 8192})
    table.record_window("a", "n", 2048)  # not loaded: not kept
    table.record_window("a", "m", 2048)
    state = table.get("a")
    assert state is not None
    assert state.windows == {"m": 2048} and state.window_bound("n") == 8192
    assert (state.window_bound("m"), state.window_bound("x")) == (2048, None)
    assert state.window(None) is None
    table.record_window("a", "m", None)
    assert table.get("a").windows == {}  # type: ignore[union-attr]
