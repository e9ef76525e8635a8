"""A simulated fleet for trying crossbar without any GPU: ``twistd -n crossbar --demo``.

Three simulated llama-server routers listen on loopback ports chosen by the system,
with different models resident and different slot windows, so routing by model and by
fit can be seen with curl.
"""

from __future__ import annotations

from typing import Any

from crossbar.config import DEMO_SOURCE, MEMORY_DB, Config, HostConfig, HostSettings, RouteConfig
from crossbar.testing import SimulatedHost

FLEET = {
    "gpu-a": {"qwen3-coder-30b": "loaded", "gpt-oss-20b": "unloaded"},
    "gpu-b": {"gpt-oss-20b": "loaded", "qwen3-coder-30b": "unloaded"},
    "gpu-c": {"hermes-4-14b": "loaded", "gpt-oss-20b": "unloaded"},
}
WINDOWS = {"gpu-a": 65_536, "gpu-b": 131_072, "gpu-c": 98_304}
"""Each host's slot window (tokens): an agent's session outgrows gpu-a's and moves to gpu-b."""


DEMO_ALIASES = (("claude-*", "qwen3-coder-30b"), ("gpt-5*", "qwen3-coder-30b"))
"""The names Claude Code and Codex send by default, on the route agents use."""


def demo_config(reactor: Any, listen: str) -> tuple[Config, list[SimulatedHost]]:
    """Start the simulated hosts and return a config that routes to them."""
    sims: dict[str, SimulatedHost] = {}
    for name, models in FLEET.items():
        # Answers end by themselves (8-60 tokens): an agent's "max_tokens": 32000 takes seconds.
        sim = SimulatedHost(
            models, chunk_interval=0.05, load_time=2.0, reactor=reactor, ctx=WINDOWS[name]
        )
        sim.listen(0, "127.0.0.1")
        sims[name] = sim
    return fleet_config(listen, {name: sim.url for name, sim in sims.items()}), list(sims.values())


def fleet_config(listen: str, urls: dict[str, str]) -> Config:
    """The demo's config for hosts at ``urls`` (``--check --demo`` starts none)."""
    return Config(
        listen=listen,
        defaults=HostSettings(poll_interval=2.0),
        hosts={name: HostConfig(name, url) for name, url in urls.items()},
        routes={
            "opencode": RouteConfig(
                "opencode",
                ("gpu-a", "gpu-b"),
                "qwen3-coder-30b",
                list_models="merged",
                aliases=DEMO_ALIASES,
            ),
            "hermes": RouteConfig(
                "hermes", ("gpu-c", "gpu-b"), "hermes-4-14b", list_models="merged"
            ),
        },
        source=DEMO_SOURCE,
        usage_db=MEMORY_DB,  # drawn on the page, never written: the answers are made up
    )
