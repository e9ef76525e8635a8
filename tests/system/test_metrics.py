"""Prometheus metrics moved by real proxied requests end to end, in flight while one runs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_twisted
import treq
from twisted.web.client import ResponseNeverReceived

from crossbar.config import HostSettings, RouteConfig
from crossbar.testing import Rig, SimulatedHost, all_polled, rigs
from tests.support.scrape import LAB_A_200, Samples, samples, value

HI = {"messages": [{"role": "user", "content": "hi"}]}


# -- end to end ---------------------------------------------------------------------------------


@pytest_twisted.async_yield_fixture
async def rig() -> AsyncIterator[Rig]:
    """gpu-a is up with m1 loaded; gpu-b answers every request with HTTP 500."""
    sims = {"gpu-a": SimulatedHost({"m1": "loaded"}), "gpu-b": SimulatedHost({"m1": "loaded"})}
    sims["gpu-b"].fault = "error"
    routes = {
        "lab": RouteConfig("lab", ("gpu-a", "gpu-b"), "m1"),
        "spare": RouteConfig("spare", ("gpu-b",), None),
    }
    async with rigs() as make:
        rig = await make(sims, routes, defaults=HostSettings(poll_interval=60.0), up=())
        await all_polled(rig.crossbar.table)
        yield rig


async def scrape(rig: Rig) -> Samples:
    response, body = await rig.get("/_crossbar/metrics")
    assert response.code == 200
    return samples(body)


@pytest_twisted.ensureDeferred
async def test_counters_move_after_proxied_requests(rig: Rig) -> None:
    before = await scrape(rig)
    assert value(before, "crossbar_requests_total", **LAB_A_200) is None
    assert value(before, "crossbar_host_up", host="gpu-a") == 1
    assert value(before, "crossbar_host_up", host="gpu-b") == 0
    assert value(before, "crossbar_polls_total", host="gpu-b") == 1
    assert value(before, "crossbar_poll_failures_total", host="gpu-b") == 1

    sent = 0
    for _ in range(2):
        response = await rig.client.post(
            rig.base + "/lab/v1/chat/completions",
            json=HI,
        )
        body = await treq.content(response)
        assert response.code == 200, body
        assert json.loads(body)["object"] == "chat.completion"
        sent += len(body)
    response = await rig.client.get(rig.base + "/spare/v1/models")
    assert response.code == 503
    await treq.content(response)
    response = await rig.client.get(rig.base + "/nowhere/v1/models")
    assert response.code == 404
    await treq.content(response)

    after = await scrape(rig)
    assert value(after, "crossbar_requests_total", **LAB_A_200) == 2
    assert value(after, "crossbar_requests_total", route="spare", host="-", code="503") == 1
    assert value(after, "crossbar_requests_total", route="-", host="-", code="404") == 1
    lab_a = {"route": "lab", "host": "gpu-a"}
    assert value(after, "crossbar_request_duration_seconds_count", **lab_a) == 2
    assert value(after, "crossbar_time_to_first_byte_seconds_count", **lab_a) == 2
    assert value(after, "crossbar_response_bytes_total", **lab_a) == sent
    assert value(after, "crossbar_in_flight_requests", host="gpu-a") == 0


@pytest_twisted.ensureDeferred
async def test_in_flight_is_seen_while_a_request_runs(rig: Rig) -> None:
    sim = rig.sims["gpu-a"]
    sim.fault = "hang"  # holds every request until the client leaves
    arrived = sim.wait_request()
    pending = rig.client.post(rig.base + "/lab/v1/chat/completions", json=HI)
    await arrived
    assert value(await scrape(rig), "crossbar_in_flight_requests", host="gpu-a") == 1

    upstream_closed = sim.wait_connection_closed()
    pending.cancel()  # the client hangs up
    with pytest.raises(ResponseNeverReceived):
        await pending
    await upstream_closed
    after = await scrape(rig)
    assert value(after, "crossbar_in_flight_requests", host="gpu-a") == 0
    assert value(after, "crossbar_requests_total", route="lab", host="gpu-a", code="499") == 1
    assert value(after, "crossbar_time_to_first_byte_seconds_count", route="lab", host="gpu-a") == 0
