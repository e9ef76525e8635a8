"""crossbar.upstream.failures: the words an admin reads for a failed request or poll
(status page, JSON, log), and which failures are only crossbar's own cancellations."""

from __future__ import annotations

import errno

import pytest
from OpenSSL import SSL
from service_identity import VerificationError
from service_identity.hazmat import DNS_ID, DNSMismatch
from twisted.internet import defer, error
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from crossbar.upstream import describe, is_cancellation
from crossbar.upstream.parsing import BadAnswer


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (error.getConnectError((errno.ENETUNREACH, "x")), "cannot connect: network is unreachable"),
        (error.ConnectError(osError=errno.EHOSTUNREACH), "cannot connect: no route to host"),
        (error.ConnectError(string="Lost in space."), "cannot connect: lost in space"),
        (error.ConnectError(), "cannot connect: no reason given"),
        (error.getConnectError((errno.ECONNREFUSED, "x")), "connection refused"),
        (error.TimeoutError(), "timed out"),
        (defer.TimeoutError(), "timed out"),
        (error.DNSLookupError("gpu.lab"), "DNS lookup failed"),
        (error.ConnectionLost(), "connection lost"),
        (OSError(errno.ECONNRESET, "Connection reset by peer"), "connection reset by peer"),
        (
            BadAnswer("both Content-Length and Transfer-Encoding"),
            "bad answer: both Content-Length and Transfer-Encoding",
        ),
        (
            ResponseNeverReceived([Failure(error.ConnectionDone())]),
            "closed before answering (connection lost)",
        ),
        (
            ResponseFailed([Failure(BadAnswer("bad chunk size"))]),
            "bad answer: bad chunk size",
        ),
        (ValueError("line one\nline two"), "ValueError: line one"),
        (
            SSL.Error([("SSL routines", "", "certificate verify failed")]),
            "TLS: certificate verify failed",
        ),
        (  # the handshake failed: the request was never sent, so TLS is the whole story
            ResponseNeverReceived(
                [Failure(SSL.Error([("SSL routines", "", "wrong version number")]))]
            ),
            "TLS: wrong version number",
        ),
        (
            ResponseNeverReceived([Failure(VerificationError([DNSMismatch(DNS_ID("gpu-a"))]))]),
            "TLS: the certificate is for another host name",
        ),
        (
            ResponseFailed([Failure(SSL.Error([("SSL routines", "", "bad record mac")]))]),
            "answer cut off (TLS: bad record mac)",
        ),
        (SSL.Error([]), "TLS: handshake failed"),
    ],
)
def test_failures_are_described_in_words_on_one_line(exc: BaseException, words: str) -> None:
    assert describe(exc) == words
    assert describe(Failure(exc)) == words


@pytest.mark.parametrize(
    ("exc", "ours"),
    [
        (defer.CancelledError(), True),
        (error.ConnectingCancelledError(None), True),
        (ResponseNeverReceived([Failure(defer.CancelledError())]), True),
        (ResponseNeverReceived([Failure(error.ConnectionDone())]), False),
        (error.ConnectionRefusedError(), False),
    ],
)
def test_only_our_own_cancellations_count_as_such(exc: BaseException, ours: bool) -> None:
    assert is_cancellation(exc) is ours
