"""A route's aliases through the exchange: the host is asked for the real model, the record
names both, and a name no alias matches is answered as before."""

from __future__ import annotations

import json

from crossbar.stats.accessline import access_line
from crossbar.testing import MemoryProxy
from tests.support.exchange import ask, config

ALIASES = {"claude-haiku-*": "small", "claude-*": "m"}
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


def aliased() -> MemoryProxy:
    return MemoryProxy(
        config(routes={"lab": {"hosts": ["gpu-a", "gpu-b"], "aliases": ALIASES}}),
        models=("m", "small"),
    )


def sent(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_the_host_receives_the_model_an_alias_stands_for_and_the_record_names_both() -> None:
    proxy = aliased()
    ask(proxy, sent("claude-sonnet-4-5"))
    host = proxy.accept()
    body = json.loads(host.received.partition(b"\r\n\r\n")[2])
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert b"claude" not in host.received
    host.send(ANSWER)
    [record] = proxy.records
    assert (record.model, record.asked_model, record.status) == ("m", "claude-sonnet-4-5", 200)
    assert " model=claude-sonnet-4-5->m" in access_line(record)


def test_the_first_alias_that_matches_wins() -> None:
    proxy = aliased()
    ask(proxy, sent("claude-haiku-4-5"))
    host = proxy.accept()
    assert json.loads(host.received.partition(b"\r\n\r\n")[2])["model"] == "small"


def test_a_model_the_hosts_list_is_sent_as_it_came() -> None:
    proxy = MemoryProxy(
        config(routes={"lab": {"hosts": ["gpu-a"], "aliases": {"*": "m"}}}), models=("m", "x")
    )
    ask(proxy, sent("x"))
    host = proxy.accept()
    assert json.loads(host.received.partition(b"\r\n\r\n")[2])["model"] == "x"
    host.send(ANSWER)
    [record] = proxy.records
    assert (record.model, record.asked_model) == ("x", None)
    assert "model=" not in access_line(record)


def test_a_name_no_alias_matches_goes_on_as_before() -> None:
    proxy = aliased()
    ask(proxy, sent("gpt-5"))
    host = proxy.accept()
    assert json.loads(host.received.partition(b"\r\n\r\n")[2])["model"] == "gpt-5"
