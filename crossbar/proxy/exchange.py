"""One proxied request: choose a host, forward the request, stream the answer back.

An :class:`Exchange` lives per request. It forwards with crossbar's own lean HTTP/1.1 client
(:mod:`crossbar.upstream`: treq's cookie jar and redirects are wrong for a proxy, Agent's
layers cost a third of the CPU), streams the body as it comes, lets the client's socket
pause the host's (backpressure), and closes the host's connection as soon as the client
leaves, so the GPU stops generating; when every slot is busy it waits for one, in crossbar.

It moves through named phases (:mod:`crossbar.proxy.phases`), only through
:meth:`Exchange._enter`. Every event that comes late (an answer after the client left, the
body's end after a timeout cut it) finds the exchange ended and does nothing.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import error
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseDone, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss

from crossbar.config import RouteConfig
from crossbar.http import (
    BadTarget,
    Deadline,
    answer_headers,
    answer_json,
    borrow,
    error_payload,
    give_back,
    release_body,
    stopping,
    when_over,
)
from crossbar.polling import merged_listing
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked, read_request, route_of
from crossbar.proxy.outcome import door_key, record_of
from crossbar.proxy.phases import ENDED, MOVES, Phase
from crossbar.proxy.relay import StreamBody
from crossbar.queueing import Flow, Refused, Waiter, Waiting, Waits, flow_of
from crossbar.routing import Ask, Conversation, Placement
from crossbar.stats import RequestRecord
from crossbar.upstream import Call, Discard, Response, describe
from crossbar.usage import APIS, AnswerReader

log = Logger()
_RETRYABLE = (error.ConnectError, error.DNSLookupError, ResponseNeverReceived)
"""Failures that happen before any answer: the request can be tried on another host."""


class Exchange:
    """One client request, and its upstream request (tried on more hosts if need be)."""

    phase = Phase.CHOOSING  # defaults are the class's: an exchange is made per request
    path = b"-"
    route: RouteConfig | None = None
    host: str | None = None
    model: str | None = None  # as in :class:`~crossbar.proxy.demand.Asked`
    asked: str | None = None
    conversation: Conversation | None = None
    placement: Placement | None = None  # where the policy placed it, at the last host
    first_byte: float | None = None
    flow: Flow | None = None  # who it is, where slots are counted
    waited: float | None = None  # seconds it waited in crossbar for a slot
    shed_as: str | None = None  # why the queue answered it, if it did
    reader: AnswerReader | None = None  # what the answer says of its work
    _asked = Asked()  # until the request is read (never changed: each read makes its own)
    _forward_body: bytes | None = None
    _attempt_started = _sent = 0.0
    _counted: str | None = None
    _pending: Call | None = None
    _deadline: Deadline | None = None  # the host's answer's: its head, then each chunk
    _body: StreamBody | None = None
    _waiting: Waiting[Waiter] | None = None

    def __init__(self, proxy: ProxyContext, request: server.Request) -> None:
        self.proxy = proxy
        self.request = request
        self.started = proxy.clock.seconds()
        self.tried: list[str] = []

    def _enter(self, phase: Phase) -> None:
        """The one place the exchange moves on; a move not in :data:`MOVES` is a bug."""
        assert phase in MOVES.get(self.phase, ()), f"{self.phase} -> {phase}"
        self.phase = phase

    @property
    def ended(self) -> bool:
        return self.phase in ENDED

    def start(self) -> None:
        when_over(self.request, self._ended)
        try:
            if self._prepare():
                self._try_next()
        except BadTarget as e:
            self.fail(e.status, str(e))
        except Exception:
            log.failure("crossbar: unexpected error handling a request")
            self.fail(500, "internal error")

    # -- choosing ------------------------------------------------------------------------------

    def _prepare(self) -> bool:
        """Rules needing no upstream (route, path, body, model); False: answered here."""
        request, proxy = self.request, self.proxy
        assert request.uri is not None and request.method is not None
        self.path = request.uri.partition(b"?")[0]  # as asked, until a route is known
        route, target, shape = route_of(proxy.config, request.uri)
        self.route, self.path = route, target.rest
        if shape is None:
            raise BadTarget(404, "not found")
        if route.list_models == "merged" and target.rest == b"/v1/models":
            listing = merged_listing(route, proxy.table.view, int(self.started))
            if listing is None:
                raise BadTarget(503, "no healthy host")
            self._enter(Phase.ANSWERED)
            answer_json(request, 200, listing)
            return False
        places = proxy.traffic.policies.of(route).reads_conversations
        asked = read_request(request, proxy.config, route, target, shape, places)
        self.model, self.asked, self.conversation = asked.model, asked.asked, asked.conversation
        self._asked, self._forward_body = asked, asked.body
        return True

    def _try_next(self, last_error: str | None = None, timed_out: bool = False) -> None:
        route, proxy = self.route, self.proxy
        assert route is not None
        exclude, waits = self.tried, proxy.waits
        policy = proxy.traffic.policies.of(route)
        if waits is not None and route.queue and waits.active():
            first = not self.tried and self.waited is None
            if first and waits.must_wait(route, self.model, (), self.conversation):
                self._queue(waits, route)
                return
            if self.waited is not None or not policy.reads_conversations:
                exclude = exclude + waits.full_hosts(route, self.model, exclude)
            if self.flow is None:  # counted in its flow's share (a popped one is already)
                self.flow = self._flow_of(route)
                waits.started(self.flow)
        ask = Ask(self.model, self.conversation, exclude, proxy.clock.seconds())
        choice = policy.choose(route, ask, proxy.table.view, proxy.traffic.in_flight)
        if choice is None:
            if last_error is None:
                raise BadTarget(503, "no healthy host")
            assert self.host is not None
            status, error = (504, "upstream timeout") if timed_out else (502, "upstream failed")
            self.fail(status, error, host=self.host)
            return
        host = choice.host
        self.placement = choice.placement
        if last_error is not None:
            said = "route {route}: {failed} failed before answering ({why}); trying {host}"
            log.warn(said, route=route.name, failed=self.host, why=last_error, host=host)
        self._enter(Phase.WAITING)
        self.host = host
        self.tried.append(host)
        self._count(host)
        method = self.request.method
        assert method is not None
        self._attempt_started = proxy.clock.seconds()
        self._sent = self._sent or self._attempt_started
        asked = self._asked
        headers = asked.headers + proxy.host_keys.get(host, asked.credentials)
        call = proxy.upstreams.call(host, method, asked.url_rest, headers, self._forward_body, self)
        self._pending = call
        deadline = self._deadline or borrow(self.request.channel, proxy.clock, self)
        self._deadline, deadline.on_due = deadline, self._no_answer
        deadline.set(proxy.settings[host].header_timeout)
        call.start()  # last: it may tell of a failure at once (and the next host be tried)

    def _count(self, host: str | None) -> None:
        """Keep the requests in flight right as the request moves from host to host."""
        self.proxy.traffic.move(self._counted, host, self.model, self.proxy.clock.seconds())
        self._counted = host

    # -- waiting for a slot ----------------------------------------------------------------

    def _flow_of(self, route: RouteConfig) -> Flow:
        head, client = self.request.requestHeaders.getAllRawHeaders(), self._asked.client
        return flow_of(route, head, client, door_key(self.request))

    def _queue(self, waits: Waits, route: RouteConfig) -> None:
        """Every slot of the group is busy: wait in crossbar (or be refused, past a limit)."""
        placed = waits.wait(self, route, self.model, self._flow_of(route), self.conversation)
        if isinstance(placed, Refused):
            self.shed(placed)
            return
        self._waiting = placed
        self._enter(Phase.QUEUED)

    def dispatched(self, waited: float) -> None:
        """A slot of its group is free: on to choosing, among the hosts with room."""
        assert self._waiting is not None
        self.flow, self._waiting = self._waiting.flow, None  # started, as it was taken
        self.waited = waited
        self._enter(Phase.CHOOSING)
        try:
            self._try_next()
        except BadTarget as e:
            self.fail(e.status, str(e))

    def shed(self, refused: Refused) -> None:
        """Answered without a host: a limit, a wait past ``wait_timeout``, a stop."""
        self._waiting, self.shed_as = None, refused.reason
        retry = {b"retry-after": b"%d" % refused.retry_after}
        if not self.ended:
            self._enter(Phase.ANSWERED)
            payload = error_payload(self.path, refused.status, refused.error)
            answer_json(self.request, refused.status, payload, None, retry)

    # -- waiting for the head --------------------------------------------------------------

    def answered(self, response: Response) -> None:
        """The host's head is in (told by the upstream call, as are the two below)."""
        self._pending = None
        self._stop_deadline()
        proxy = self.proxy
        host = self.host
        assert host is not None
        now = proxy.clock.seconds()
        self.first_byte = now - self.started
        proxy.table.judge_answer(host, response.code, now - self._attempt_started)
        request = self.request
        self._forward_body = None  # the host has it, and no other host will be tried
        release_body(request)
        if self.ended:
            response.deliverBody(Discard())
            return
        self._enter(Phase.STREAMING)
        request.setResponseCode(response.code, response.phrase)
        answer_headers(request.responseHeaders, response.headers, response.length, host)
        settings = proxy.settings[host]
        body = StreamBody(
            request,
            proxy.clock,
            settings.idle_timeout,
            self.upstream_idle,
            self.upstream_ended,
            self.client_stalled,
            self._deadline,
        )
        self._body = body
        streamed = any(n.lower() == b"content-type" and v.startswith(b"text/event-stream")
                       for n, v in response.headers)  # fmt: skip
        if self._asked.api in APIS:  # what the answer says of its work, where it says it
            self.reader = reader = AnswerReader(self._asked.api, streamed, proxy.clock.seconds)
            body.tap = reader
        response.deliverBody(body)
        # deliverBody may have finished the exchange (a body that came whole): then no
        # producer (registering it would raise) and no idle timer.
        if self.phase is Phase.STREAMING:
            body.arm()
            request.registerProducer(body, True)

    def _stop_deadline(self) -> None:
        if self._deadline is not None and self._deadline.holder is self:
            self._deadline.clear()

    def _no_answer(self) -> None:
        """No status line within ``header_timeout``: never tried elsewhere (the host
        may still be working on it)."""
        host = self.host
        assert host is not None
        timeout = self.proxy.settings[host].header_timeout
        self.proxy.table.request_failed(host, f"no answer within {timeout:g}s")
        log.warn("host {host} sent no answer within {t:g}s", host=host, t=timeout)
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()  # closes the connection
        self.fail(504, "upstream timeout", host=host)

    def not_answered(self, reason: Failure) -> None:
        self._pending = None
        self._stop_deadline()
        if self.phase is not Phase.WAITING:
            return
        host = self.host
        assert host is not None
        timed_out = bool(reason.check(error.TimeoutError))
        if timed_out:
            why = f"cannot connect: timed out after {self.proxy.settings[host].connect_timeout:g}s"
        else:
            why = describe(reason)
        self.proxy.table.request_failed(host, why)
        if reason.check(*_RETRYABLE):
            self._enter(Phase.CHOOSING)
            self._try_next(why, timed_out=timed_out)
            return
        log.warn("host {host} failed before answering: {why}", host=host, why=why)
        self.fail(502, "upstream failed", host=host)

    # -- streaming -------------------------------------------------------------------------

    def upstream_idle(self) -> None:
        """No body chunk came for ``idle_timeout``: give up on this host."""
        host = self.host
        assert host is not None and self._body is not None
        timeout = self.proxy.settings[host].idle_timeout
        self.proxy.table.request_failed(host, f"answer idle for {timeout:g}s")
        log.warn("host {host} went quiet for {t:g}s mid-answer", host=host, t=timeout)
        if self.request.startedWriting:
            self._cut_off()
            return
        self._enter(Phase.ANSWERED)  # before the body's end, which then changes nothing
        self._body.stopProducing()
        self.request.unregisterProducer()
        self._error(504, "upstream timeout", {"host": host})

    def client_stalled(self) -> None:
        """The client read nothing of its answer for ``idle_timeout``: it holds a host's
        connection (and maybe a GPU slot) for nothing. Both sides end, as if it left."""
        host = self.host
        assert host is not None
        said = "a client read nothing for {t:g}s of its answer from {host}: both ended"
        log.warn(said, t=self.proxy.settings[host].idle_timeout, host=host)
        self._enter(Phase.CLIENT_LEFT)
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
            self._enter(Phase.ANSWERED)
            request.finish()
            return
        assert self.host is not None
        if stopping(request):  # crossbar itself cut it, past drain_timeout
            self._cut_off()
            return
        why = describe(reason)
        self.proxy.table.request_failed(self.host, f"answer broken: {why}")
        log.warn("host {host} broke an answer off: {why}", host=self.host, why=why)
        # An SSE client must see an error, not a stream that merely looks complete.
        self._cut_off()

    def _cut_off(self) -> None:
        """End an answer that has begun: the client's connection is aborted, so that it
        cannot take what it got for a whole answer."""
        self._enter(Phase.CUT_OFF)
        if self._body is not None:
            self._body.stopProducing()
        self._abort_client()

    def crashed(self, reason: Failure) -> None:
        log.failure("crossbar: unexpected error while proxying", reason)
        if not self.ended:
            if self.request.startedWriting:
                self._cut_off()
            else:
                self.fail(500, "internal error")

    def _abort_client(self) -> None:
        transport: Any = self.request.transport
        transport.abortConnection()

    # -- answers made here, and the end ------------------------------------------------

    def fail(self, status: int, message: str, **extra: str) -> None:
        """Answer with a JSON error, unless the exchange has ended already."""
        if self.ended:
            return
        self._enter(Phase.ANSWERED)
        self._error(status, message, extra)

    def _error(self, status: int, message: str, extra: dict[str, str]) -> None:
        payload = error_payload(self.path, status, message, extra)
        answer_json(self.request, status, payload, self.host)

    def _ended(self, result: object) -> None:
        """The client's side is over: the answer was sent, or the client left."""
        if not self.ended:  # the client left first
            self._enter(Phase.CLIENT_LEFT)
            if self._waiting is not None and self.proxy.waits is not None:
                self.proxy.waits.leave(self._waiting)  # no host ever sees it
            elif self._pending is not None:
                self._pending.cancel()
            elif self._body is not None:
                self._body.stopProducing()
        give_back(self._deadline, self)  # unless the connection's next request has it
        self._deadline = None
        if self.flow is not None and self.proxy.waits is not None:  # first: the slot frees next
            took = self.proxy.clock.seconds() - self._sent
            self.proxy.waits.finished(self.flow, took, self._counted)
        self._count(None)
        self.proxy.observer.request_done(self.record())

    @property
    def sent(self) -> int:
        return self._body.sent if self._body is not None else 0

    def record(self) -> RequestRecord:
        """The exchange as it ended, for its observers."""
        return record_of(self, self.proxy.clock.seconds())
