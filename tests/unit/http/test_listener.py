"""crossbar.http.listener without binding: a listener that never listened stops fine, only a
plain TCP description can be shared, and what the log leaves out of an internal port.
"""

from __future__ import annotations

import pytest
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IReactorTCP
from twisted.logger import FilteringLogObserver, PredicateResult

from crossbar.http.listener import (
    INTERNAL_LISTENER,
    Listener,
    ReusePortEndpoint,
    not_an_internal_start,
)
from tests.support.greeter import Greeter

# -- Listener ---------------------------------------------------------------------------------


def test_stopping_a_listener_that_never_listened_is_fine(reactor: IReactorTCP) -> None:
    listener = Listener(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"), Greeter(b"hi"))
    assert listener.stopService() is None


# -- ReusePortEndpoint ------------------------------------------------------------------------


def test_only_a_plain_tcp_description_can_be_shared(reactor: IReactorTCP) -> None:
    with pytest.raises(ValueError, match="need a plain tcp: port"):
        ReusePortEndpoint(reactor, "unix:/tmp/crossbar.sock")


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        (f"{INTERNAL_LISTENER} starting on 41639", False),
        ("crossbar starting on 7777", True),
        ("lab gpu-a POST /v1/chat/completions 200 12ms", True),
    ],
)
# -- the log filter for internal ports ---------------------------------------------------------


def test_only_the_start_of_an_internal_port_is_left_out_of_the_log(
    message: str, kept: bool
) -> None:
    seen: list[str] = []
    observer = FilteringLogObserver(lambda e: seen.append(e["message"][0]), [not_an_internal_start])
    observer({"message": (message,), "log_time": 0.0})
    assert seen == ([message] if kept else [])
    assert not_an_internal_start({"log_format": "{request}", "request": message}) is (
        PredicateResult.maybe
    )
