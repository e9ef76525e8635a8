"""crossbar.stats.accesslog and crossbar.stats.accessline: one line per request, from its
record, and the record itself in the event for the JSON log."""

from __future__ import annotations

import attrs
from twisted.logger import Logger, formatEvent

from crossbar.logformat import _request, json_line
from crossbar.stats.accessline import access_line
from crossbar.stats.accesslog import AccessLog
from crossbar.stats.record import RequestRecord

RECORD = RequestRecord(
    "lab", "gpu-a", 200, 0.5, 0.1, 9, "m", method=b"POST", path=b"/v1/chat/completions"
)


def test_the_access_event_is_the_one_logger_info_makes() -> None:
    """Every observer (twistd's file, the JSON log, ``LogCapture``) gets from the access
    log the event ``Logger.info`` would have made, to the key."""
    made: list[dict[str, object]] = []
    logger = Logger("crossbar.access", None, made.append)  # type: ignore[arg-type]
    line = "lab gpu-a POST /v1/chat/completions 200 500ms"
    logger.info("{request}", request=line, access=RECORD, access_model="m")
    AccessLog(lambda model: model == "m", logger).request_done(RECORD)
    by_info, ours = made
    assert abs(float(ours.pop("log_time")) - float(by_info.pop("log_time"))) < 5  # type: ignore[arg-type]
    assert ours == by_info
    assert formatEvent(ours) == line


def test_with_the_json_log_the_line_is_the_same_text_once_something_formats_it() -> None:
    """``log_format: json`` writes the record, not the line: the line is made only when
    an observer formats the event, and then it is the same text, in the same JSON line."""
    made: list[dict[str, object]] = []
    logger = Logger("crossbar.access", None, made.append)  # type: ignore[arg-type]
    AccessLog(lambda model: model == "m", logger).request_done(RECORD)
    AccessLog(lambda model: model == "m", logger, text=False).request_done(RECORD)
    text, lazy = made
    assert not isinstance(lazy["request"], str)
    assert formatEvent(lazy) == formatEvent(text) == access_line(RECORD)
    assert str(lazy["request"]) == text["request"]
    lazy["log_time"] = text["log_time"]
    assert json_line(lazy) == json_line(text)


def test_a_model_no_host_lists_is_logged_as_other() -> None:
    """A client writes what it likes into ``model``: 15 MiB of it must not become a log line."""
    made: list[dict[str, object]] = []
    logger = Logger("crossbar.access", None, made.append)  # type: ignore[arg-type]
    log = AccessLog(lambda model: model == "m", logger)
    log.request_done(RequestRecord("lab", "gpu-a", 200, 0.5, model="x" * 1_000_000))
    log.request_done(RequestRecord("lab", "gpu-a", 200, 0.5, model="m"))
    log.request_done(RequestRecord("lab", "gpu-a", 200, 0.5))
    assert [event["access_model"] for event in made] == ["(other)", "m", None]


def test_the_access_line_says_what_went_unusually() -> None:
    plain = access_line(RECORD)
    assert plain == "lab gpu-a POST /v1/chat/completions 200 500ms"
    moved = RequestRecord(
        "lab", "gpu-b", 200, 0.8404, method=b"POST", path=b"/v1/chat/completions",
        tried=("gpu-a", "gpu-b"), client_left=True, moved_from="gpu-a",
    )  # fmt: skip
    assert access_line(moved) == (
        "lab gpu-b POST /v1/chat/completions 200 840ms"
        " (client left) (tried gpu-a, gpu-b) (moved from gpu-a)"
    )
    odd = RequestRecord("-", None, 404, 0, path=b"/x\x00", cut_off=True, client_left=True)
    assert access_line(odd) == "- - - /x\\x00 404 0ms (answer cut off)"


def test_the_access_line_says_who_asked_and_what_the_answer_reported() -> None:
    """The usage fields of the JSON log, by the same names and rounded the same way,
    each only where known."""
    used = attrs.evolve(
        RECORD, key="alice", prompt_tokens=1200, cached_tokens=1024, generated_tokens=85,
        first_token=0.3124, tokens_per_second=41.26,
    )  # fmt: skip
    assert access_line(used) == (
        "lab gpu-a POST /v1/chat/completions 200 500ms key=alice prompt_tokens=1200"
        " cached_tokens=1024 completion_tokens=85 ttft_ms=312 tok_s=41.3"
    )
    some = attrs.evolve(RECORD, generated_tokens=7, client_left=True)
    assert access_line(some) == (
        "lab gpu-a POST /v1/chat/completions 200 500ms completion_tokens=7 (client left)"
    )
    json_fields = _request(used, {"access_model": "m"})
    for field in ("prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "tok_s"):
        assert f" {field}={getattr(json_fields, field)}" in access_line(used)
