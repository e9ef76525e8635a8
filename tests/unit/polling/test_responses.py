"""crossbar.polling.responses: a poll's answer read within a size, digested as it comes, and
refused past it in words. Through treq's own StubTreq: no sockets."""

from __future__ import annotations

from hashlib import blake2b

import pytest
from treq.testing import StubTreq
from twisted.web.resource import Resource
from twisted.web.server import Request

from crossbar.polling.responses import PollError, read_limited


class Body(Resource):
    isLeaf = True

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body = body

    def render_GET(self, request: Request) -> bytes:
        return self.body


def answer(body: bytes) -> object:
    d = StubTreq(Body(body)).get("http://host/v1/models")
    return d.result  # StubTreq answers at once


def test_an_answer_within_the_limit_is_read_whole_and_digested_as_it_came() -> None:
    digest = blake2b(digest_size=16)
    d = read_limited(answer(b'{"data": []}'), 64, digest)  # type: ignore[arg-type]
    assert d.result == b'{"data": []}'
    assert digest.digest() == blake2b(b'{"data": []}', digest_size=16).digest()


@pytest.mark.parametrize(("limit", "said"), [(8, "8 bytes"), (4 * 1024 * 1024, "4 MiB")])
def test_an_answer_past_the_limit_is_refused_in_words(limit: int, said: str) -> None:
    d = read_limited(answer(b"x" * (limit + 1)), limit)  # type: ignore[arg-type]
    failure = d.result
    assert isinstance(failure.value, PollError)
    assert str(failure.value) == f"answer larger than {said}"
    failure.cleanFailure()
    d.addErrback(lambda _: None)
