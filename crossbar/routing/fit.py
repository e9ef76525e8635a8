"""Which hosts of a route have a slot long enough for a request: pure rules over the health
table, no I/O.

llama-server refuses a prompt of as many tokens as its slot's window or more
(``400 exceed_context_size_error``), and an answer stops where the window ends. So a request
goes where its prompt and its answer fit: a host whose window is known is *too small* for
a prompt of ``prompt`` tokens and an answer of ``reply`` tokens when ``prompt + reply`` is
not less than its window. The proxy adds the hosts too small to the ones a policy must pass over
(:attr:`~crossbar.routing.policies.Ask.exclude`), so each policy chooses among the rest as
it does today; under ``cache_affinity`` a conversation stays home while it fits there and
otherwise goes to its next host by weight that fits, where its later turns follow it.

The answer's size is the request's own limit (``max_tokens`` and the like), else
:data:`REPLY_MARGIN`. Agents ask for more than a small window holds (Claude Code's
``max_tokens`` is 32,000): when no host fits prompt and answer, the hosts where the prompt
alone fits are kept (the answer may end at the window, as it would on that host alone).
When the prompt fits nowhere by the estimate, only the hosts with the largest window are
kept: an estimate is no proof, and a host that can hold the prompt, if any, is one of them.
A host whose window is unknown may fit. Only a host's own refusal, with its count of the
prompt's tokens, makes crossbar answer that no host fits (:func:`fits_nowhere`).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

from crossbar.polling.health import HostState

REPLY_MARGIN = 1024
"""Tokens kept for the answer of a request that sets no limit of its own."""


def too_small(
    hosts: Sequence[str],
    model: str | None,
    states: Mapping[str, HostState],
    prompt: int,
    reply: int | None,
    exclude: Container[str] = (),
) -> list[str]:
    """The hosts of ``hosts`` (not in ``exclude``, healthy) to pass over for a prompt of
    ``prompt`` tokens and an answer of up to ``reply`` (``None``: :data:`REPLY_MARGIN`):
    those whose known window is too small for both, when another host fits both; else
    those too small for the prompt alone, when another fits it; else all but those with
    the largest window (and those whose window is unknown)."""
    windows = {
        name: states[name].window_bound(model)
        for name in hosts
        if name not in exclude and name in states and states[name].healthy
    }
    need = prompt + (REPLY_MARGIN if reply is None else reply)
    for wanted in (need, prompt):  # llama-server refuses a prompt as long as the window
        small = [
            name for name, window in windows.items() if window is not None and window <= wanted
        ]
        if len(small) < len(windows):
            return small
    largest = max((w for w in windows.values() if w is not None), default=0)
    return [name for name, window in windows.items() if window is not None and window < largest]


def largest_window(
    hosts: Sequence[str], model: str | None, states: Mapping[str, HostState]
) -> int | None:
    """The largest known window for ``model`` among ``hosts`` (healthy or not: a refusal
    names the most any host of the route holds), or ``None`` when none is known."""
    windows = [states[h].window_bound(model) for h in hosts if h in states]
    known = [w for w in windows if w is not None]
    return max(known) if known else None


def fits_nowhere(
    hosts: Sequence[str],
    model: str | None,
    states: Mapping[str, HostState],
    prompt: int,
    tried: Container[str],
) -> bool:
    """Whether a prompt of ``prompt`` tokens, as a host counted it when it refused it, fits
    on no healthy host of ``hosts`` not ``tried`` yet: each one's window is known and at
    most ``prompt`` (a host whose window is unknown may still take it)."""
    for name in hosts:
        state = states.get(name)
        if name in tried or state is None or not state.healthy:
            continue
        window = state.window_bound(model)
        if window is None or window > prompt:
            return False
    return True
