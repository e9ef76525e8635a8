"""crossbar.testing.logs: a test captures what crossbar logged, as the lines an admin reads."""

from __future__ import annotations

from twisted.logger import Logger

from crossbar.testing import LogCapture

log = Logger(namespace="crossbar.test")


def test_it_captures_the_events_logged_while_installed_as_text() -> None:
    log.info("before the capture")
    capture = LogCapture()
    try:
        log.info("host {host} is down: {why}", host="gpu-a", why="connection refused")
        log.warn("route {route} has no healthy host", route="lab")
    finally:
        capture.close()
    log.info("after the capture")

    assert capture.lines == [
        "host gpu-a is down: connection refused",
        "route lab has no healthy host",
    ]
    assert capture.events[0]["host"] == "gpu-a"


def test_matching_finds_lines_holding_every_part() -> None:
    capture = LogCapture()
    try:
        log.info("host gpu-a is down")
        log.info("host gpu-b is down")
        log.info("host gpu-a is up")
    finally:
        capture.close()

    assert capture.matching("gpu-a") == ["host gpu-a is down", "host gpu-a is up"]
    assert capture.matching("gpu-a", "down") == ["host gpu-a is down"]
    assert capture.matching("gpu-c") == []
