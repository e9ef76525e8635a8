"""crossbar.usage.ledger in a running crossbar: a reload keeps the ledger, and a restart loses
no request.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest_twisted

from crossbar.config import Config
from crossbar.testing.rig import rigs
from crossbar.testing.simulator import SimulatedHost
from crossbar.usage.store import UsageStore
from tests.support.usagerows import kept

# -- within crossbar ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_reload_keeps_the_ledger_and_a_restart_loses_no_request(tmp_path: Path) -> None:
    """A reload changes only the retention; a stop writes what was not yet written, so
    a crossbar started again on the file has every request."""
    path = str(tmp_path / "u.sqlite3")

    def kept_in(config: Config) -> Config:
        return attrs.evolve(config, usage_db=path)

    chat = {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}]}
    async with rigs() as make:
        rig = await make({"gpu-a": SimulatedHost({"tiny-a": "loaded"})}, adjust=kept_in)
        ledger = rig.crossbar.usage
        assert ledger is not None
        for _ in range(2):
            assert (await rig.post("/lab/v1/chat/completions", chat))[0].code == 200
        result = rig.reload(attrs.evolve(rig.crossbar.config, usage_retention=7 * 86400.0))
        assert result.ok, result.message
        assert rig.crossbar.usage is ledger and ledger.retention == 7 * 86400
        assert (await rig.post("/lab/v1/chat/completions", chat))[0].code == 200
    again = UsageStore(path)
    again.open()
    [row] = kept(again, ("route",))
    assert (row["route"], row["requests"]) == ("lab", 3)
    assert row["prompt_tokens"] > 0
