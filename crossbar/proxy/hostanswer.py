"""What is done with a host's answer once its head is to be relayed: the status and
headers passed on to the client, the body relayed as it comes
(:class:`~crossbar.proxy.relay.StreamBody`, with a reader of what the answer says of its
work where its API says it), and the body's events (its end, a host gone quiet, a client
that reads nothing, a break). :class:`AnswerRelay` is the part of an
:class:`~crossbar.proxy.exchange.Exchange` that does it; the exchange moves by the same
events (:mod:`crossbar.proxy.phases`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from crossbar.http import Deadline, answer_headers, answer_json, release_body, stopping
from crossbar.polling import with_windows
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked
from crossbar.proxy.outcome import Outcome, answer_reader
from crossbar.proxy.permits import load_watched
from crossbar.proxy.phases import ENDED, Event, Phase
from crossbar.proxy.refusalbody import RefusalBody
from crossbar.proxy.relay import FirstContent, StreamBody
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
    _held: RefusalBody | None
    _on: Callable[[Event], bool]
    _stop_deadline: Callable[[], None]
    fail: Callable[..., None]
    _error: Callable[[int, str, dict[str, str]], None]
    _load_failed: Callable[[], None]
    _try_next: Callable[[str], None]
    _head: Response | None = None
    _held_answer: tuple[Response, bytes, str] | None = None

    def _relay(self, response: Response, deliver: Any) -> None:
        """The host's head is in: its body goes to a :class:`FirstContent`, which tells of
        its first content (then the head goes to the client, and the body after it as it
        comes), of pings before it, and of a failure before it (then another host)."""
        self._stop_deadline()
        proxy, outcome, request = self.proxy, self.outcome, self.request
        host = outcome.host
        assert host is not None
        if not self._on(Event.HEAD_RECEIVED):
            deliver(Discard())
            return
        self._head = response
        idle = proxy.settings[host].idle_timeout
        streamed = any(n.lower() == b"content-type" and v.startswith(b"text/event-stream")
                       for n, v in response.headers)  # fmt: skip
        outcome.reader = answer_reader(proxy, host, self.demand, streamed)  # of its work
        body = StreamBody(
            request, proxy.clock, idle, self.upstream_idle, self.upstream_ended,
            self.client_stalled, self._deadline, outcome.reader,
        )  # fmt: skip
        self._body = body
        watched = load_watched(proxy, host, self.demand, response.code)  # a load's 500?
        failing = 400 if request.startedWriting else 500  # a ping's head went out already
        deliver(FirstContent(body, response.code, streamed, self, watched, failing))
        # deliverBody may have ended the exchange (a body that came whole) or failed over:
        # then no producer (registering it would raise) and no idle timer.
        if self._body is body and self.phase in (Phase.OPENING, Phase.STREAMING):
            body.arm()
            request.registerProducer(body, True)

    # -- before the first content (told by FirstContent) ----------------------------------

    def opened(self) -> bool:
        """The answer's first content: the head goes out (unless a ping's went first)."""
        if not self._on(Event.CONTENT):
            return False
        self._forward_body = None  # no other host will be tried
        release_body(self.request)
        if not self.request.startedWriting:
            try:
                self._send_head()
            except Exception:
                if self._body is not None:
                    self._body.stopProducing()
                self.request.unregisterProducer()
                self.crashed(Failure())
                return False
        return True

    def kept_alive(self, comment: bytes) -> None:
        """A ping before any content goes to the client, after the head if none went yet:
        its connection stays alive through a long prefill, and another host may still
        take over (its head then dropped)."""
        if self.phase is not Phase.OPENING:
            return
        if not self.request.startedWriting:
            self._send_head()
        self.request.write(comment)

    def failed(self, why: str, held: bytes | None, broke: bool) -> None:
        """The host failed before any content: another host is tried, as before a head."""
        host, request = self.outcome.host, self.request
        assert host is not None
        if self.phase is not Phase.OPENING:
            return
        request.unregisterProducer()
        self._body = self.outcome.reader = None
        if stopping(request):  # crossbar itself cut it, past drain_timeout
            self._on(Event.BODY_BROKEN)
            self._abort_client()
            return
        if broke:  # an error status is judged by its code, an error event not held against it
            self.proxy.table.request_failed(host, why)
        self._on(Event.HOST_FAILED)
        self._held_answer = None
        if held is not None and not request.startedWriting and self._head is not None:
            self._held_answer = (self._head, held, host)
        self._try_next(why)

    def load_failed(self) -> None:
        self._load_failed()

    def _send_head(self) -> None:
        """The head of the host's answer, to the client (written with its first bytes)."""
        response, request, host = self._head, self.request, self.outcome.host
        assert response is not None and host is not None
        request.setResponseCode(response.code, response.phrase)
        answer_headers(request.responseHeaders, response.headers, response.length, host)

    def _give_held(self) -> None:
        """No other host: the last host's error status (held whole) goes to the client."""
        assert self._held_answer is not None
        response, body, host = self._held_answer
        request = self.request
        if self._on(Event.ANSWERED_HERE):
            request.setResponseCode(response.code, response.phrase)
            answer_headers(request.responseHeaders, response.headers, len(body), host)
            request.write(body)
            request.finish()

    def _answer_error(
        self,
        status: int,
        payload: dict[str, object],
        host: str | None,
        headers: dict[bytes, bytes] | None = None,
    ) -> None:
        """crossbar's own error: its JSON, or, once a head went out with a ping before any
        content, an error event in the request's API's shape, then the stream's end."""
        request = self.request
        if not request.startedWriting:
            answer_json(request, status, payload, host, headers)
            return
        request.write(error_event(self.demand.api, payload))
        request.finish()

    def _lists_windows(self, response: Response) -> bool:
        """Whether ``response`` is a host's own model list (a forwarded ``GET /v1/models``)
        that crossbar can give the windows it knows of that host's models, read whole first."""
        host = self.outcome.host
        return (
            response.code == 200
            and self.outcome.path == b"/v1/models"
            and self.request.method == b"GET"
            and host is not None
            and bool(self.proxy.table.view[host].windows)
        )

    def _listed(self, response: Response, body: bytes, whole: bool) -> None:
        """A host's model list, read: answered with each model's window added
        (:func:`crossbar.polling.with_windows`), or relayed as it came."""
        held, self._held, host = self._held, None, self.outcome.host
        assert held is not None and host is not None
        if self.phase is not Phase.HOLDING:  # the client left, or no answer in time
            held.stop()
            return
        windows = self.proxy.table.view[host].windows
        listing = with_windows(body, windows) if whole else None
        if listing is None:
            self._relay(response, held.hand_over)
            return
        self._stop_deadline()
        self._on(Event.ANSWERED_HERE)
        answer_json(self.request, 200, listing, host)

    # -- streaming -------------------------------------------------------------------------

    def upstream_idle(self) -> None:
        """No body chunk came for ``idle_timeout``: give up on this host."""
        host = self.outcome.host
        assert host is not None and self._body is not None
        timeout = self.proxy.settings[host].idle_timeout
        self.proxy.table.request_failed(host, f"answer idle for {timeout:g}s")
        log.warn("host {host} went quiet for {t:g}s mid-answer", host=host, t=timeout)
        if self.phase is Phase.STREAMING:
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


def error_event(api: str, payload: dict[str, object]) -> bytes:
    """crossbar's error ``payload`` (:func:`crossbar.http.error_payload`) as the SSE event
    a client of ``api`` reads as a failed stream: Anthropic's ``event: error`` with its
    error object, Responses' ``event: error`` (``type``, ``code``, ``message``), else
    OpenAI's ``data: {"error": {...}}``."""
    if api == "anthropic":
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    if api == "responses":
        error: Any = payload.get("error", {})
        said = {"type": "error", "code": error.get("type"), "message": error.get("message")}
        return b"event: error\ndata: " + json.dumps(said).encode() + b"\n\n"
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
