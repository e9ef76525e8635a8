"""A sans-IO parser for the answers (HTTP/1.1 responses) of crossbar's hosts.

llhttp (through ``httptools``) reads the status line, the headers and chunked bodies in C;
this module adds what llhttp cannot be told or does not refuse by itself: that a HEAD
answer has no body, interim ``1xx`` answers, Transfer-Encodings crossbar cannot frame, the
size limits, and where exactly an answer ends. llhttp has no way to report that position,
and after an answer it starts on the next one, so it is only ever given bytes up to a
place where the answer may end: the end of a head (the first blank line), the end of a
Content-Length body (counted here, without llhttp), or, in a chunked body, a blank line
(``\\r\\n\\r\\n``, with which every chunked body ends: llhttp refuses bare CR or LF).

Nothing here does I/O or imports Twisted; the connection feeds bytes in and gets events
out through three callbacks.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpResponseParser,
)

MAX_HEAD = 64 * 1024
"""Largest status line and headers accepted, counting any interim answers before them."""
MAX_TRAILERS = 64 * 1024
"""Largest trailer section accepted after a chunked body."""
MAX_INTERIM = 10
"""Most interim (1xx) answers accepted before the final one, so that endless ones end."""

_END = b"\r\n\r\n"
_OWS = b" \t"
_FRAMING_INITIALS = frozenset(b"ct")
"""First letters (lower-cased) of the header names framing depends on: the others are
kept as they came, without a closer look."""
_LLHTTP_ERRORS = (HttpParserError, HttpParserUpgrade)

# Where the parser is: which bytes the next ``feed`` holds.
_IDLE, _HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE, _BROKEN = range(7)
# A chunked body may go this far without a body byte: trailers, plus some chunk framing.
_MAX_QUIET = MAX_TRAILERS + 1024


class BadAnswer(Exception):
    """The host's answer is not HTTP/1.1 crossbar can frame.

    ``str()`` is a short reason in words, never bytes of the answer (llhttp's own reasons
    are fixed strings), so it is safe to log and to show.
    """


@attrs.frozen
class Head:
    """The status line and headers of a final answer, as the host sent them."""

    code: int
    phrase: bytes
    """The reason text as sent (may be empty)."""
    headers: list[tuple[bytes, bytes]]
    """In order, names as the host spelled them, values without surrounding spaces/tabs."""
    length: int | None
    """The Content-Length the host sent, None without one (chunked or until the close).

    For HEAD, 204 and 304 answers it is what the header says although no body follows:
    the size a GET would have had, which is what a proxy forwards.
    """
    keep_alive: bool
    """Whether the connection may carry another request once this answer has ended."""


class AnswerParser:
    """Parses one answer on a connection at a time; :meth:`expect` starts each.

    ``on_head(head)`` comes once per answer (interim 1xx answers are skipped),
    ``on_body(data)`` with the de-chunked body as it arrives (never empty), and
    ``on_end(extra)`` once the answer is complete, with the bytes that followed it in the
    same ``feed`` (a host must not speak unasked: the caller drops a connection when
    ``extra`` is not empty). Bytes fed after ``on_end`` raise :class:`BadAnswer`. An answer
    that ends with the connection gets no ``on_end``: :meth:`closed` says so instead.

    Exceptions raised by the callbacks come out of :meth:`feed` unchanged; after one, or
    after a :class:`BadAnswer`, the parser refuses bytes until the next :meth:`expect`.
    The callbacks must not call :meth:`feed`; ``on_end`` may call :meth:`expect`.

    The ``on_*`` methods below are llhttp's callbacks (httptools only calls the ones a
    protocol object has), not part of the API.
    """

    def __init__(
        self,
        on_head: Callable[[Head], None],
        on_body: Callable[[bytes], None],
        on_end: Callable[[bytes], None],
    ) -> None:
        self._on_head = on_head
        self._on_body = on_body
        self._on_end = on_end
        self._state = _IDLE
        self._llhttp = HttpResponseParser(self)
        self._head_only = False
        self._head_bytes = 0  # fed since expect(), until the final head is complete
        self._interims = 0  # interim answers since expect()
        self._tail = b""  # last bytes of the head fed so far: a blank line may span feeds
        self._prefix = b""  # first bytes of the answer, which must be b"HTTP/"
        self._phrase: list[bytes] = []
        self._headers: list[tuple[bytes, bytes]] = []
        # Read from the headers as they come (the ones framing depends on):
        self._length: int | None = None
        self._codings: list[bytes] = []
        self._last_coding = b""
        self._connection: set[bytes] = set()
        self._interim = False
        self._ready: Head | None = None
        self._framing = _DONE
        self._left = 0  # Content-Length bytes still to come
        self._quiet = 0  # bytes fed in a chunked body since llhttp last gave body bytes
        self._trailers = 0
        self._complete = False

    def expect(self, head_only: bool) -> None:
        """Get ready for the answer to the request just sent (``head_only`` for HEAD).

        A new llhttp parser each time: it costs less than a microsecond, and the old one
        may be inside a body it was never given, or failed.
        """
        self._state = _HEAD
        self._llhttp = HttpResponseParser(self)
        self._head_only = head_only
        self._head_bytes = 0
        self._interims = 0
        self._tail = b""
        self._new_answer()
        self._quiet = 0
        self._trailers = 0
        self._complete = False

    def _new_answer(self) -> None:
        self._prefix = b""
        self._phrase = []
        self._headers = []
        self._length = None
        self._codings = []
        self._last_coding = b""
        self._connection = set()
        self._interim = False
        self._ready = None

    def feed(self, data: bytes) -> None:
        """Parse the bytes that came; raises :class:`BadAnswer` on anything malformed."""
        if not data:
            return
        state = self._state
        try:
            if state == _CHUNKED:
                # The hot path: one call into llhttp per read, unless the answer may end here.
                self._quiet += len(data)
                if data[0] < 14 or data.find(_END) >= 0:
                    self._chunks_split(data)
                    return
                try:
                    self._llhttp.feed_data(data)
                except _LLHTTP_ERRORS as e:
                    raise self._refuse(e) from None
                if self._complete or self._quiet > _MAX_QUIET:
                    self._chunks_fed(b"")
            elif state == _LENGTH:
                left = self._left
                if len(data) < left:
                    self._left = left - len(data)
                    self._on_body(data)
                else:
                    self._left = 0
                    self._on_body(data if len(data) == left else data[:left])
                    self._finish(data[left:])
            elif state == _UNTIL_CLOSE:
                self._on_body(data)
            elif state == _HEAD:
                self._head(data)
            elif state == _DONE:
                raise BadAnswer("bytes after the answer")
            elif state == _IDLE:
                raise BadAnswer("bytes before any request")
            else:
                raise BadAnswer("bytes after a refused answer")
        except BaseException:
            if self._state != _DONE:
                self._state = _BROKEN
            raise

    def closed(self) -> bool:
        """The connection ended: True when that completes the answer (a body framed by
        the connection's end), False when it cuts the answer off or none was under way.

        It never calls ``on_end``: an answer framed by the close may have lost its end, and
        the caller may want to say so. The parser then refuses bytes until :meth:`expect`.
        """
        state, self._state = self._state, _DONE
        return state == _UNTIL_CLOSE

    # -- the head ---------------------------------------------------------------------------

    def _head(self, data: bytes) -> None:
        """Give llhttp the head up to each blank line, since one may end it, and no further."""
        tail = self._tail
        buffer = tail + data if tail else data
        fed = len(tail)  # buffer[:fed] went to llhttp already
        begin = search = 0  # where this answer starts; where a blank line may start
        while True:
            end = buffer.find(_END, search)
            stop = len(buffer) if end < 0 else end + 4
            self._head_piece(buffer[fed:stop])
            fed = stop
            if end < 0:
                self._tail = buffer[max(begin, len(buffer) - 3) :]
                return
            head = self._ready
            if head is not None:
                break
            if not self._interim:
                raise BadAnswer("malformed head")
            self._interims += 1
            if self._interims > MAX_INTERIM:
                raise BadAnswer(f"more than {MAX_INTERIM} interim (1xx) answers")
            # An interim answer: the final one follows, on a fresh llhttp parser (llhttp
            # refuses bytes after, for one, an HTTP/1.0 100 Continue).
            self._llhttp = HttpResponseParser(self)
            self._new_answer()
            begin = search = stop
        self._tail = b""
        rest = buffer[stop:]
        framing = self._state = self._framing
        self._on_head(head)
        if framing == _DONE:
            self._finish(rest)
        elif rest:
            self.feed(rest)

    def _head_piece(self, piece: bytes) -> None:
        if not piece:
            return
        self._head_bytes += len(piece)
        if self._head_bytes > MAX_HEAD:
            raise BadAnswer("status line and headers too long")
        if len(self._prefix) < 5:
            # llhttp also takes RTSP/ and ICE/, and skips blank lines before the status line.
            self._prefix += piece[: 5 - len(self._prefix)]
            if not b"HTTP/".startswith(self._prefix):
                raise BadAnswer("not an HTTP answer")
        try:
            self._llhttp.feed_data(piece)
        except _LLHTTP_ERRORS as e:
            raise self._refuse(e) from None

    def on_status(self, data: bytes) -> None:
        self._phrase.append(data)  # llhttp gives the phrase in as many pieces as it came

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state != _HEAD:
            self._trailers += len(name) + len(value) + 3  # counting ": " and CRLF
            if self._trailers > MAX_TRAILERS:
                raise BadAnswer("trailers too long")
            return
        raw = value
        if value and value[-1] in _OWS:
            value = value.rstrip(b" \t")  # llhttp strips the leading spaces and tabs only
        self._headers.append((name, value))
        if name[0] | 0x20 not in _FRAMING_INITIALS:  # not Content-*, Transfer-*, Connection
            return
        lower = name.lower()
        if lower == b"content-length":
            length = self._length
            if not value.isdigit() or (length is not None and int(value) != length):
                raise BadAnswer("bad Content-Length")
            self._length = int(value)
        elif lower == b"transfer-encoding":
            self._codings += (c.strip(b" \t").lower() for c in value.split(b","))
            self._last_coding = raw.rstrip(b" ").lower()
        elif lower == b"connection":
            self._connection.update(t.strip(b" \t").lower() for t in value.split(b","))

    def on_headers_complete(self) -> None:
        llhttp = self._llhttp
        code = llhttp.get_status_code()
        if not 100 <= code <= 599:
            raise BadAnswer("status code out of range")
        version = llhttp.get_http_version()
        if version != "1.1" and version != "1.0":
            raise BadAnswer("not HTTP/1.1 or HTTP/1.0")
        phrase = self._phrase[0] if len(self._phrase) == 1 else b"".join(self._phrase)
        length = self._length
        codings = self._codings
        connection = self._connection
        if b"\r" in phrase or b"\n" in phrase:
            raise BadAnswer("line break in the reason phrase")
        chunked = bool(codings)
        if chunked:
            codings = [c for c in codings if c]
            last_coding = self._last_coding
            # llhttp only decodes chunks when the last header ends with "chunked" and spaces
            # (no tab, no comma); else it takes the body as raw bytes until the close.
            if (
                codings[-1:] != [b"chunked"]
                or b"chunked" in codings[:-1]
                or not last_coding.endswith(b"chunked")
            ):
                raise BadAnswer("unsupported Transfer-Encoding")
            if length is not None:
                raise BadAnswer("both Content-Length and Transfer-Encoding")
            if version == "1.0":  # RFC 9112, 6.1: the framing is not to be trusted
                raise BadAnswer("Transfer-Encoding in an HTTP/1.0 answer")
        if code < 200:
            if code == 101:
                raise BadAnswer("protocol switch")
            if chunked or length:
                raise BadAnswer("interim answer with a body")
            self._interim = True
            return
        keep_alive = b"close" not in connection and (
            version == "1.1" or b"keep-alive" in connection
        )
        if self._head_only or code == 204 or code == 304:
            # No body, whatever the headers announce; llhttp is given nothing past the
            # head, so the next answer on the connection is read from its first byte.
            framing = _DONE
        elif chunked:
            framing = _CHUNKED
        elif length is not None:
            framing = _LENGTH if length else _DONE
            self._left = length
        else:
            framing = _UNTIL_CLOSE
            keep_alive = False
        self._framing = framing
        self._ready = Head(code, phrase, self._headers, length, keep_alive)

    def on_message_complete(self) -> None:
        # Only a chunked body's end counts: llhttp also ends interim and bodiless answers.
        if self._state == _CHUNKED:
            self._complete = True

    # -- chunked bodies ---------------------------------------------------------------------

    def on_body(self, data: bytes) -> None:
        self._quiet = 0
        self._on_body(data)

    def _chunks_split(self, data: bytes) -> None:
        """Feed llhttp up to each place the answer may end, stopping where it does."""
        cuts = []
        for i in range(min(3, len(data))):  # a blank line begun in the previous feed
            if data[i] == 10:
                cuts.append(i + 1)
            elif data[i] != 13:
                break
        at = data.find(_END)
        while at >= 0:
            cuts.append(at + 4)
            at = data.find(_END, at + 2)
        cuts.append(len(data))
        view = memoryview(data)
        begin = 0
        for cut in cuts:
            if cut > begin:
                try:
                    self._llhttp.feed_data(view[begin:cut])
                except _LLHTTP_ERRORS as e:
                    raise self._refuse(e) from None
                if self._complete:
                    break
                begin = cut
        self._chunks_fed(data[cut:])

    def _chunks_fed(self, rest: bytes) -> None:
        if self._complete:
            self._finish(rest)
        elif self._quiet > _MAX_QUIET:
            # A trailer without end (which httptools keeps growing in memory), or a chunk's
            # size line without end.
            raise BadAnswer("trailers or chunk size line too long")

    # -- endings ----------------------------------------------------------------------------

    def _finish(self, extra: bytes) -> None:
        self._state = _DONE
        self._on_end(extra)

    def _refuse(self, error: Exception) -> BaseException:
        """What llhttp raised, in crossbar's words; a callback's own exception as it was."""
        if isinstance(error, HttpParserUpgrade):
            return BadAnswer("protocol switch")
        cause = error.__context__
        if isinstance(error, HttpParserCallbackError) and cause is not None:
            return cause
        reason = " ".join(str(error).split())  # llhttp's reasons are fixed strings
        return BadAnswer(reason or "malformed answer")
