"""Each agent's settings for one route, with the window it may fill: pure, no I/O.

The window of a model is the smallest slot window the route's hosts told crossbar
(``hosts.<name>.windows`` in ``/_crossbar/status``): whichever host a request goes to, a
prompt within it fits, so the agent compacts in time instead of meeting a host's
``exceed_context_size_error``. What each agent reads:

- Claude Code: ``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` (the window it assumes for a model it does
  not know; it assumes 1M otherwise), ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` (the window it
  compacts by) and ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``;
- Codex: ``model_context_window`` and ``model_auto_compact_token_limit`` in ``config.toml``
  (it assumes 272k for a model it does not know);
- OpenCode: ``limit.context`` and ``limit.output`` of the model in ``opencode.json``.

An answer takes room in the window too: the output limit given is a quarter of the window,
at most :data:`MOST_OUTPUT`, and Codex compacts at :data:`COMPACT_SHARE` of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

Agent = Literal["claude", "codex", "opencode"]
MOST_OUTPUT = 32_000
"""Largest output limit given (Claude Code's own default)."""
COMPACT_SHARE = 0.8
"""Share of the window past which Codex is told to compact."""


class NoWindow(ValueError):
    """The status tells no window for what was asked; ``str()`` says what to do, in words."""


@attrs.frozen
class RouteWindows:
    """A route as the settings need it: its base URL and each model's smallest window."""

    route: str
    base_url: str
    """The route's OpenAI base, ``http://crossbar:7777/<route>/v1``."""
    model: str
    """The model the settings name: the one asked for, else the route's default."""
    windows: Mapping[str, int]
    """Model -> the smallest slot window of the route's hosts that told one."""

    @property
    def window(self) -> int:
        return self.windows[self.model]

    @property
    def output(self) -> int:
        return max(256, min(self.window // 4, MOST_OUTPUT))


def route_windows(status: Mapping[str, Any], route: str, model: str | None = None) -> RouteWindows:
    """What ``status`` (a ``/_crossbar/status`` JSON) tells of ``route``'s windows;
    :class:`NoWindow` when the route, its model or a window of it is unknown."""
    routes = status.get("routes") or {}
    if route not in routes:
        known = ", ".join(sorted(routes)) or "none"
        raise NoWindow(f"crossbar has no route {route!r} (its routes: {known})")
    doc = routes[route]
    model = model or doc.get("default_model")
    if not model:
        raise NoWindow(f"route {route!r} has no default model: name one with --model")
    hosts = status.get("hosts") or {}
    windows: dict[str, int] = {}
    for name in doc.get("hosts") or ():
        for each, window in ((hosts.get(name) or {}).get("windows") or {}).items():
            if isinstance(window, int) and window > 0:
                windows[each] = min(window, windows.get(each, window))
    if model not in windows:
        raise NoWindow(
            f"no host of route {route!r} has told its window for {model!r} yet: crossbar"
            " learns it from a host that has the model loaded (send it one request, or"
            " wait for the next poll)"
        )
    return RouteWindows(route, str(doc.get("base_url", "")), model, windows)


def claude(found: RouteWindows, key_env: str) -> str:
    base = found.base_url.removesuffix("/v1")
    model = found.model
    lines = [
        f"export ANTHROPIC_BASE_URL={base}",
        f'export ANTHROPIC_AUTH_TOKEN="${{{key_env}:-unused}}"',
        f"export ANTHROPIC_MODEL={model}",
        f"export ANTHROPIC_DEFAULT_OPUS_MODEL={model}",
        f"export ANTHROPIC_DEFAULT_SONNET_MODEL={model}",
        f"export ANTHROPIC_DEFAULT_HAIKU_MODEL={model}",
        f"export CLAUDE_CODE_SUBAGENT_MODEL={model}",
        f"export CLAUDE_CODE_MAX_CONTEXT_TOKENS={found.window}",
        f"export CLAUDE_CODE_AUTO_COMPACT_WINDOW={found.window}",
        f"export CLAUDE_CODE_MAX_OUTPUT_TOKENS={found.output}",
    ]
    return "\n".join(lines) + "\n"


def codex(found: RouteWindows, key_env: str) -> str:
    compact = int(found.window * COMPACT_SHARE)
    return (
        f'model = "{found.model}"\n'
        'model_provider = "crossbar"\n'
        f"model_context_window = {found.window}\n"
        f"model_auto_compact_token_limit = {compact}\n"
        "\n"
        "[model_providers.crossbar]\n"
        'name = "crossbar"\n'
        f'base_url = "{found.base_url}"\n'
        'wire_api = "responses"\n'
        f'env_key = "{key_env}"\n'
    )


def opencode(found: RouteWindows, key_env: str) -> str:
    models = {
        model: {"limit": {"context": window, "output": max(256, min(window // 4, MOST_OUTPUT))}}
        for model, window in sorted(found.windows.items())
    }
    doc = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            found.route: {
                "npm": "@ai-sdk/openai-compatible",
                "options": {"baseURL": found.base_url, "apiKey": f"{{env:{key_env}}}"},
                "models": models,
            }
        },
        "model": f"{found.route}/{found.model}",
    }
    return json.dumps(doc, indent=2) + "\n"


AGENTS: Mapping[Agent, Callable[[RouteWindows, str], str]] = {
    "claude": claude,
    "codex": codex,
    "opencode": opencode,
}
"""Each agent's settings, by the name ``--agent`` takes."""


def render(agent: Agent, found: RouteWindows, key_env: str = "CROSSBAR_KEY") -> str:
    """``agent``'s settings for ``found``; the key is read from the variable ``key_env``
    (never written out)."""
    return AGENTS[agent](found, key_env)
