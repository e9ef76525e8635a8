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
from crossbar.proxy.overflow import may_be_refusal, read_overflow
from crossbar.routing import Estimate, fits_nowhere, largest_window, too_small
from crossbar.usage import APIS


class Fit:
    """Routing by fit for one exchange: its prompt guessed once (:meth:`small` then names
    the hosts to pass over), a host's refusal judged (:meth:`refused`), and the answer's
    usage learned at its end (:meth:`learn`). Only the APIs llama-server generates through
    (:data:`crossbar.usage.APIS`: chat, completions, messages, responses) are sized. What its
    size changed is written, in words, to the outcome's ``size_note`` for the access line
    and the JSON log."""

    __slots__ = ("_demand", "_outcome", "_proxy", "estimate")

    def __init__(self, proxy: ProxyContext, demand: Asked, outcome: Outcome) -> None:
        self._proxy, self._demand, self._outcome = proxy, demand, outcome
        self.estimate: Estimate | None = self._guess()
        """The prompt's tokens as guessed, or ``None``: the request has no prompt to size."""

    def _guess(self) -> Estimate | None:
        demand = self._demand
        if demand.api not in APIS or not demand.body:
            return None
        key = None if demand.conversation is None else demand.conversation.key
        return self._proxy.sizes.estimate(demand.model, demand.api, len(demand.body), key)

    def small(self, route: RouteConfig, tried: Sequence[str]) -> list[str]:
        """The hosts of ``route`` (not ``tried``) to pass over: their slot is too small for
        the estimated prompt and its answer's limit (:func:`crossbar.routing.too_small`)."""
        estimate, demand = self.estimate, self._demand
        if estimate is None:
            return []
        states = self._proxy.table.view
        small = too_small(
            route.hosts, demand.model, states, estimate.tokens, demand.reply_limit, tried
        )
        if small:
            self._outcome.size_note = f"~{estimate.tokens} tokens: too long for {', '.join(small)}"
        return small

    def holds(self, status: int, length: int | None) -> bool:
        """Whether an answer's head may be a refusal of this request's prompt, its body to
        be read whole before any of it is relayed."""
        return self.estimate is not None and may_be_refusal(status, length)

    def refused(
        self, host: str, status: int, body: bytes, tried: Sequence[str]
    ) -> tuple[int, dict[str, object]] | str | None:
        """What to do with ``body``, a ``400`` that ``host`` answered: ``None``, relay it (it
        is no refusal of a prompt too long); a reason, try another host not ``tried``, which
        may hold the prompt; else the ``400`` and its body in the API's words (its tokens as
        the host counted them, the largest window of the route's hosts), for no host fits.
        A refusal teaches the host's window and the prompt's exact tokens."""
        refusal = read_overflow(status, body)
        route, proxy, demand = self._outcome.route, self._proxy, self._demand
        if refusal is None or route is None:
            return None
        if demand.model is not None:
            proxy.table.record_window(host, demand.model, refusal.window)
        self.learn(refusal.prompt_tokens)
        said = f"{refusal.prompt_tokens} tokens > {host}'s window {refusal.window}"
        states = proxy.table.view
        if not fits_nowhere(route.hosts, demand.model, states, refusal.prompt_tokens, tried):
            self._outcome.size_note = f"moved: {said}"
            return said
        self._outcome.size_note = f"too long for every host: {said}"
        window = max(refusal.window, largest_window(route.hosts, demand.model, states) or 0)
        return 400, too_long_payload(self._outcome.path, refusal.prompt_tokens, window)

    def learn(self, prompt_tokens: int | None) -> None:
        """The answer's own count of its prompt tokens (its usage, cached ones included),
        learned for the next estimates."""
        demand = self._demand
        if self.estimate is None or prompt_tokens is None or not demand.body:
            return
        key = None if demand.conversation is None else demand.conversation.key
        self._proxy.sizes.learn(demand.model, demand.api, len(demand.body), prompt_tokens, key)
