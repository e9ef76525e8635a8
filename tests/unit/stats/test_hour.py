"""Each host's last hour, minute by minute (crossbar.stats.hour): what the status page's
charts draw. Pure: a Clock moves time, nothing waits."""

from __future__ import annotations

import timeit
import tracemalloc

import pytest
from twisted.internet.task import Clock

from crossbar.stats.hour import FIRST_TOKEN_GRID, MINUTES, HostHour, HourlyTraffic
from crossbar.stats.record import Observers, RequestRecord
from crossbar.stats.window import RecentTraffic

T0 = 1_700_000_040.0  # a whole minute: the first request opens a bucket


def done(
    host: str | None = "gpu-a",
    status: int = 200,
    prompt: int | None = None,
    cached: int | None = None,
    generated: int | None = None,
    first_token: float | None = None,
) -> RequestRecord:
    return RequestRecord(
        "lab",
        host,
        status,
        1.0,
        0.01,
        prompt_tokens=prompt,
        cached_tokens=cached,
        generated_tokens=generated,
        first_token=first_token,
    )


@pytest.fixture
def hourly(clock: Clock) -> HourlyTraffic:
    return HourlyTraffic(["gpu-a", "gpu-b"], clock)


def test_a_quiet_hour_is_sixty_zeros(hourly: HourlyTraffic) -> None:
    hour = hourly.host("gpu-a")
    assert hour == HostHour()
    assert len(hour.requests) == len(hour.first_token_p50) == MINUTES == 60
    assert set(hour.requests) == {0} and set(hour.first_token_p50) == {None}
    assert list(hourly.hosts()) == ["gpu-a", "gpu-b"]


def test_each_minute_counts_its_own_requests(clock: Clock, hourly: HourlyTraffic) -> None:
    hourly.request_done(done(prompt=1000, cached=800, generated=50, first_token=0.2))
    hourly.request_done(done(status=502))
    clock.advance(59)  # still the same minute
    hourly.request_done(done(prompt=10, generated=5, first_token=0.5))
    clock.advance(1)  # the next one
    hourly.request_done(done(status=500, first_token=3.0))
    hourly.request_done(done("gpu-b"))

    hour = hourly.host("gpu-a")
    assert hour.requests[-2:] == (3, 1) and sum(hour.requests) == 4
    assert hour.errors[-2:] == (1, 1)
    assert hour.prompt_tokens[-2:] == (1010, 0)
    assert hour.cached_tokens[-2:] == (800, 0)
    assert hour.generated_tokens[-2:] == (55, 0)
    assert hour.first_token_p50[-2:] == (0.2, 3.2)  # ten bins a decade: 3.0 s is in 3.2's
    assert hour.first_token_p50[:-2] == (None,) * 58
    assert sum(hourly.host("gpu-b").requests) == 1


def test_minutes_slide_left_and_leave_after_an_hour(clock: Clock, hourly: HourlyTraffic) -> None:
    hourly.request_done(done(generated=7))
    clock.advance(60 * 10)
    assert hourly.host("gpu-a").generated_tokens[-11] == 7  # ten minutes ago
    clock.advance(60 * 49)
    assert hourly.host("gpu-a").generated_tokens[0] == 7  # the oldest minute shown
    clock.advance(60)
    assert hourly.host("gpu-a") == HostHour()


def test_a_minute_is_reused_after_a_lap_of_the_ring(clock: Clock, hourly: HourlyTraffic) -> None:
    """An hour later the same bucket holds the new minute alone."""
    hourly.request_done(done(status=500, prompt=5, first_token=9.0))
    clock.advance(60 * 60)
    hourly.request_done(done(prompt=1, first_token=0.01))
    hour = hourly.host("gpu-a")
    assert (sum(hour.requests), sum(hour.errors), sum(hour.prompt_tokens)) == (1, 0, 1)
    assert [p for p in hour.first_token_p50 if p is not None] == [0.01]


def test_cached_tokens_count_only_beside_their_prompt(hourly: HourlyTraffic) -> None:
    hourly.request_done(done(cached=500))
    assert sum(hourly.host("gpu-a").cached_tokens) == 0


@pytest.mark.parametrize(
    ("seconds", "p50"),
    [
        ([0.3, 0.1, 0.2], 0.2),
        ([0.1, 0.2], 0.1),  # nearest rank: the lower of two middles
        ([1.0, 1.1], 1.0),  # 1.1 s is nearer 1.0 than 1.3
        ([0.000_01], 0.001),  # below the grid: its smallest value
        ([5000.0], 1000.0),  # above it: its largest
    ],
)
def test_a_minutes_median_first_token(
    hourly: HourlyTraffic, seconds: list[float], p50: float
) -> None:
    for second in seconds:
        hourly.request_done(done(first_token=second))
    assert hourly.host("gpu-a").first_token_p50[-1] == p50


def test_the_grid_is_ten_steps_a_decade() -> None:
    assert FIRST_TOKEN_GRID[:11] == (
        0.001,
        0.0013,
        0.0016,
        0.002,
        0.0025,
        0.0032,
        0.004,
        0.005,
        0.0063,
        0.0079,
        0.01,
    )
    assert (len(FIRST_TOKEN_GRID), FIRST_TOKEN_GRID[-1]) == (61, 1000.0)


def test_unknown_hosts_and_none_add_nothing(hourly: HourlyTraffic) -> None:
    hourly.request_done(done("gpu-z"))
    hourly.request_done(done(None, 503))
    assert hourly.hosts() == {"gpu-a": HostHour(), "gpu-b": HostHour()}
    assert hourly.host("gpu-z") == HostHour()


def test_a_reload_keeps_the_hosts_that_stay_and_forgets_the_others(
    hourly: HourlyTraffic,
) -> None:
    hourly.request_done(done("gpu-a", generated=3))
    hourly.request_done(done("gpu-b", generated=4))
    hourly.set_hosts(["gpu-b", "gpu-c"])
    assert list(hourly.hosts()) == ["gpu-b", "gpu-c"]
    assert sum(hourly.host("gpu-b").generated_tokens) == 4
    assert hourly.host("gpu-c") == HostHour()
    hourly.set_hosts(["gpu-a", "gpu-b"])  # back again: a new host, its old hour gone
    assert hourly.host("gpu-a") == HostHour()


def test_a_removed_hosts_memory_is_freed(clock: Clock) -> None:
    hosts = [f"gpu-{i}" for i in range(50)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        hourly = HourlyTraffic(hosts, clock)
        for _ in range(MINUTES):
            for host in hosts:
                hourly.request_done(done(host, prompt=100, generated=10, first_token=0.5))
            clock.advance(60)
        held = tracemalloc.get_traced_memory()[0] - base
        hourly.set_hosts(hosts[:1])
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held < 50 * 40_000, f"{held} bytes for 50 hosts"
    assert kept < held / 20, f"{kept} of {held} bytes kept for one host of 50"


class Milliseconds:
    """A clock counted in whole milliseconds (no minute boundary blurred by float sums)."""

    def __init__(self, start: float) -> None:
        self.ms = int(start * 1000)

    def seconds(self) -> float:
        return self.ms / 1000


def test_memory_stays_fixed_whatever_the_traffic() -> None:
    """200,000 requests to one host over 67 minutes, each with tokens and a first token:
    once every minute of the ring is in use, memory does not grow."""
    clock = Milliseconds(T0)
    outcomes = [
        done(prompt=1000 + i, cached=i, generated=50, first_token=i / 10) for i in range(100)
    ]

    def feed(count: int) -> None:
        for _ in range(count):
            clock.ms += 20
            window.request_done(outcomes[clock.ms % 100])

    tracemalloc.start()
    try:
        window = HourlyTraffic(["gpu-a"], clock)
        feed(180_000)  # an hour: every minute of the ring written
        full = tracemalloc.get_traced_memory()[0]
        feed(20_000)
        grown = tracemalloc.get_traced_memory()[0] - full
    finally:
        tracemalloc.stop()
    assert full < 40_000, f"{full} bytes for one busy host"
    assert grown < 5_000, f"{grown} bytes more after 20,000 requests"
    hour = window.host("gpu-a")
    assert hour.requests[-1] == 2001  # the minute under way: 40 s at 50 a second, both ends
    assert hour.requests[:-1] == (3000,) * 59


def test_recording_is_cheap(clock: Clock, hourly: HourlyTraffic) -> None:
    """Per request: a lookup, a division, a few increments, a bisect. Loose bound: shared CI."""
    record = done(prompt=1000, cached=900, generated=50, first_token=0.3)
    seconds = min(timeit.repeat(lambda: hourly.request_done(record), number=20_000, repeat=3))
    assert seconds / 20_000 < 20e-6, f"{seconds / 20_000 * 1e6:.1f} us a request"


def test_it_is_an_observer_beside_the_recent_window(clock: Clock, hourly: HourlyTraffic) -> None:
    recent = RecentTraffic(["gpu-a"], clock)
    Observers(recent, hourly).request_done(done(prompt=10, first_token=0.1))
    assert recent.host("gpu-a").prompt_tokens == sum(hourly.host("gpu-a").prompt_tokens) == 10
