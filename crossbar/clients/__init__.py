"""Settings for the coding agents, ready to paste: ``python -m crossbar.clients``.

For a route of a running crossbar, the window of each model (the smallest slot window the
route's hosts told crossbar, read from ``/_crossbar/status``) in each agent's own terms:
Claude Code's environment, Codex's ``config.toml``, OpenCode's ``opencode.json``.
"""

from crossbar.clients.settings import AGENTS, Agent, RouteWindows, render, route_windows

__all__ = ["AGENTS", "Agent", "RouteWindows", "render", "route_windows"]
