"""What is done with a host's answer once its head is to be relayed: the status and
headers passed on to the client, the body relayed as it comes
(:class:`~crossbar.proxy.relay.StreamBody`, with a reader of what the answer says of its
work where its API says it), and the body's events (its end, a host gone quiet, a client
that reads nothing, a break). :class:`AnswerRelay` is the part of an
:class:`~crossbar.proxy.exchange.Exchange` that does it; the exchange moves by the same
events (:mod:`crossbar.proxy.phases`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from crossbar.http import Deadline, answer_headers, release_body, stopping
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.proxy.outcome import Outcome, answer_reader
from crossbar.proxy.permits import load_watched
from crossbar.proxy.phases import ENDED, Event, Phase
from crossbar.proxy.relay import LoadCheck, StreamBody
from crossbar.upstream import Discard, Response, describe

log = Logger()


class AnswerRelay:
    """An exchange's answer relayed from its host to its client, and the body's events."""

    proxy: ProxyContext
    request: server.Request
    outcome: Outcome
    demand: Asked
    phase: Phase
    _forward_body: bytes | None
    _deadline: Deadline | None
    _body: StreamBody | None
    _on: Callable[[Event], bool]
    _stop_deadline: Callable[[], None]
    fail: Callable[..., None]
    _error: Callable[[int, str, dict[str, str]], None]
    _load_failed: Callable[[], None]

    def _relay(self, response: Response, deliver: Any) -> None:
        """The head goes to the client, and the body after it as it comes."""
        self._stop_deadline()
        proxy, outcome, request = self.proxy, self.outcome, self.request
        host = outcome.host
        assert host is not None
        watched = load_watched(proxy, host, self.demand, response.code)  # a load's 500?
        if not watched:  # the host has it, and no other host will be tried
            self._forward_body = None
            release_body(request)
        if not self._on(Event.HEAD_RECEIVED):
            deliver(Discard())
            return
        idle = proxy.settings[host].idle_timeout
        request.setResponseCode(response.code, response.phrase)
        answer_headers(request.responseHeaders, response.headers, response.length, host)
        streamed = any(n.lower() == b"content-type" and v.startswith(b"text/event-stream")
                       for n, v in response.headers)  # fmt: skip
        outcome.reader = answer_reader(proxy, host, self.demand, streamed)  # of its work
        body = StreamBody(
            request, proxy.clock, idle, self.upstream_idle, self.upstream_ended,
            self.client_stalled, self._deadline, outcome.reader,
        )  # fmt: skip
        self._body = body
        deliver(LoadCheck(body, request, self._load_failed) if watched else body)
        # deliverBody may have finished the exchange (a body that came whole): then no
        # producer (registering it would raise) and no idle timer.
        if self.phase is Phase.STREAMING:
            body.arm()
            request.registerProducer(body, True)

    # -- streaming -------------------------------------------------------------------------

    def upstream_idle(self) -> None:
        """No body chunk came for ``idle_timeout``: give up on this host."""
        host = self.outcome.host
        assert host is not None and self._body is not None
        timeout = self.proxy.settings[host].idle_timeout
        self.proxy.table.request_failed(host, f"answer idle for {timeout:g}s")
        log.warn("host {host} went quiet for {t:g}s mid-answer", host=host, t=timeout)
        if self.request.startedWriting:
            self._cut_off()
            return
        if not self._on(Event.TIMED_OUT):  # before the body's end, which then changes nothing
            return
        self._body.stopProducing()
        self.request.unregisterProducer()
        self._error(504, "upstream timeout", {"host": host})

    def client_stalled(self) -> None:
        """The client read nothing of its answer for ``idle_timeout``: it holds a host's
        connection (and maybe a GPU slot) for nothing. Both sides end, as if it left."""
        host = self.outcome.host
        assert host is not None
        said = "a client read nothing for {t:g}s of its answer from {host}: both ended"
        log.warn(said, t=self.proxy.settings[host].idle_timeout, host=host)
        if not self._on(Event.CLIENT_LEFT):
            return
        if self._body is not None:
            self._body.stopProducing()
        self._abort_client()

    def upstream_ended(self, reason: Failure) -> None:
        """The upstream body ended: cleanly, broken, or because we stopped it."""
        if self.phase is not Phase.STREAMING:
            return
        request = self.request
        request.unregisterProducer()
        if reason.check(ResponseDone, PotentialDataLoss):
            self._on(Event.BODY_ENDED)
            request.finish()
            return
        host = self.outcome.host
        assert host is not None
        if stopping(request):  # crossbar itself cut it, past drain_timeout
            self._cut_off()
            return
        why = describe(reason)
        self.proxy.table.request_failed(host, f"answer broken: {why}")
        log.warn("host {host} broke an answer off: {why}", host=host, why=why)
        # An SSE client must see an error, not a stream that merely looks complete.
        self._cut_off()

    def _cut_off(self) -> None:
        """End an answer that has begun: the client's connection is aborted, so that it
        cannot take what it got for a whole answer."""
        if not self._on(Event.BODY_BROKEN):
            return
        if self._body is not None:
            self._body.stopProducing()
        self._abort_client()

    def crashed(self, reason: Failure) -> None:
        log.failure("crossbar: unexpected error while proxying", reason)
        if self.phase not in ENDED:
            if self.request.startedWriting:
                self._cut_off()
            else:
                self.fail(500, "internal error")

    def _abort_client(self) -> None:
        transport: Any = self.request.transport
        transport.abortConnection()
