"""crossbar.usage.sums: requests folded into per-minute rows, bounded while unwritten."""

from __future__ import annotations

import math

from crossbar.stats.record import RequestRecord
from crossbar.usage.sums import ASKED_NAMES, COUNTS, MinuteSums, refused_as


def used(**fields: object) -> RequestRecord:
    base: dict[str, object] = {
        "route": "lab", "host": "gpu-a", "status": 200, "seconds": 1.0, "model": "m",
        "key": "alice", "prompt_tokens": 100, "cached_tokens": 60, "generated_tokens": 20,
        "first_token": 0.5, "tokens_per_second": 40.0,
    }  # fmt: skip
    return RequestRecord(**(base | fields))  # type: ignore[arg-type]


def named(sums: list[float]) -> dict[str, float]:
    return dict(zip(COUNTS, sums, strict=True))


def test_requests_of_one_minute_and_place_add_up() -> None:
    sums = MinuteSums(lambda model: model == "m")
    sums.add(used(), 120.0)
    sums.add(used(status=502, first_token=1.5, tokens_per_second=None), 179.9)
    sums.add(used(loads=1), 150.0)  # a request that made gpu-a load m
    sums.add(used(), 180.0)  # the next minute
    assert sorted(sums.rows) == [
        (120, "lab", "gpu-a", "m", "alice", ""),
        (180, "lab", "gpu-a", "m", "alice", ""),
    ]
    assert named(sums.rows[120, "lab", "gpu-a", "m", "alice", ""]) == {
        "requests": 3, "errors": 1, "prompt_tokens": 300, "cached_tokens": 180,
        "completion_tokens": 60, "first_token_n": 3, "first_token_seconds": 2.5,
        "speed_n": 2, "speed_sum": 80.0, "loads": 1,
    }  # fmt: skip


def test_names_are_bounded_as_the_metrics_bound_them() -> None:
    """A model no host lists is ``(other)``; no key: the route; no host: ``-``; no model:
    ``(none)``."""
    sums = MinuteSums(lambda model: model == "m")
    sums.add(used(model="x" * 100_000), 0)
    sums.add(used(key=None, host=None, model=None, status=200), 0)  # a merged model list
    assert set(sums.rows) == {
        (0, "lab", "gpu-a", "(other)", "alice", ""),
        (0, "lab", "-", "(none)", "lab", ""),
    }


def test_a_host_s_models_named_other_and_dash_keep_sums_of_their_own() -> None:
    """Audit 3, finding 14: a host listing ``other`` or ``-`` had their usage merged with
    crossbar's buckets for models no host lists and requests that named none."""
    listed = {"other", "-"}
    sums = MinuteSums(lambda model: model in listed)
    for model in ("other", "-", "typo", None, "other"):
        sums.add(used(model=model), 0)
    models = {place[3]: int(row[0]) for place, row in sums.rows.items()}
    assert models == {"other": 2, "-": 1, "(other)": 1, "(none)": 1}


def test_a_request_that_reported_nothing_counts_as_a_request_only() -> None:
    sums = MinuteSums()
    bare = RequestRecord("lab", "gpu-a", 200, 1.0, first_token=-1.0, tokens_per_second=math.inf)
    sums.add(bare, 0)
    assert named(sums.rows[0, "lab", "gpu-a", "(none)", "lab", ""]) == dict.fromkeys(COUNTS, 0) | {
        "requests": 1
    }


def test_take_hands_over_every_row_and_put_back_adds_them_again() -> None:
    sums = MinuteSums()
    sums.add(used(), 0)
    batch = sums.take()
    assert not sums
    sums.add(used(), 0)
    sums.put_back(batch)
    assert named(sums.rows[0, "lab", "gpu-a", "m", "alice", ""])["prompt_tokens"] == 200
    assert named(batch[0, "lab", "gpu-a", "m", "alice", ""])["prompt_tokens"] == 100  # a copy


def test_rows_stop_at_most_and_what_is_left_out_is_counted() -> None:
    """While the store cannot take them, rows pile up to ``most``; a known row still
    adds up, a new one is counted as left out."""
    sums = MinuteSums(most=2)
    for minute in range(4):
        sums.add(used(), minute * 60)
    sums.add(used(), 0)
    assert len(sums) == 2
    assert sums.dropped == 2
    assert named(sums.rows[0, "lab", "gpu-a", "m", "alice", ""])["requests"] == 2
    sums.put_back({(600, "lab", "gpu-a", "m", "alice", ""): [3] + [0] * 8})
    assert sums.dropped == 5


def test_a_request_refused_at_the_door_used_nothing() -> None:
    sums = MinuteSums()
    sums.add(RequestRecord("lab", None, 401, 0.0, refused=True), 0)
    assert not sums


def test_what_crossbar_answered_itself_is_counted_apart_by_why_never_as_served() -> None:
    """An unknown path, no healthy host, a limit: no key's request, no tokens."""
    sums = MinuteSums()
    sums.add(used(host=None, model=None, status=404), 0)
    sums.add(used(host=None, status=503), 0)
    sums.add(RequestRecord("lab", None, 429, 0.0, model="m", shed="limit", key="alice"), 0)
    sums.add(RequestRecord("lab", None, 503, 0.0, model="m", shed="timeout", key="alice"), 0)
    sums.add(RequestRecord("-", None, 404, 0.0), 0)  # an unknown route
    assert not sums.rows
    assert sums.refused == {
        (0, "lab", "alice", "path"): 1,
        (0, "lab", "alice", "no host"): 1,
        (0, "lab", "alice", "limit"): 1,
        (0, "lab", "alice", "timeout"): 1,
        (0, "-", "-", "path"): 1,
    }


def test_a_host_s_4xx_is_no_served_request_and_a_read_that_generates_nothing_is_none() -> None:
    """A model the host does not have (its 404), a GET of /v1/models: the key used nothing."""
    sums = MinuteSums()
    sums.add(used(status=404), 0)
    sums.add(used(status=200, generates=False), 0)
    assert not sums.rows
    assert sums.refused == {(0, "lab", "alice", "host 404"): 1}


def test_a_host_s_answer_is_served_whatever_its_5xx_status() -> None:
    assert refused_as(used(status=404)) == "host 404"  # the host's own 404 (a model it lacks)
    assert refused_as(used(status=502)) is None
    assert refused_as(used(host=None, status=499)) is None  # left while waiting
    assert refused_as(RequestRecord("lab", None, 401, 0.0, refused=True)) == "key"


def test_a_name_an_alias_mapped_is_kept_beside_the_model_served() -> None:
    """Each name sent keeps its own row of the model served; one sent as the model's own
    name has none (``''``)."""
    sums = MinuteSums(lambda model: model == "m")
    sums.add(used(asked_model="claude-sonnet-4-5"), 0)
    sums.add(used(asked_model="claude-sonnet-4-5"), 10)
    sums.add(used(asked_model="claude-haiku-4-5"), 20)
    sums.add(used(), 30)
    requests = {place[3:]: int(row[0]) for place, row in sums.rows.items()}
    assert requests == {
        ("m", "alice", "claude-sonnet-4-5"): 2,
        ("m", "alice", "claude-haiku-4-5"): 1,
        ("m", "alice", ""): 1,
    }


def test_the_names_sent_are_bounded_a_minute_and_kept_printable() -> None:
    """``claude-*`` matches any name a client makes up: past ASKED_NAMES a minute of a
    route and model they are summed as ``(other)``; a long one is cut, a control
    character escaped."""
    sums = MinuteSums(lambda model: model == "m")
    for n in range(ASKED_NAMES + 5):
        sums.add(used(asked_model=f"claude-{n}"), 0)
    sums.add(used(asked_model="claude-0"), 0)  # one of the first: still its own
    sums.add(used(asked_model="claude-new"), 60)  # the next minute: room again
    sums.add(used(asked_model="claude-\n" + "x" * 500), 60)
    names = {place[5]: int(row[0]) for place, row in sums.rows.items() if place[0] == 0}
    assert len(names) == ASKED_NAMES + 1
    assert names["(other)"] == 5 and names["claude-0"] == 2
    later = {place[5] for place in sums.rows if place[0] == 60}
    assert later == {"claude-new", "claude-\\x0a" + "x" * 86 + "..."}
