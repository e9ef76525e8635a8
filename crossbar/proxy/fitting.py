"""Routing by fit, as the exchange uses it: a request's prompt guessed, the hosts too small
for it, what an answer or a host's refusal teaches, and the answer when no host fits.

Each call reads what the exchange has already (the body it forwards, the API of its path,
its conversation, the answer's usage): nothing is decoded again. The rules are pure
(:mod:`crossbar.proxy.promptsize`, :mod:`crossbar.routing.fit`,
:mod:`crossbar.proxy.overflow`); this module ties them to the proxy's context.
"""

from __future__ import annotations

from collections.abc import Sequence

from crossbar.config import RouteConfig
from crossbar.http import too_long_payload
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.proxy.overflow import Overflow
from crossbar.proxy.promptsize import Estimate
from crossbar.routing import fits_nowhere, largest_window, too_small
from crossbar.usage import APIS

SIZED = APIS
"""The APIs whose prompts are sized: those llama-server generates through (chat,
completions, Anthropic messages, Responses)."""


def prompt_estimate(proxy: ProxyContext, asked: Asked) -> Estimate | None:
    """The prompt tokens of ``asked`` as guessed, or ``None`` when it has no prompt to size."""
    body = asked.body
    if asked.api not in SIZED or not body:
        return None
    key = None if asked.conversation is None else asked.conversation.key
    return proxy.sizes.estimate(asked.model, asked.api, len(body), key)


def hosts_too_small(
    proxy: ProxyContext,
    route: RouteConfig,
    asked: Asked,
    estimate: Estimate | None,
    exclude: Sequence[str] = (),
) -> list[str]:
    """The route's hosts (not in ``exclude``) to pass over for ``asked``: their slot is too
    small for its estimated prompt and its answer's limit (:func:`crossbar.routing.too_small`)."""
    if estimate is None:
        return []
    states = proxy.table.view
    hosts = route.hosts
    return too_small(hosts, asked.model, states, estimate.tokens, asked.reply_limit, exclude)


def learn_usage(proxy: ProxyContext, asked: Asked, prompt_tokens: int | None) -> None:
    """An answer reported ``prompt_tokens`` prompt tokens (its usage, cached ones included)
    for the body of ``asked``: learned for the next estimates."""
    body = asked.body
    if prompt_tokens is None or not body or asked.api not in SIZED:
        return
    key = None if asked.conversation is None else asked.conversation.key
    proxy.sizes.learn(asked.model, asked.api, len(body), prompt_tokens, key)


def learn_refusal(proxy: ProxyContext, asked: Asked, host: str, refusal: Overflow) -> None:
    """``host`` refused ``asked`` as too long: its window, and the prompt's exact tokens."""
    if asked.model is not None:
        proxy.table.record_window(host, asked.model, refusal.window)
    learn_usage(proxy, asked, refusal.prompt_tokens)


def fits_elsewhere(
    proxy: ProxyContext, route: RouteConfig, asked: Asked, refusal: Overflow, tried: Sequence[str]
) -> bool:
    """Whether a healthy host of the route not ``tried`` yet may hold the refused prompt."""
    states = proxy.table.view
    return not fits_nowhere(route.hosts, asked.model, states, refusal.prompt_tokens, tried)


def too_long_answer(
    proxy: ProxyContext, route: RouteConfig, asked: Asked, path: bytes, refusal: Overflow
) -> tuple[int, dict[str, object]]:
    """The ``400`` and its body in the API's own words for a prompt that fits no host: its
    tokens as the host counted them, and the largest window of the route's hosts."""
    states = proxy.table.view
    window = max(refusal.window, largest_window(route.hosts, asked.model, states) or 0)
    return 400, too_long_payload(path, refusal.prompt_tokens, window)
