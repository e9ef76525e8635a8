"""Each host's last five minutes (crossbar.stats.window): what the status page's Requests,
Errors and "First byte p50" columns show. Pure: a Clock moves time, nothing waits."""

from __future__ import annotations

import tracemalloc

import pytest
from twisted.internet.task import Clock

from crossbar.stats.record import Observers, RequestRecord
from crossbar.stats.window import HostRecent, RecentTraffic

T0 = 1_700_000_000.0  # a multiple of 10 s: the first request opens a bucket


def done(host: str | None, status: int = 200, first_byte: float | None = 0.5) -> RequestRecord:
    return RequestRecord("lab", host, status, 1.0, first_byte, 0, "m1")


@pytest.fixture
def recent(clock: Clock) -> RecentTraffic:
    return RecentTraffic(["gpu-a", "gpu-b"], clock)


def test_requests_and_errors_are_counted_per_host(recent: RecentTraffic) -> None:
    for status in (200, 404, 499, 500, 502, 504):
        recent.request_done(done("gpu-a", status))
    recent.request_done(done("gpu-b", 503))

    # 499 is the client leaving and 404 the client's mistake: only 5xx are the host's errors
    assert recent.host("gpu-a") == HostRecent(requests=6, errors=3, ttfb_p50=0.5)
    assert recent.host("gpu-b") == HostRecent(requests=1, errors=1, ttfb_p50=0.5)


def test_a_host_with_no_traffic_has_zeros_and_no_median(recent: RecentTraffic) -> None:
    assert recent.hosts() == {"gpu-a": HostRecent(0, 0, None), "gpu-b": HostRecent(0, 0, None)}


@pytest.mark.parametrize(
    ("first_bytes", "p50"),
    [
        ([0.3, 0.1, 0.2], 0.2),
        ([0.1, 0.2], 0.1),  # nearest rank: the lower of two middles
        ([0.1, 0.2, 0.2, 9.0], 0.2),
        ([0.1234], 0.12),  # two significant digits, as shown
        ([0.0456], 0.046),
        ([12.34], 12.0),
        ([0.000_001], 0.000_01),  # below the grid: its smallest value
        ([50_000.0], 9900.0),  # above it: its largest
        ([2.0, None, None, 7.0, 5.0], 5.0),  # requests without a status line have no ttfb
    ],
)
def test_the_median_time_to_first_byte(
    recent: RecentTraffic, first_bytes: list[float | None], p50: float
) -> None:
    for first_byte in first_bytes:
        recent.request_done(done("gpu-a", first_byte=first_byte))
    summary = recent.host("gpu-a")
    assert summary.requests == len(first_bytes)
    assert summary.ttfb_p50 == p50


def test_only_failures_give_requests_but_no_median(recent: RecentTraffic) -> None:
    recent.request_done(done("gpu-a", 502, first_byte=None))
    assert recent.host("gpu-a") == HostRecent(requests=1, errors=1, ttfb_p50=None)


def test_the_median_spans_the_window_not_one_bucket(clock: Clock, recent: RecentTraffic) -> None:
    for seconds in (1.0, 1.0, 1.0):
        recent.request_done(done("gpu-a", first_byte=seconds))
        clock.advance(60)
    for seconds in (0.2, 0.2):
        recent.request_done(done("gpu-a", first_byte=seconds))
    assert recent.host("gpu-a") == HostRecent(requests=5, errors=0, ttfb_p50=1.0)


def test_requests_leave_the_window_after_five_minutes(clock: Clock, recent: RecentTraffic) -> None:
    clock.advance(5)
    recent.request_done(done("gpu-a", 500, first_byte=3.0))
    clock.advance(100)
    recent.request_done(done("gpu-a", 200, first_byte=0.1))
    recent.request_done(done("gpu-a", 200, first_byte=0.1))

    clock.advance(189)  # the first request is 4 min 49 s old
    assert recent.host("gpu-a") == HostRecent(requests=3, errors=1, ttfb_p50=0.1)

    clock.advance(6)  # 4 min 55 s, and its 10 s bucket is 5 min old: gone
    assert recent.host("gpu-a") == HostRecent(requests=2, errors=0, ttfb_p50=0.1)

    clock.advance(100)
    assert recent.host("gpu-a") == HostRecent(requests=0, errors=0, ttfb_p50=None)


def test_a_bucket_is_reused_after_a_lap_of_the_ring(clock: Clock, recent: RecentTraffic) -> None:
    """Ten minutes later the same slot of the ring holds the new request alone."""
    recent.request_done(done("gpu-a", 500, first_byte=4.0))
    clock.advance(600)
    recent.request_done(done("gpu-a", 200, first_byte=0.3))
    assert recent.host("gpu-a") == HostRecent(requests=1, errors=0, ttfb_p50=0.3)


def test_an_unknown_host_or_none_is_ignored(recent: RecentTraffic) -> None:
    recent.request_done(done("gpu-z", 500))
    recent.request_done(done(None, 503, first_byte=None))  # no healthy host: none tried
    assert recent.hosts() == {"gpu-a": HostRecent(), "gpu-b": HostRecent()}
    assert recent.host("gpu-z") == HostRecent()


class Milliseconds:
    """A clock counted in whole milliseconds, so that no 10 s boundary is blurred by
    adding 0.001 a million times."""

    def __init__(self, start: float) -> None:
        self.ms = int(start * 1000)

    def seconds(self) -> float:
        return self.ms / 1000


def test_memory_stays_bounded_whatever_the_traffic() -> None:
    """A million requests to one host, 1000 a second for over 16 minutes: once every
    bucket of the window is in use, memory does not grow, and the counts stay those of
    the last five minutes."""
    clock = Milliseconds(T0)
    # the n-th request comes at n ms; 1 in 100 fails; ttfb n % 1000 ms
    outcomes = [done("gpu-a", 500 if i % 100 == 0 else 200, i / 1000) for i in range(1000)]

    def feed(count: int) -> None:
        for _ in range(count):
            clock.ms += 1
            recent.request_done(outcomes[clock.ms % 1000])

    tracemalloc.start()
    try:
        recent = RecentTraffic(["gpu-a"], clock)
        feed(310_000)  # every bucket of the ring written at least once
        full = tracemalloc.get_traced_memory()[0]
        feed(1_000_000)
        grown = tracemalloc.get_traced_memory()[0] - full
    finally:
        tracemalloc.stop()

    assert full < 400_000, f"{full} bytes for one busy host"  # 30 buckets of 810 counts
    assert grown < 10_000, f"{grown} bytes more after a million requests"
    # now T0 + 1310 s: the window is [T0 + 1020 s, now], 290 s of full buckets and one request
    assert recent.host("gpu-a") == HostRecent(requests=290_001, errors=2901, ttfb_p50=0.5)


def test_observers_are_each_told_in_turn(recent: RecentTraffic) -> None:
    seen: list[tuple[str, RequestRecord]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def request_done(self, outcome: RequestRecord) -> None:
            seen.append((self.name, outcome))

    outcome = done("gpu-a", 502)
    Observers(Recorder("metrics"), recent, Recorder("other")).request_done(outcome)
    assert seen == [("metrics", outcome), ("other", outcome)]
    assert recent.host("gpu-a") == HostRecent(requests=1, errors=1, ttfb_p50=0.5)


# -- cache_affinity routes: turns at their conversation's home ---------------------------------


def turn(route: str, affinity: str | None, host: str = "gpu-a") -> RequestRecord:
    return RequestRecord(route, host, 200, 1.0, 0.5, 0, "m1", affinity)  # type: ignore[arg-type]


def test_turns_at_home_are_counted_per_affinity_route(clock: Clock) -> None:
    recent = RecentTraffic(["gpu-a", "gpu-b"], clock, routes=["agents"])
    for affinity in ("new", "home", "home", "moved"):
        recent.request_done(turn("agents", affinity))
    recent.request_done(turn("agents", None))  # no conversation (no messages): not a turn
    recent.request_done(turn("other", "home"))  # a route not counted
    window = recent.affinity("agents")
    assert (window.turns, window.home, window.moved, window.home_share) == (4, 3, 1, 0.75)
    assert recent.affinity("other").home_share is None
    assert recent.host("gpu-a").requests == 6  # every request still counts for its host


def test_turns_leave_the_window_after_five_minutes(clock: Clock) -> None:
    recent = RecentTraffic(["gpu-a"], clock, routes=["agents"])
    recent.request_done(turn("agents", "moved"))
    clock.advance(200)
    recent.request_done(turn("agents", "home"))
    assert recent.affinity("agents").turns == 2
    clock.advance(110)  # the first turn is 310 s old
    assert (recent.affinity("agents").turns, recent.affinity("agents").home_share) == (1, 1.0)
    clock.advance(300)
    assert recent.affinity("agents").turns == 0


# -- a reload: set_hosts ------------------------------------------------------------------------


def test_a_reload_keeps_the_window_of_hosts_that_stay(clock: Clock, recent: RecentTraffic) -> None:
    recent.request_done(done("gpu-a", 200, 0.3))
    recent.request_done(done("gpu-a", 502, None))
    recent.request_done(done("gpu-b"))
    recent.set_hosts(["gpu-c", "gpu-a"], [])
    assert recent.hosts() == {
        "gpu-c": HostRecent(0, 0, None),  # new: empty
        "gpu-a": HostRecent(requests=2, errors=1, ttfb_p50=0.3),  # kept
    }
    recent.request_done(done("gpu-c", 200, 0.1))
    recent.request_done(done("gpu-a", 200, 0.3))
    assert recent.host("gpu-a").requests == 3
    assert recent.host("gpu-c") == HostRecent(1, 0, 0.1)


def test_a_removed_host_reads_empty_and_its_outcomes_add_nothing(
    recent: RecentTraffic,
) -> None:
    recent.request_done(done("gpu-b"))
    recent.set_hosts(["gpu-a"], [])
    assert recent.host("gpu-b") == HostRecent()
    recent.request_done(done("gpu-b"))  # its last request in flight ends
    assert recent.host("gpu-b") == HostRecent()
    assert list(recent.hosts()) == ["gpu-a"]
    recent.set_hosts(["gpu-a", "gpu-b"], [])  # configured again: from nothing
    assert recent.host("gpu-b") == HostRecent()


def test_a_reload_keeps_the_turns_of_affinity_routes_that_stay(clock: Clock) -> None:
    recent = RecentTraffic(["gpu-a"], clock, routes=["agents", "old"])
    for affinity in ("new", "home", "moved"):
        recent.request_done(turn("agents", affinity))
    recent.request_done(turn("old", "home"))
    recent.set_hosts(["gpu-a"], ["agents", "fresh"])
    assert (recent.affinity("agents").turns, recent.affinity("agents").home) == (3, 2)
    assert recent.affinity("fresh").turns == 0
    assert recent.affinity("old").turns == 0  # removed: forgotten
    recent.request_done(turn("old", "home"))
    recent.request_done(turn("fresh", "moved"))
    assert recent.affinity("old").turns == 0
    assert (recent.affinity("fresh").turns, recent.affinity("fresh").moved) == (1, 1)


# -- tokens, prompt cache and speed -----------------------------------------------------------


def answered(
    prompt: int | None = None,
    cached: int | None = None,
    generated: int | None = None,
    speed: float | None = None,
    first_token: float | None = None,
    host: str = "gpu-a",
) -> RequestRecord:
    return RequestRecord(
        "lab",
        host,
        200,
        1.0,
        0.01,
        prompt_tokens=prompt,
        cached_tokens=cached,
        generated_tokens=generated,
        tokens_per_second=speed,
        first_token=first_token,
    )


def test_tokens_the_cache_hit_rate_and_the_speed(recent: RecentTraffic) -> None:
    recent.request_done(answered(1000, 900, 100, 50.0, 0.4))  # 2 s of generation
    recent.request_done(answered(1000, 100, 300, 100.0, 2.0))  # 3 s
    recent.request_done(answered(None, 500, None, None, None))  # cached without a prompt count
    recent.request_done(answered(50, None, 0, 0.0, None))  # no cached count: none from cache
    summary = recent.host("gpu-a")
    assert (summary.prompt_tokens, summary.cached_tokens, summary.generated_tokens) == (
        2050,
        1000,
        400,
    )
    assert summary.cache_hit_rate == pytest.approx(1000 / 2050)
    # 400 tokens over 5 s of generation, not the mean of 50 and 100 tok/s
    assert summary.tokens_per_second == pytest.approx(80.0)
    assert summary.first_token_p50 == 0.4  # the lower of two middles
    assert summary.ttfb_p50 == 0.01  # the head's time stays apart
    assert recent.host("gpu-b") == HostRecent()


def test_without_tokens_there_is_no_rate_no_speed_no_first_token(recent: RecentTraffic) -> None:
    recent.request_done(answered())
    recent.request_done(answered(generated=5, speed=None))  # a speed not reported
    summary = recent.host("gpu-a")
    assert summary.requests == 2 and summary.generated_tokens == 5
    assert (summary.cache_hit_rate, summary.tokens_per_second, summary.first_token_p50) == (
        None,
        None,
        None,
    )


@pytest.mark.parametrize("speed", [0.0, float("inf"), float("nan")])
def test_a_speed_that_is_no_speed_is_left_out(recent: RecentTraffic, speed: float) -> None:
    recent.request_done(answered(generated=10, speed=speed))
    recent.request_done(answered(generated=20, speed=10.0))
    assert recent.host("gpu-a").tokens_per_second == 10.0
    assert recent.host("gpu-a").generated_tokens == 30


def test_tokens_leave_the_window_with_their_bucket(clock: Clock, recent: RecentTraffic) -> None:
    recent.request_done(answered(100, 100, 10, 10.0, 9.0))
    clock.advance(200)
    recent.request_done(answered(100, 0, 10, 20.0, 0.1))
    assert recent.host("gpu-a").cache_hit_rate == 0.5
    clock.advance(100)  # the first request's bucket is 5 min old
    summary = recent.host("gpu-a")
    assert (summary.prompt_tokens, summary.cache_hit_rate, summary.first_token_p50) == (
        100,
        0.0,
        0.1,
    )
    assert summary.tokens_per_second == 20.0


def test_memory_stays_bounded_with_tokens_too() -> None:
    """Every request reports tokens and a first token: the window still does not grow."""
    clock = Milliseconds(T0)
    outcomes = [answered(1000 + i, i, 50, 40.0 + i % 7, i / 100) for i in range(100)]

    def feed(count: int) -> None:
        for _ in range(count):
            clock.ms += 1
            window.request_done(outcomes[clock.ms % 100])

    tracemalloc.start()
    try:
        window = RecentTraffic(["gpu-a"], clock)
        feed(310_000)
        full = tracemalloc.get_traced_memory()[0]
        feed(300_000)
        grown = tracemalloc.get_traced_memory()[0] - full
    finally:
        tracemalloc.stop()
    assert full < 400_000, f"{full} bytes for one busy host"
    assert grown < 10_000, f"{grown} bytes more after 300,000 requests"
    assert window.host("gpu-a").requests == 290_001
