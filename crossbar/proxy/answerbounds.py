"""The reader of one answer's usage, bounded by what is plausible for its request on its
host: prompt tokens within the host's learned window for the model, generated tokens
within the request's own answer limit and a margin (:class:`crossbar.usage.counts.Bounds`).
A hostile or broken host's larger numbers are dropped, not charged to the key, and said in
one line naming the host and the model."""

from __future__ import annotations

from twisted.logger import Logger

from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.usage import APIS, AnswerReader, Bounds

log = Logger()


def answer_reader(
    proxy: ProxyContext, host: str, asked: Asked, streamed: bool
) -> AnswerReader | None:
    """A reader for the answer ``host`` sends to ``asked`` (``None``: its API says
    nothing of its work), bounded by the host's window and the request's answer limit."""
    if asked.api not in APIS:
        return None
    state = proxy.table.view.get(host)
    window = state.window(asked.model) if state is not None else None
    bounds = Bounds.of(window, asked.reply_limit)
    model = asked.model or "-"

    def said(words: str) -> None:
        log.warn("host {host}, model {model}: {words}", host=host, model=model, words=words)

    return AnswerReader(asked.api, streamed, proxy.clock.seconds, bounds, said)
