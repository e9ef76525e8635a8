"""crossbar.testing.simulator.recorded: what a simulated host keeps of each request."""

from __future__ import annotations

import pytest

from crossbar.testing.simulator.recorded import RecordedRequest


def test_a_recorded_request_reads_its_json_body_and_cannot_be_changed() -> None:
    recorded = RecordedRequest("POST", "/v1/chat/completions", {}, b'{"model": "a"}')
    assert recorded.json() == {"model": "a"}
    with pytest.raises(AttributeError):
        recorded.path = "/other"  # type: ignore[misc]
