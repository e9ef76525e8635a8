"""crossbar.routing.fit: which hosts a request's prompt and answer fit, and how a policy
chooses among them when the proxy passes the others over (``Ask.exclude``)."""

from __future__ import annotations

from crossbar.config import RouteConfig
from crossbar.polling.health import HostState
from crossbar.routing.fit import REPLY_MARGIN, fits_nowhere, largest_window, too_small
from crossbar.routing.policies import Ask, Conversation, Policies
from crossbar.routing.rendezvous import rendezvous

M = "qwen3-coder-30b"


def host(
    name: str, window: int | None, *, trained: int | None = None, healthy: bool = True
) -> HostState:
    windows = {} if window is None else {M: window}
    learned = {} if trained is None else {M: trained}
    return HostState(name, f"http://{name}", healthy, (M,), (M,), windows=windows, trained=learned)


FLEET = {"small": host("small", 2048), "big": host("big", 8192), "huge": host("huge", 32768)}
HOSTS = ("small", "big", "huge")


def test_a_host_too_small_for_prompt_and_answer_is_passed_over() -> None:
    assert too_small(HOSTS, M, FLEET, 1000, 500) == []
    assert too_small(HOSTS, M, FLEET, 3500, 500) == ["small"]
    assert too_small(HOSTS, M, FLEET, 3500, None) == ["small"]  # the margin, 1,024
    assert too_small(HOSTS, M, FLEET, 7000, 1000) == ["small"]
    assert too_small(HOSTS, M, FLEET, 7000, 1200) == ["small", "big"]
    assert too_small(HOSTS, M, FLEET, 2048 - REPLY_MARGIN, None) == ["small"]  # 2048 refused


def test_an_answer_larger_than_every_window_keeps_the_hosts_the_prompt_fits() -> None:
    """Claude Code asks ``max_tokens: 32000``: on a fleet of 8k windows the prompt decides."""
    assert too_small(HOSTS, M, FLEET, 3000, 32_000) == ["small"]
    assert too_small(HOSTS, M, FLEET, 2047, 64_000) == []  # 2,047 < 2,048: it fits everywhere


def test_a_prompt_that_fits_nowhere_by_its_estimate_goes_to_the_largest_window() -> None:
    """An estimate is no proof: the host that may hold it, if any, is the largest."""
    assert too_small(HOSTS, M, FLEET, 40_000, 0) == ["small", "big"]


def test_a_host_whose_window_is_unknown_may_fit_and_a_training_context_is_a_bound() -> None:
    states = {
        "small": host("small", 2048),
        "unknown": host("unknown", None),
        "trained": host("trained", None, trained=4096),
    }
    hosts = ("small", "unknown", "trained")
    assert too_small(hosts, M, states, 3000, 0) == ["small"]
    assert too_small(hosts, M, states, 5000, 0) == ["small", "trained"]


def test_hosts_tried_or_down_are_not_counted_as_fitting() -> None:
    states = dict(FLEET, huge=host("huge", 32768, healthy=False))
    assert too_small(HOSTS, M, states, 7000, 1200) == ["small"]  # huge is down: big is best
    assert too_small(HOSTS, M, FLEET, 7000, 1200, exclude=("huge",)) == ["small"]


def test_a_refused_prompt_fits_nowhere_only_when_every_other_window_is_known_and_too_small() -> (
    None
):
    assert not fits_nowhere(HOSTS, M, FLEET, 3528, tried=("small",))
    assert fits_nowhere(HOSTS, M, FLEET, 40_000, tried=("huge",))
    assert fits_nowhere(HOSTS, M, FLEET, 32768, tried=())  # a prompt as long as the window
    unknown = dict(FLEET, big=host("big", None))
    assert not fits_nowhere(HOSTS, M, unknown, 40_000, tried=("huge",))
    assert largest_window(HOSTS, M, FLEET) == 32768
    assert largest_window(HOSTS, "other", FLEET) is None


def test_cache_affinity_keeps_a_conversation_home_while_it_fits_then_moves_it_once() -> None:
    route = RouteConfig("lab", ("small", "big"), M, policy="cache_affinity")
    states = {"small": FLEET["small"], "big": FLEET["big"]}
    policy = Policies(["lab"]).of(route)
    # A conversation whose home (by rendezvous) is the small host.
    key = next(k for n in range(100) if rendezvous(k := b"c%d" % n, ["small", "big"])[0] == "small")

    def turn(n: int, prompt: int) -> str:
        excluded = too_small(route.hosts, M, states, prompt, 0)
        ask = Ask(M, Conversation(key, n), excluded, now=float(n))
        choice = policy.choose(route, ask, states, {})
        assert choice is not None and choice.placement is not None
        return f"{choice.host} {choice.placement.outcome}"

    assert turn(0, 500) == "small new"
    assert turn(1, 1500) == "small home"
    assert turn(2, 3000) == "big moved"  # too long for its home: moved to where it fits
    assert turn(3, 3500) == "big moved"  # later turns follow it there
    assert turn(4, 4000) == "big moved"
