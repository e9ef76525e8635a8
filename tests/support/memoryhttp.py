"""An HTTP client whose requests go to crossbar in memory (:class:`crossbar.testing.MemoryProxy`),
for the SDKs' tests: what the OpenAI and Anthropic Python SDKs make of crossbar's answers,
with no socket and no clock of their own."""

from __future__ import annotations

import httpx2

from crossbar.testing import MemoryProxy


def memory_http_client(proxy: MemoryProxy) -> httpx2.Client:
    """An ``httpx2.Client`` (the one both SDKs take as ``http_client``) that sends each
    request over a new connection into ``proxy`` and answers with what crossbar sent back
    at once (an answer that needs a host's reply is for the caller to drive)."""

    def send(request: httpx2.Request) -> httpx2.Response:
        client = proxy.client()
        head = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
        head += [b"%s: %s" % (k, v) for k, v in request.headers.raw if k.lower() != b"connection"]
        client.send(b"\r\n".join(head) + b"\r\n\r\n" + request.content)
        status_head, _, body = client.received.partition(b"\r\n\r\n")
        status_line, *lines = status_head.split(b"\r\n")
        headers = [tuple(line.split(b": ", 1)) for line in lines]
        return httpx2.Response(int(status_line.split()[1]), headers=headers, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(send))
