"""One proxied request: choose a host, forward the request, stream the answer back.

An :class:`Exchange` lives per request. It forwards with crossbar's own lean HTTP/1.1
client (:mod:`crossbar.upstream`; treq's cookie jar and redirects are wrong for a
proxy, and Agent's layers cost a third of the CPU per request), streams the upstream
body through a protocol given to ``Response.deliverBody``, lets the client's socket
pause the upstream socket (backpressure), and closes the upstream connection as soon
as the client leaves so the GPU stops generating.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import error
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.client import ResponseDone, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers

from crossbar.config import RouteConfig
from crossbar.fleet import (
    Outcome,
    Placement,
    choose_for_route,
    merged_listing,
    place,
)
from crossbar.server.access import access_line, access_note
from crossbar.server.context import ProxyContext
from crossbar.server.conversation import Conversation, read_conversation
from crossbar.server.peek import peek_model, with_model
from crossbar.server.request import log_access, release_body
from crossbar.server.rewrite import (
    BODYLESS,
    NOT_RETURNED,
    BadTarget,
    allowed_path,
    json_body,
    parse_target,
    trusted_proxy,
    upstream_headers,
)
from crossbar.server.streaming import StreamBody
from crossbar.server.timers import stop
from crossbar.upstream import Discard, Response, describe, is_cancellation

__all__ = ["Exchange", "ProxyContext"]

log = Logger()


_RETRYABLE = (error.ConnectError, error.DNSLookupError, ResponseNeverReceived)
"""Failures that happen before any answer: the request can be tried on another host."""


class Exchange:
    """One client request, and its upstream request (tried on more hosts if need be)."""

    def __init__(self, proxy: ProxyContext, request: server.Request) -> None:
        self.proxy = proxy
        self.request = request
        self.started = proxy.clock.seconds()
        self.route: RouteConfig | None = None
        self.host: str | None = None
        self.tried: list[str] = []
        self.path = b"-"
        self.model: str | None = None
        """The model the choice of host goes by: the body's, else the route's default."""
        self.asked: str | None = None
        """The model the request's body asks for (the route's default filled in), if it
        is a JSON object; a GET of /v1/models asks for none."""
        self.conversation: Conversation | None = None
        """The conversation, on a ``cache_affinity`` route."""
        self.placement: Placement | None = None
        """Where ``cache_affinity`` placed the conversation, for the last host tried."""
        self.client_gone = False
        self.finished = False
        self.first_byte: float | None = None
        self._url_rest = b""
        self._headers = b""
        self._credentials = b""
        """The client's own credential lines, for a host without a key of its own."""
        self._forward_body: bytes | None = None
        self._attempt_started = 0.0
        self._counted: str | None = None
        self._pending: Deferred[Response] | None = None
        self._deadline: IDelayedCall | None = None
        self._body: StreamBody | None = None
        self._timed_out = False
        self._cut_off = False

    def start(self) -> None:
        self.request.notifyFinish().addBoth(self._ended)
        try:
            if self._prepare():
                self._try_next()
        except BadTarget as e:
            self.fail(e.status, str(e))
        except Exception:
            log.failure("crossbar: unexpected error handling a request")
            self.fail(500, "internal error")

    def _prepare(self) -> bool:
        """Rules that need no upstream: route, path, body limit, model. False when the
        request was answered here (a route's merged model list)."""
        request = self.request
        assert request.uri is not None and request.method is not None
        self.path = request.uri.partition(b"?")[0]  # as asked, until a route is known
        target = parse_target(request.uri)
        route = self.proxy.config.routes.get(target.route)
        if route is None:
            raise BadTarget(404, "unknown route")
        self.route = route
        self.path = target.rest
        if not allowed_path(target.rest):
            raise BadTarget(404, "not found")
        if route.list_models == "merged" and target.rest == b"/v1/models":
            listing = merged_listing(route, self.proxy.table.view, int(self.started))
            if listing is None:
                raise BadTarget(503, "no healthy host")
            self._answer(200, listing)
            return False

        body = request.content.getvalue() if request.content is not None else b""
        self.model = route.default_model
        if body and request.method not in (b"GET", b"HEAD"):
            peek = peek_model(body)
            if peek.model is not None:
                self.model = self.asked = peek.model
            elif peek.missing and route.default_model is not None:
                body = with_model(body, route.default_model)
                self.asked = route.default_model
                release_body(request, keep_reserved=True)  # the copy is the one kept
        if body or request.method not in BODYLESS:
            self._forward_body = body
        if route.policy == "cache_affinity" and body and request.method == b"POST":
            self.conversation = read_conversation(target.rest, body, self.model)
        self._url_rest = target.rest + (b"?" + target.query if target.query else b"")
        client = getattr(request.getClientAddress(), "host", None) or "unknown"
        proxies = self.proxy.config.trusted_proxies
        self._headers, credentials = upstream_headers(
            request.requestHeaders.getAllRawHeaders(),
            client,
            request.isSecure(),
            bool(proxies) and trusted_proxy(client, proxies),
        )
        if not route.api_keys:  # a key for crossbar is never one for a host
            self._credentials = credentials
        return True

    def _next_host(self) -> str | None:
        route = self.route
        assert route is not None
        traffic = self.proxy.traffic
        conversation = self.conversation
        if conversation is not None:
            view, now = self.proxy.table.view, self.proxy.clock.seconds()
            placed = place(
                route, self.model, view, traffic.in_flight, traffic.conversations,
                conversation.key, now, self.tried, conversation.turn,
            )  # fmt: skip
            self.placement = placed
            if placed is not None:
                return placed.host
        host = choose_for_route(
            route,
            self.model,
            self.proxy.table.view,
            traffic.in_flight,
            traffic.turns.get(route.name, 0),  # a route reloaded away: no turns
            exclude=self.tried,
        )
        if host is not None and not self.tried and route.policy == "round_robin":
            traffic.turns[route.name] += 1
        return host

    def _try_next(self, last_error: str | None = None, timed_out: bool = False) -> None:
        host = self._next_host()
        if host is None:
            if last_error is None:
                raise BadTarget(503, "no healthy host")
            assert self.host is not None
            if timed_out:
                self.fail(504, "upstream timeout", host=self.host)
            else:
                self.fail(502, "upstream failed", host=self.host)
            return
        if last_error is not None:
            log.warn(
                "route {route}: {failed} failed before answering ({why}); trying {host}",
                route=self.route.name if self.route else "-",
                failed=self.host,
                why=last_error,
                host=host,
            )
        self.host = host
        self.tried.append(host)
        self._count(host)
        proxy = self.proxy
        method = self.request.method
        assert method is not None
        self._attempt_started = proxy.clock.seconds()
        headers = self._headers + proxy.host_keys.get(host, self._credentials)
        d = proxy.upstreams.request(host, method, self._url_rest, headers, self._forward_body)
        self._pending = d
        timeout = proxy.settings[host].header_timeout
        self._deadline = proxy.clock.callLater(timeout, self._no_answer)
        d.addCallbacks(self._got_response, self._upstream_failed)
        d.addErrback(self._crashed)

    def _count(self, host: str | None) -> None:
        """Keep the requests in flight right as the request moves from host to host."""
        self.proxy.traffic.move(self._counted, host)
        self._counted = host

    def _got_response(self, response: Response) -> None:
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
        if self.client_gone:
            response.deliverBody(Discard())
            return
        request.setResponseCode(response.code, response.phrase)
        out = request.responseHeaders
        out.removeHeader(b"server")
        seen = set()
        for name, value in response.headers:
            lower = name.lower()
            if lower in NOT_RETURNED:
                continue
            if lower in seen:
                out.addRawHeader(name, value)
            else:  # replaces twisted.web's defaults (Content-Type, Date)
                seen.add(lower)
                out.setRawHeaders(name, [value])
        if isinstance(response.length, int):
            out.setRawHeaders(b"content-length", [b"%d" % response.length])
        out.setRawHeaders(b"x-crossbar-host", [host.encode()])
        idle = proxy.settings[host].idle_timeout
        body = StreamBody(request, proxy.clock, idle, self.upstream_idle, self.upstream_ended)
        self._body = body
        response.deliverBody(body)
        # deliverBody may have finished the whole exchange already (a body that was
        # complete); registering a producer then would raise, and no idle timer is needed.
        if not self.finished and not self.client_gone:
            body.arm()
            request.registerProducer(body, True)

    def _stop_deadline(self) -> None:
        stop(self._deadline)
        self._deadline = None

    def _no_answer(self) -> None:
        """No status line within ``header_timeout``. The host may still be working on
        it, so the request is never tried elsewhere."""
        self._deadline = None
        host = self.host
        assert host is not None
        timeout = self.proxy.settings[host].header_timeout
        self.proxy.table.request_failed(host, f"no answer within {timeout:g}s")
        log.warn("host {host} sent no answer within {t:g}s", host=host, t=timeout)
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()  # closes the connection; the cancellation itself is ignored
        self.fail(504, "upstream timeout", host=host)

    def _upstream_failed(self, reason: Failure) -> None:
        self._pending = None
        self._stop_deadline()
        if self.client_gone or is_cancellation(reason):
            return
        host = self.host
        assert host is not None
        timed_out = bool(reason.check(error.TimeoutError))
        if timed_out:
            why = f"cannot connect: timed out after {self.proxy.settings[host].connect_timeout:g}s"
        else:
            why = describe(reason)
        table = self.proxy.table
        table.request_failed(host, why)
        if reason.check(*_RETRYABLE):
            self._try_next(why, timed_out=timed_out)
            return
        log.warn("host {host} failed before answering: {why}", host=host, why=why)
        self.fail(502, "upstream failed", host=host)

    def upstream_idle(self) -> None:
        """No body chunk came for ``idle_timeout``: give up on this host."""
        host = self.host
        assert host is not None and self._body is not None
        timeout = self.proxy.settings[host].idle_timeout
        self._timed_out = True
        self.proxy.table.request_failed(host, f"answer idle for {timeout:g}s")
        log.warn("host {host} went quiet for {t:g}s mid-answer", host=host, t=timeout)
        self._body.stopProducing()
        if self.request.startedWriting:
            self.finished = self._cut_off = True
            self._abort_client()
        else:
            self.request.unregisterProducer()
            self.fail(504, "upstream timeout", host=host)

    def upstream_ended(self, reason: Failure) -> None:
        """The upstream body ended: cleanly, broken, or because we stopped it."""
        if self.client_gone or self._timed_out:
            return
        request = self.request
        if self._body is not None:
            request.unregisterProducer()
        if reason.check(ResponseDone, PotentialDataLoss):
            self.finished = True
            request.finish()
            return
        assert self.host is not None
        why = describe(reason)
        self.proxy.table.request_failed(self.host, f"answer broken: {why}")
        log.warn("host {host} broke an answer off: {why}", host=self.host, why=why)
        # An SSE client must see an error, not a stream that merely looks complete.
        self.finished = self._cut_off = True
        self._abort_client()

    def _crashed(self, reason: Failure) -> None:
        log.failure("crossbar: unexpected error while proxying", reason)
        if not self.finished and not self.client_gone:
            if self.request.startedWriting:
                self._abort_client()
            else:
                self.fail(500, "internal error")

    def _abort_client(self) -> None:
        transport: Any = self.request.transport
        transport.abortConnection()

    def fail(self, status: int, message: str, **extra: str) -> None:
        """Answer with a JSON error."""
        self._answer(status, {"error": message, **extra})

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        """Answer with JSON made here, not by a host."""
        if self.finished or self.client_gone:
            return
        self.finished = True
        body = json_body(payload)
        request = self.request
        request.setResponseCode(status)
        request.responseHeaders = Headers(
            {b"content-type": [b"application/json"], b"content-length": [b"%d" % len(body)]}
        )
        if self.host is not None:
            request.responseHeaders.setRawHeaders(b"x-crossbar-host", [self.host.encode()])
        request.write(body)
        request.finish()

    def _ended(self, result: object) -> None:
        """The client's side is over: the answer was sent, or the client left."""
        left = isinstance(result, Failure) and not self._cut_off
        if left:
            self.client_gone = True
            if self._pending is not None:
                self._pending.cancel()
            elif self._body is not None:
                self._body.stopProducing()
        self._count(None)
        seconds = self.proxy.clock.seconds() - self.started
        answered = self.finished or self.request.startedWriting
        # A client that left before the end of its answer did not get it, whatever began.
        status = 499 if self.client_gone or not answered else self.request.code
        route = self.route.name if self.route is not None else "-"
        sent = self._body.sent if self._body is not None else 0
        placed = self.placement
        affinity = None if placed is None else placed.outcome
        self.proxy.observer.request_done(
            Outcome(route, self.host, status, seconds, self.first_byte, sent, self.asked, affinity)
        )
        moved_from = placed.home if placed is not None and placed.outcome == "moved" else None
        note = access_note(self._cut_off, left, self.tried, moved_from)
        method = self.request.method
        line = access_line(route, self.host, method, self.path, status, seconds, note=note)
        # The fields again for log_format: json (crossbar.logformat), never a body or key.
        fields = (route, self.host, self.asked, method, self.path, status, seconds,
                  self.first_byte, sent, note)  # fmt: skip
        log_access(log, line, fields)
