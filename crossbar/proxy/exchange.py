"""One proxied request: choose a host, forward the request, stream the answer back.

An :class:`Exchange` lives per request. It forwards with crossbar's own lean HTTP/1.1 client
(:mod:`crossbar.upstream`: treq's cookie jar and redirects are wrong for a proxy, Agent's
layers cost a third of the CPU), streams the body as it comes, lets the client's socket
pause the host's (backpressure), and closes the host's connection as soon as the client
leaves, so the GPU stops generating; when every slot is busy it waits for one, in crossbar.

It moves through named phases only by events looked up in one table
(:mod:`crossbar.proxy.phases`), in :meth:`Exchange._on`. Every event that comes late (an
answer after the client left, the body's end after a timeout cut it) finds the exchange
ended and does nothing. What its record will say is filled in as it goes, in one
:class:`~crossbar.proxy.outcome.Outcome`.
"""

from __future__ import annotations

from functools import partial

from twisted.internet import error
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseNeverReceived

from crossbar.http import (
    BadTarget,
    Deadline,
    answer_json,
    borrow,
    error_payload,
    give_back,
    lender_of,
    when_over,
)
from crossbar.polling import MAX_LISTING_BYTES as LISTED
from crossbar.polling import merged_listing
from crossbar.proxy.context import ProxyContext
from crossbar.proxy.demand import Asked, read_request, route_of
from crossbar.proxy.fitting import Fit
from crossbar.proxy.hostanswer import AnswerRelay
from crossbar.proxy.outcome import Outcome
from crossbar.proxy.permits import admission, check_model, load_refusal, revoked
from crossbar.proxy.phases import Event, Phase, next_phase
from crossbar.proxy.refusalbody import RefusalBody
from crossbar.proxy.relay import StreamBody
from crossbar.proxy.shapes import not_found
from crossbar.queueing import Flow, Go, Queued, Refused, Waiter, Waiting
from crossbar.routing import Ask, no_healthy_host, real_model, served_model
from crossbar.upstream import Call, Response, describe

log = Logger()
_RETRYABLE = (error.ConnectError, error.DNSLookupError, ResponseNeverReceived)
"""Failures that happen before any answer: the request can be tried on another host."""


class Exchange(AnswerRelay):
    """One client request, and its upstream request (tried on more hosts if need be).

    Always there: ``proxy``, ``request``, ``phase`` and ``outcome`` (what its record will
    say, filled in as it goes); ``demand`` (what it asks) once the request is read. Each
    phase's own: ``QUEUED`` its place in the queue (``_waiting``); ``WAITING`` the upstream
    call (``_pending``); ``WAITING`` and ``STREAMING`` the deadline of the host's answer
    (``_deadline``); ``HOLDING`` the short ``400`` being read (``_held``); ``STREAMING`` the
    body being relayed (``_body``). From its first host to its end, ``_counted`` is the
    host its slot is counted on; ``fit`` routes it by its prompt's size.
    """

    phase = Phase.CHOOSING  # defaults are the class's: an exchange is made per request
    demand = Asked()  # until the request is read (never changed: each read makes its own)
    _forward_body: bytes | None = None  # until a host has it
    _attempt_started = _sent = 0.0
    _counted: str | None = None
    _pending: Call | None = None
    _deadline: Deadline | None = None  # the host's answer's: its head, then each chunk
    _body: StreamBody | None = None
    _waiting: Waiting[Waiter] | None = None
    _held: RefusalBody | None = None
    fit: Fit | None = None  # once the request is read

    def __init__(self, proxy: ProxyContext, request: server.Request) -> None:
        self.proxy = proxy
        self.request = request
        self.outcome = Outcome(proxy.clock.seconds())

    def _on(self, event: Event) -> bool:
        """The one place the exchange moves: to the phase :data:`~crossbar.proxy.phases.MOVES`
        gives for ``event``. ``False``: it had ended, and a late event changes nothing."""
        after = next_phase(self.phase, event)
        if after is None:
            return False
        self.phase = after
        return True

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
        request, proxy, outcome = self.request, self.proxy, self.outcome
        assert request.uri is not None and request.method is not None
        outcome.path = request.uri.partition(b"?")[0]  # as asked, until a route is known
        route, target, shape = route_of(proxy.config, request.uri)
        outcome.route, outcome.path = route, target.rest
        if shape is None:
            raise BadTarget(404, not_found(route.name, target.rest))
        outcome.generates = shape.uses_slot(request.method)
        if route.list_models == "merged" and target.rest == b"/v1/models":
            listing = merged_listing(route, proxy.table.view, int(outcome.started))
            if listing is None:
                raise BadTarget(503, no_healthy_host(route.name, route.hosts, proxy.table.view))
            self._on(Event.ANSWERED_HERE)
            answer_json(request, 200, listing)
            return False
        places = proxy.traffic.policies.of(route).reads_conversations
        real = partial(real_model, route, states=proxy.table.view) if route.aliases else None
        demand = read_request(request, proxy.config, route, target, shape, places, real)
        check_model(route, request, demand)
        demand.model = served_model(route, demand.model, proxy.table.view)  # what its slot is
        self.demand, self._forward_body, outcome.model = demand, demand.body, demand.asked
        outcome.alias = demand.alias
        self.fit = Fit(proxy, demand, outcome)
        return True

    def _try_next(self, last_error: str | None = None, timed_out: bool = False) -> None:
        proxy, outcome, demand = self.proxy, self.outcome, self.demand
        route, fit = outcome.route, self.fit
        assert route is not None and fit is not None
        small = fit.small(route, outcome.tried)  # too small for its prompt: passed over
        admitted = admission(proxy, self, self.request, demand, outcome, self._counted, small)
        if not isinstance(admitted, Go):  # its slot where it failed, if any, was given back
            self._counted = None
        if isinstance(admitted, Queued):
            self._waiting = admitted.waiting
            self._on(Event.QUEUED)
            return
        if isinstance(admitted, Refused):
            self.shed(admitted)
            return
        exclude = outcome.tried + small + list(admitted.full)
        ask = Ask(demand.model, demand.conversation, exclude, proxy.clock.seconds())
        policy = proxy.traffic.policies.of(route)
        choice = policy.choose(route, ask, proxy.table.view, proxy.traffic.fleet_in_flight)
        if choice is None:
            if last_error is None:
                full = admitted.full if isinstance(admitted, Go) else ()
                words = no_healthy_host(
                    route.name, route.hosts, proxy.table.view, outcome.tried, full
                )
                raise BadTarget(503, words)
            assert outcome.host is not None
            if self._held_answer is not None:  # the last host's error status, held whole
                self._give_held()
                return
            status, error = (504, "upstream timeout") if timed_out else (502, "upstream failed")
            self.fail(status, error, host=outcome.host)
            return
        if (refused := load_refusal(proxy, route, self.request, choice)) is not None:
            self.shed(refused)
            return
        host = choice.host
        outcome.chose(choice)
        if last_error is not None:
            said_why = outcome.size_note is not None and last_error in outcome.size_note
            why = "refused the prompt as too long" if said_why else last_error
            outcome.failures.append((outcome.host or "-", why))
            said = "route {route}: {failed} failed before answering ({why}); trying {host}"
            log.warn(said, route=route.name, failed=outcome.host, why=last_error, host=host)
        self._on(Event.CHOSEN)
        outcome.host = host
        outcome.tried.append(host)
        if demand.slot:
            self._count(host)
        self._attempt_started = proxy.clock.seconds()
        self._sent = self._sent or self._attempt_started
        ready = self._before(route.name, host)
        if ready:  # sent once the others know, and its prefix is restored, unless it ended
            ready.addCallback(lambda _: self._warmed(host))
        else:
            self._send(host)

    def _before(self, route: str, host: str) -> Deferred[None] | None:
        """What a turn waits for before it is sent to ``host``, if anything: the other
        processes told of its conversation's new host, then a saved prefix restored there."""
        proxy, conversation = self.proxy, self.demand.conversation
        where = (route, self.demand.model, host, conversation)
        prefixes = proxy.prefixes if len(self.outcome.tried) == 1 else None  # not on a failover
        told = conversation and proxy.placements and proxy.placements.told(conversation.key)
        if not told:
            return None if prefixes is None else prefixes.before(*where)
        return told if prefixes is None else told.addCallback(lambda _: prefixes.before(*where))

    def _warmed(self, host: str) -> None:
        if self.phase is Phase.WAITING:  # else the client left meanwhile
            try:
                self._send(host)
            except BadTarget as e:
                self.fail(e.status, str(e))

    def _send(self, host: str) -> None:
        """Sends the request to ``host`` (chosen, its slot counted), its head due in time."""
        proxy, demand = self.proxy, self.demand
        method = self.request.method
        assert method is not None
        headers = demand.headers + proxy.host_keys.get(host, demand.credentials)
        body = self._forward_body
        call = proxy.upstreams.call(host, method, demand.url_rest, headers, body, self)
        self._pending = call
        deadline = self._deadline or borrow(lender_of(self.request), proxy.clock, self)
        self._deadline, deadline.on_due = deadline, self._no_answer
        deadline.set(proxy.settings[host].header_timeout)
        call.start()  # last: it may tell of a failure at once (and the next host be tried)

    def _count(self, host: str) -> None:
        """Its slot is counted on ``host`` now; after a failover, no longer on the host
        that failed, whose slot goes to the next request waiting for it."""
        old, self._counted = self._counted, host
        self.proxy.traffic.move(None, host, self.demand.model)
        if old is not None:
            self._leave(old, None)

    def _leave(self, host: str | None, flow: Flow | None) -> None:
        """Its slot on ``host`` frees (``flow``: at its end, credited with its service)."""
        proxy = self.proxy
        if proxy.waits is not None:
            took = 0.0 if flow is None else proxy.clock.seconds() - self._sent
            proxy.waits.release(flow, host, self.demand.model, took)
        elif host is not None:
            proxy.traffic.move(host, None, self.demand.model, proxy.clock.seconds())

    # -- waiting for a slot ----------------------------------------------------------------

    def dispatched(self, waited: float) -> None:
        """A slot of its group is free: on to choosing, among the hosts with room."""
        assert self._waiting is not None
        self.outcome.flow, self._waiting = self._waiting.flow, None  # started, as it was taken
        self.outcome.waited = waited
        if revoked(self.proxy, self.outcome.route, self.request):
            self.fail(401, "unauthorized: the key was removed from the config while it waited")
        elif self._on(Event.DISPATCHED):
            try:
                self._try_next()
            except BadTarget as e:
                self.fail(e.status, str(e))

    def shed(self, refused: Refused) -> None:
        """Answered without a host: a limit, a wait past ``wait_timeout``, a stop."""
        self._waiting, self.outcome.shed, self.outcome.reason = None, refused.reason, refused.error
        if self._on(Event.REFUSED):
            retry = {b"retry-after": b"%d" % refused.retry_after}
            payload = error_payload(self.outcome.path, refused.status, refused.error)
            self._answer_error(refused.status, payload, None, retry)

    # -- waiting for the head --------------------------------------------------------------

    def answered(self, response: Response) -> None:
        """The host's head is in (told by the upstream call, as are the two below)."""
        self._pending = None
        proxy, outcome, fit = self.proxy, self.outcome, self.fit
        host = outcome.host
        assert host is not None and fit is not None
        now = proxy.clock.seconds()
        outcome.first_byte = now - outcome.started
        proxy.table.judge_answer(host, response.code, now - self._attempt_started)
        if fit.holds(response.code, response.length) and self._on(Event.HEAD_HELD):
            # the head's deadline goes on: the rest of a short body is due with it
            self._held = RefusalBody(lambda body, whole: self._refused(response, body, whole))
            response.deliverBody(self._held)
            return
        if self._lists_windows(response) and self._on(Event.HEAD_HELD):
            self._held = RefusalBody(lambda b, whole: self._listed(response, b, whole), LISTED)
            response.deliverBody(self._held)
            return
        self._relay(response, response.deliverBody)

    def _refused(self, response: Response, body: bytes, whole: bool) -> None:
        """A short ``400``'s body, read: a refusal of a prompt too long for the host is tried
        on another host or answered in the API's words; anything else is relayed."""
        held, self._held, fit, host = self._held, None, self.fit, self.outcome.host
        assert held is not None and fit is not None and host is not None
        if self.phase is not Phase.HOLDING:  # the client left, or no answer in time
            held.stop()
            return
        after = fit.refused(host, response.code, body, self.outcome.tried) if whole else None
        if after is None:
            self._relay(response, held.hand_over)
        elif isinstance(after, str):
            self._stop_deadline()
            self._on(Event.HOST_FAILED)
            self._try_next(after)
        else:
            self._stop_deadline()
            self._on(Event.ANSWERED_HERE)
            self._answer_error(after[0], after[1], host)

    def _load_failed(self) -> None:
        """Its host said it failed to load the model (read by
        :class:`~crossbar.proxy.relay.FirstContent`): it is not asked to load it for a while
        (the health table's back-off); the request goes on, or waits."""
        host, model = self.outcome.host, self.demand.model
        if self._on(Event.LOAD_FAILED) and host is not None and model is not None:
            self.proxy.table.load_failed(host, model)
            self.request.unregisterProducer()
            self._body = self.outcome.reader = None
            self._try_next(f"it failed to load {model}")

    def _stop_deadline(self) -> None:
        if self._deadline is not None and self._deadline.holder is self:
            self._deadline.clear()

    def _no_answer(self) -> None:
        """No status line within ``header_timeout``: never tried elsewhere (the host
        may still be working on it)."""
        host = self.outcome.host
        assert host is not None
        timeout = self.proxy.settings[host].header_timeout
        self.proxy.table.request_failed(host, f"no answer within {timeout:g}s")
        log.warn("host {host} sent no answer within {t:g}s", host=host, t=timeout)
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()  # closes the connection
        if self._on(Event.TIMED_OUT):
            if self._held is not None:  # a short 400 whose body never came whole
                self._held.stop()
            self._error(504, "upstream timeout", {"host": host})

    def not_answered(self, reason: Failure) -> None:
        self._pending = None
        self._stop_deadline()
        if self.phase is not Phase.WAITING:
            return
        host = self.outcome.host
        assert host is not None
        timed_out = bool(reason.check(error.TimeoutError))
        if timed_out:
            why = f"cannot connect: timed out after {self.proxy.settings[host].connect_timeout:g}s"
        else:
            why = describe(reason)
        self.proxy.table.request_failed(host, why)
        if reason.check(*_RETRYABLE):
            self._on(Event.HOST_FAILED)
            self._try_next(why, timed_out=timed_out)
            return
        log.warn("host {host} failed before answering: {why}", host=host, why=why)
        self.fail(502, "upstream failed", host=host)

    # -- answers made here, and the end ------------------------------------------------

    def fail(self, status: int, message: str, **extra: str) -> None:
        """Answer with a JSON error, unless the exchange has ended already."""
        if self._on(Event.ANSWERED_HERE):
            self._error(status, message, extra)

    def _error(self, status: int, message: str, extra: dict[str, str]) -> None:
        self.outcome.reason = message + "".join(f" ({n} {v})" for n, v in extra.items())
        payload = error_payload(self.outcome.path, status, message, extra)
        self._answer_error(status, payload, self.outcome.host)

    def _ended(self, result: object) -> None:
        """The client's side is over: the answer was sent, or the client left."""
        if self._on(Event.CLIENT_LEFT):  # the client left first
            if self._waiting is not None and self.proxy.waits is not None:
                self.proxy.waits.leave(self._waiting)  # no host ever sees it
            elif self._pending is not None:
                self._pending.cancel()
            elif self._body is not None:
                self._body.stopProducing()
            elif self._held is not None:
                self._held.stop()
        give_back(self._deadline, self)  # unless the connection's next request has it
        self._deadline = None
        host, self._counted = self._counted, None
        self._leave(host, self.outcome.flow)  # first: the slot frees to whoever waits next
        sent = self._body.sent if self._body is not None else 0
        now = self.proxy.clock.seconds()
        record = self.outcome.record(self.request, self.phase, sent, now)
        if self.fit is not None:
            self.fit.learn(record.prompt_tokens)
        prefixes, route = self.proxy.prefixes, self.outcome.route
        if prefixes is not None and route is not None and record.host is not None:
            ok = record.status == 200 and self.phase is Phase.ANSWERED
            prefixes.finished(
                route.name, self.demand.model, record.host, self.demand.conversation, ok
            )
        self.proxy.observer.request_done(record)
