"""Routing by fit, as the exchange uses it: a request's prompt guessed, the hosts too small
for it, what an answer or a host's refusal teaches, and the answer when no host fits.

Each call reads what the exchange has already (the body it forwards, the API of its path,
its conversation, the answer's usage): nothing is decoded again. The rules are pure
(:mod:`crossbar.routing.promptsize`, :mod:`crossbar.routing.fit`,
:mod:`crossbar.proxy.overflow`); this module ties them to the proxy's context.
"""

from __future__ import annotations

from collections.abc import Sequence

from crossbar.config import RouteConfig
from crossbar.http import too_long_payload
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.proxy.outcome import Outcome
from crossbar.proxy.overflow import Overflow, may_be_refusal, read_overflow
from crossbar.routing import Estimate, fits_nowhere, largest_window, too_small
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


class Fit:
    """Routing by fit for one exchange: its prompt guessed once (:meth:`small` then names
    the hosts to pass over), a host's refusal judged (:meth:`refused`), and the answer's
    usage learned at its end (:meth:`learn`). What its size changed is written, in words,
    to the outcome's ``size_note`` for the access line and the JSON log."""

    __slots__ = ("_demand", "_estimate", "_outcome", "_proxy")

    def __init__(self, proxy: ProxyContext, demand: Asked, outcome: Outcome) -> None:
        self._proxy, self._demand, self._outcome = proxy, demand, outcome
        self._estimate = prompt_estimate(proxy, demand)

    def small(self, route: RouteConfig, tried: Sequence[str]) -> list[str]:
        """The hosts of ``route`` (not ``tried``) too small for the request, by its estimate."""
        estimate = self._estimate
        if estimate is None:
            return []
        small = hosts_too_small(self._proxy, route, self._demand, estimate, tried)
        if small:
            self._outcome.size_note = f"~{estimate.tokens} tokens: too long for {', '.join(small)}"
        return small

    def holds(self, status: int, length: int | None) -> bool:
        """Whether an answer's head may be a refusal of this request's prompt, its body to
        be read whole before any of it is relayed."""
        return self._estimate is not None and may_be_refusal(status, length)

    def refused(
        self, host: str, status: int, body: bytes, tried: Sequence[str]
    ) -> tuple[int, dict[str, object]] | str | None:
        """What to do with ``body``, a ``400`` that ``host`` answered: ``None``, relay it (it
        is no refusal of a prompt too long); a reason, try another host, which may hold the
        prompt; else the ``400`` and its body in the API's words, for no host fits. A
        refusal teaches the host's window and the prompt's exact tokens."""
        refusal = read_overflow(status, body)
        route, proxy, demand = self._outcome.route, self._proxy, self._demand
        if refusal is None or route is None:
            return None
        learn_refusal(proxy, demand, host, refusal)
        said = f"{refusal.prompt_tokens} tokens > {host}'s window {refusal.window}"
        if fits_elsewhere(proxy, route, demand, refusal, tried):
            self._outcome.size_note = f"moved: {said}"
            return said
        status, payload = too_long_answer(proxy, route, demand, self._outcome.path, refusal)
        self._outcome.size_note = f"too long for every host: {said}"
        return status, payload

    def learn(self, prompt_tokens: int | None) -> None:
        """The answer's own count of its prompt tokens, learned for the next estimates."""
        if self._estimate is not None:
            learn_usage(self._proxy, self._demand, prompt_tokens)
