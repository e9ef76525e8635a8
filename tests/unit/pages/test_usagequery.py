"""crossbar.pages.usagequery: ``GET /_crossbar/usage``, its parameters checked, its sums as
JSON and CSV, behind the status key; and crossbar with a store that is stuck, corrupt or
off goes on answering requests."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from crossbar.config import Config, RouteConfig, Secret
from crossbar.config.secrets import KeyHolder
from crossbar.pages.usagequery import (
    BadParameter,
    UsageQuery,
    as_csv,
    as_json,
    asked_as,
    parse_ask,
)
from crossbar.testing.rig import Rig, rigs
from crossbar.testing.simulator import SimulatedHost
from crossbar.testing.timeouts import guard

NOW = 1_764_590_400.0  # 2025-12-01T12:00:00Z
CHAT = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def ask(**args: str | list[str]) -> UsageQuery:
    given = {
        k.encode(): [v.encode() for v in ([a] if isinstance(a, str) else a)]
        for k, a in args.items()
    }
    return parse_ask(given, NOW)


def test_the_defaults_are_the_last_day_by_key_as_json() -> None:
    assert ask() == UsageQuery(NOW - 86400, NOW, ("key",), "json")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2025-12-01T09:00:00Z", NOW - 3 * 3600),
        ("2025-12-01T10:00:00+01:00", NOW - 3 * 3600),
        ("2025-12-01T09:00:00", NOW - 3 * 3600),  # no offset: UTC
        ("2025-12-01", NOW - 12 * 3600),
        ("1764579600", NOW - 3 * 3600),
        ("1764579600.5", NOW - 3 * 3600 + 0.5),
    ],
)
def test_since_is_rfc_3339_or_epoch_seconds(text: str, seconds: float) -> None:
    assert ask(since=text).since == seconds


@pytest.mark.parametrize(
    ("args", "parameter", "problem"),
    [
        ({"since": "yesterday"}, "since", "'yesterday' is neither RFC 3339"),
        ({"until": "nan"}, "until", "must be from 1970 to 9999"),
        ({"until": "1e400"}, "until", "must be from 1970 to 9999"),
        ({"since": "-5"}, "since", "must be from 1970 to 9999"),
        ({"since": "2025-12-02"}, "since", "must be before until"),
        ({"since": ["1", "2"]}, "since", "given more than once"),
        ({"by": "team"}, "by", "'team' is not one of route, host, model, key, asked_model"),
        ({"by": "key,key"}, "by", "names a group twice"),
        ({"format": "xml"}, "format", "must be json or csv, not 'xml'"),
        ({"sort": "x"}, "sort", "unknown parameter (expected one of: since, until, by"),
        ({"by": "x" * 10_000}, "by", "'xxxxx"),
    ],
)
def test_a_bad_parameter_is_named_with_its_problem(
    args: dict[str, Any], parameter: str, problem: str
) -> None:
    with pytest.raises(BadParameter) as bad:
        ask(**args)
    assert bad.value.parameter == parameter
    assert bad.value.problem.startswith(problem)
    assert len(bad.value.problem) < 200


ROWS = [
    {"key": "alice", "requests": 2, "errors": 1, "prompt_tokens": 100, "cached_tokens": 75,
     "completion_tokens": 9, "first_token_n": 2, "first_token_seconds": 0.5, "speed_n": 1,
     "speed_sum": 40.25, "loads": 1},
    {"key": "=cmd()", "requests": 1, "errors": 0, "prompt_tokens": 0, "cached_tokens": 0,
     "completion_tokens": 0, "first_token_n": 0, "first_token_seconds": 0.0, "speed_n": 0,
     "speed_sum": 0.0, "loads": 0},
]  # fmt: skip


def test_the_sums_as_json_with_means_rates_and_a_total() -> None:
    doc = as_json(ask(), ROWS, 3600.0)
    assert doc["since"] == "2025-11-30T12:00:00.000Z"
    assert doc["groups"][0] == {
        "key": "alice", "requests": 2, "errors": 1, "prompt_tokens": 100, "cached_tokens": 75,
        "completion_tokens": 9, "cache_hit_rate": 0.75, "ttft_ms_mean": 250, "tok_s_mean": 40.2,
        "loads": 1,
    }  # fmt: skip
    assert doc["groups"][1]["cache_hit_rate"] is None  # nothing to rate
    assert doc["total"]["requests"] == 3
    assert doc["total"]["ttft_ms_mean"] == 250
    assert doc["total"]["loads"] == 1


def test_the_sums_as_csv_a_formula_quoted() -> None:
    assert as_csv(ask(), ROWS).splitlines() == [
        "key,requests,errors,prompt_tokens,cached_tokens,completion_tokens,cache_hit_rate,"
        "ttft_ms_mean,tok_s_mean,loads",
        '"alice",2,1,100,75,9,0.75,250,40.2,1',
        '"\'=cmd()",1,0,0,0,0,,,,0',
    ]


SENT = [
    dict(ROWS[0], model="qwen3", asked_model=""),
    dict(ROWS[0], model="qwen3", asked_model="claude-haiku-4-5", requests=3),
    dict(ROWS[0], model="qwen3", asked_model="claude-sonnet-4-5", requests=12),
    dict(ROWS[1], model="tiny", asked_model=""),
]
"""The store's rows grouped by model and the name sent (``''``: the model's own)."""


def test_grouped_by_model_each_says_the_names_sent_for_it_and_its_sums_stay_whole() -> None:
    """The served model's figures are every request's, whatever name it was sent by; the
    names an alias mapped are listed with their requests."""
    folded = asked_as(SENT, ("model",))
    doc = as_json(ask(by="model"), folded, 3600.0)
    qwen3, tiny = doc["groups"]
    assert qwen3["model"] == "qwen3"
    assert qwen3["asked_as"] == {"claude-haiku-4-5": 3, "claude-sonnet-4-5": 12}
    assert (qwen3["requests"], qwen3["prompt_tokens"], qwen3["loads"]) == (17, 300, 3)
    assert (tiny["model"], tiny["asked_as"], tiny["requests"]) == ("tiny", {}, 1)
    assert doc["total"]["requests"] == 18
    lines = as_csv(ask(by="model", format="csv"), folded).splitlines()
    assert lines[0].endswith(",loads,asked_as")
    assert (
        lines[1]
        == '"qwen3",17,3,300,225,27,0.75,250,40.2,3,"claude-haiku-4-5: 3; claude-sonnet-4-5: 12"'
    )
    assert lines[2] == '"tiny",1,0,0,0,0,,,,0,""'


def test_grouped_by_the_name_sent_a_model_sent_as_itself_has_none() -> None:
    doc = as_json(ask(by="model,asked_model"), SENT, 3600.0)
    assert [(g["model"], g["asked_model"], g["requests"]) for g in doc["groups"]] == [
        ("qwen3", None, 2), ("qwen3", "claude-haiku-4-5", 3), ("qwen3", "claude-sonnet-4-5", 12),
        ("tiny", None, 1),
    ]  # fmt: skip
    assert "asked_as" not in doc["groups"][0]
    lines = as_csv(ask(by="model,asked_model", format="csv"), SENT).splitlines()
    assert lines[0].startswith("model,asked_model,requests,") and lines[0].endswith(",loads")
    assert lines[1].startswith('"qwen3","",2,') and lines[2].startswith(
        '"qwen3","claude-haiku-4-5",3,'
    )


@pytest.mark.parametrize(
    "name",
    [
        " =cmd()",  # a space first: a spreadsheet skips it
        "\u3000=cmd()",  # an ideographic space
        "\uff1dcmd()",  # a full-width equals sign
        "\ufe66cmd()",  # a small one
        "\uff0b1",
        "\uff0d1",
        "\u22121",  # the minus sign
        "\uff20SUM(A1)",
        "\t=1",
        "\r=1",
        "-",
        "+",
        '=HYPERLINK("http://x")',
    ],
)
def test_a_csv_name_a_spreadsheet_could_run_is_quoted_and_neutralised(name: str) -> None:
    row = dict(ROWS[0], key=name)
    line = as_csv(ask(format="csv"), [row]).split("\r\n")[1]
    assert line.startswith("\"'")  # quoted, the name behind a '
    [cells] = list(csv.reader(io.StringIO(line)))
    assert cells[0] == "'" + name  # read back whole, spaces and quotes kept


@pytest.mark.parametrize("name", ["alice", "gpt 4", "(other)", "a=b", "Qwen/Qwen3-8B"])
def test_a_csv_name_that_runs_nothing_is_kept_as_it_is(name: str) -> None:
    line = as_csv(ask(format="csv"), [dict(ROWS[0], key=name)]).split("\r\n")[1]
    [cells] = list(csv.reader(io.StringIO(line)))
    assert cells[0] == name


# -- through crossbar ---------------------------------------------------------------------

ALICE = attrs.evolve(Secret(b"alice-key"), holder=KeyHolder("alice"))
STATUS = Secret(b"status-key")


def keyed(path: Path) -> Any:
    def adjust(config: Config) -> Config:
        route = RouteConfig("lab", ("gpu-a",), "tiny-a", api_keys=(ALICE,))
        return attrs.evolve(
            config, routes={"lab": route}, status_keys=(STATUS,), usage_db=str(path)
        )

    return adjust


async def chat(rig: Rig, model: str = "tiny-a") -> int:
    headers = {"Authorization": ["Bearer alice-key"]}
    body = {**CHAT, "model": model}
    response = await guard(rig.client.post(rig.base + "/lab/v1/chat/completions",
                                           json=body, headers=headers), 10)  # fmt: skip
    await response.content()
    return int(response.code)


async def usage(rig: Rig, query: str, key: str | None = "status-key") -> tuple[int, bytes]:
    headers = {} if key is None else {"Authorization": [f"Bearer {key}"]}
    response = await guard(
        rig.client.get(rig.base + "/_crossbar/usage" + query, headers=headers), 10
    )
    return int(response.code), await response.content()


@pytest_twisted.ensureDeferred
async def test_usage_is_answered_behind_the_status_key_as_json_and_csv(tmp_path: Path) -> None:
    async with rigs() as make:
        rig = await make(
            {"gpu-a": SimulatedHost({"tiny-a": "loaded"})}, adjust=keyed(tmp_path / "u")
        )
        assert rig.crossbar.usage is not None
        for _ in range(3):
            assert await chat(rig) == 200
        await rig.crossbar.usage.flush()
        code, body = await usage(rig, "", key=None)
        assert code == 401
        code, body = await usage(rig, "?by=route,key")
        assert code == 200
        doc = json.loads(body)
        [group] = doc["groups"]
        assert (group["route"], group["key"], group["requests"]) == ("lab", "alice", 3)
        assert group["prompt_tokens"] > 0 and group["completion_tokens"] > 0
        assert group["loads"] == 0  # tiny-a was loaded: no request made a load
        code, body = await usage(rig, "?format=csv&by=model")
        assert code == 200
        assert body.decode().splitlines()[1].startswith('"tiny-a",3,0,')
        code, body = await usage(rig, "?since=tomorrow")
        assert (code, json.loads(body)) == (400, {
            "error": "bad parameter", "parameter": "since",
            "problem": "'tomorrow' is neither RFC 3339 (2026-12-01T09:00:00Z) nor epoch seconds",
        })  # fmt: skip


@pytest_twisted.ensureDeferred
async def test_usage_names_the_model_served_and_the_name_an_alias_mapped(tmp_path: Path) -> None:
    """Claude Code's names mapped by the route's alias: counted under the model served,
    each name sent said beside it."""

    def aliased(config: Config) -> Config:
        config = keyed(tmp_path / "u")(config)
        route = attrs.evolve(config.routes["lab"], aliases=(("claude-*", "tiny-a"),))
        return attrs.evolve(config, routes={"lab": route})

    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost({"tiny-a": "loaded"})}, adjust=aliased)
        assert rig.crossbar.usage is not None
        for model in ("claude-sonnet-4-5", "claude-sonnet-4-5", "claude-haiku-4-5", "tiny-a"):
            assert await chat(rig, model) == 200
        await rig.crossbar.usage.flush()
        code, body = await usage(rig, "?by=model")
        [group] = json.loads(body)["groups"]
        assert (group["model"], group["requests"]) == ("tiny-a", 4)
        assert group["asked_as"] == {"claude-haiku-4-5": 1, "claude-sonnet-4-5": 2}
        code, body = await usage(rig, "?by=key,asked_model&format=csv")
        assert code == 200
        assert [line.split(",")[:3] for line in body.decode().splitlines()[1:]] == [
            ['"alice"', '""', "1"],
            ['"alice"', '"claude-haiku-4-5"', "1"],
            ['"alice"', '"claude-sonnet-4-5"', "2"],
        ]


@pytest_twisted.ensureDeferred
async def test_requests_are_answered_while_the_store_is_stuck(tmp_path: Path) -> None:
    """Another process holds the file's write lock: the batch waits on the store's
    thread, and crossbar goes on answering, the usage page too (its queries read on a
    connection and a thread of their own); once the lock goes, the batch is written."""
    path = tmp_path / "u.sqlite3"
    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost({"tiny-a": "loaded"})}, adjust=keyed(path))
        ledger = rig.crossbar.usage
        assert ledger is not None
        assert await chat(rig) == 200
        await ledger.flush()  # opened, and one batch written
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        assert await chat(rig) == 200
        writing = ledger.flush()
        for _ in range(5):  # answered while the write waits for the lock
            assert await chat(rig) == 200
        code, body = await usage(rig, "?by=key")  # not behind the write
        assert code == 200
        assert json.loads(body)["groups"][0]["requests"] == 1  # what was written before it
        assert not writing.called
        lock.execute("ROLLBACK")
        lock.close()
        await writing
        await ledger.flush()
        code, body = await usage(rig, "?by=key")
        assert json.loads(body)["groups"][0]["requests"] == 7


@pytest_twisted.ensureDeferred
async def test_crossbar_serves_without_a_corrupt_store_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "u.sqlite3"
    path.write_bytes(b"this is no database" * 500)
    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost({"tiny-a": "loaded"})}, adjust=keyed(path))
        assert await chat(rig) == 200
        code, body = await usage(rig, "")
        assert code == 503
        assert json.loads(body) == {
            "error": "usage is not kept",
            "reason": f"cannot use {path}: file is not a database",
        }
        assert len(rig.logs.matching("usage store off")) == 1
        assert path.read_bytes() == b"this is no database" * 500  # left as it was


@pytest_twisted.ensureDeferred
async def test_with_usage_db_off_the_page_says_so() -> None:
    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost({"tiny-a": "loaded"})})
        assert rig.crossbar.usage is None
        code, body = await usage(rig, "", key=None)
        assert (code, json.loads(body)["reason"]) == (503, "usage_db is off")


def test_a_store_that_does_not_answer_is_a_503_in_time() -> None:
    """A disk that hangs: the query waits on the store's thread, the page does not."""
    from twisted.internet.task import Clock
    from twisted.web.test.requesthelper import DummyRequest

    from crossbar.pages.usagequery import QUERY_SECONDS, answer

    class Hung:
        off = None
        retention = 86400.0

        def query(self, *args: object) -> Deferred[Any]:
            return Deferred()

    clock, request = Clock(), DummyRequest([b"usage"])
    clock.advance(NOW)
    answered = Deferred.fromCoroutine(answer(request, Hung(), clock))  # type: ignore[arg-type]
    assert not answered.called
    clock.advance(QUERY_SECONDS)
    assert request.responseCode == 503
    assert json.loads(answered.result) == {
        "error": "usage store busy",
        "reason": "the usage store has not answered in 10 s; the query was stopped",
    }


@pytest_twisted.ensureDeferred
async def test_requests_not_served_never_count_as_the_key_s_and_are_listed_by_why(
    tmp_path: Path,
) -> None:
    """A wrong path, a model no host has, a GET of /v1/models: the key's served count
    stays 0; the first two are listed apart as refused, by why."""
    async with rigs() as make:
        rig = await make(
            {"gpu-a": SimulatedHost({"tiny-a": "loaded"})}, adjust=keyed(tmp_path / "u")
        )
        assert rig.crossbar.usage is not None
        headers = {"Authorization": ["Bearer alice-key"]}
        for path, body in (("/lab/chat/completions", CHAT), ("/lab/v1/chat/completions",
                           {**CHAT, "model": "no-such-model"})):  # fmt: skip
            answer = await guard(rig.client.post(rig.base + path, json=body, headers=headers), 10)
            await answer.content()
            assert 400 <= answer.code < 500, path
        listing = await guard(rig.client.get(rig.base + "/lab/v1/models", headers=headers), 10)
        await listing.content()
        assert listing.code == 200
        await rig.crossbar.usage.flush()
        code, body = await usage(rig, "?by=key")
        doc = json.loads(body)
        assert code == 200 and doc["groups"] == [] and doc["total"]["requests"] == 0
        whys = {row["why"]: row["requests"] for row in doc["refused"]}
        assert whys.pop("path") == 1
        assert [(why[:5], n) for why, n in whys.items()] == [("host ", 1)]
        assert {row["key"] for row in doc["refused"]} == {"alice"}
