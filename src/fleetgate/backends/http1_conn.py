"""One connection of the relay client (``http1.py`` tells the whole client): an asyncio
protocol that writes a request head and body in one write, parses the answer with
httptools, hands its body on in pieces (decoded when compressed, reading paused past
``HIGH_WATER`` waiting bytes), and times the exchange with one watchdog.

May touch: asyncio, ssl, httptools, zlib, the network. Must not touch: routing, the gateway.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from typing import Any

import httptools

from fleetgate.backends.http1_wire import Key
from fleetgate.backends.relay import UpstreamError

HIGH_WATER = 256 * 1024  # bytes waiting for the client before the engine's socket pauses
DECODED_PIECE = 1024 * 1024  # at most this much decompressed out of one piece at a time
MAX_ANSWER_BYTES = 128 * 1024 * 1024  # a whole (non-streamed) answer, decoded
_DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate"})


class Connection(asyncio.BufferedProtocol):
    """One keep-alive connection to an engine; parses one answer at a time."""

    def __init__(self, key: Key, loop: asyncio.AbstractEventLoop,
                 read_buffer: memoryview) -> None:
        self.key = key
        self.read_buffer = read_buffer  # shared by the backend's connections (``get_buffer``)
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = "application/json"
        self.keep_alive = True
        self.headers_done: asyncio.Future[None] | None = None
        self.pieces: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.failure: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.got_bytes = False
        self.paused = False
        self.idle_since = 0.0
        self.closed = False
        self.read_s = 0.0
        self.last_data = 0.0
        self.total_s = 0.0
        self.total_at = 0.0  # loop time by which the whole answer must be in
        self.watchdog: asyncio.TimerHandle | None = None
        self.watch_at = 0.0  # loop time the watchdog fires at
        self.received = 0  # body bytes of this answer so far, as sent (before decoding)
        self.encoding = b""  # the answer's content-encoding, lower case
        self.decoder: Any = None  # a zlib decompressor when the answer is compressed
        # two pipelined requests (``http1.Http1Backend.get_pair``): resolves with the first's status
        # once it is whole; its body is dropped (kept only to check a compressed one)
        self.first: asyncio.Future[int] | None = None
        self.first_body: list[bytes] = []

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        """What every connection of one backend reads into: its loop reads one socket at a
        time and the parser copies out what it keeps before the next read, so one buffer
        serves them all; the kernel copies an answer straight into it, not into a buffer of
        the loop's and then a bytes object (a 63 KB scrape, a copy less). One per backend,
        so per loop: never shared across threads."""
        return self.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.read_buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        self.got_bytes = True
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("protocol", f"upstream sent bad HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            what = f": {exc}" if exc else ""
            self._fail(UpstreamError("protocol", f"upstream closed the connection{what}"))

    # -- httptools callbacks -------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value.decode("latin-1")
        elif lower == b"content-encoding":
            self.encoding = value.strip().lower()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self.encoding in _DECODABLE:
            self.decoder = zlib.decompressobj(wbits=47)  # a gzip or zlib header, either
        elif self.encoding not in (b"", b"identity"):
            self._fail(UpstreamError("protocol", "upstream answered with content-encoding "
                                     f"{self.encoding.decode('latin-1')!r}, not identity"))
            self.close()
            return
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.received += len(body)
        if self.first is not None:  # the first of two pipelined answers: dropped
            if self.decoder is not None:
                self.first_body.append(body)
            return
        self.pieces.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.first is not None:
            self._first_done()
            return
        self.complete = True
        self._wake()

    def _first_done(self) -> None:
        """The first of two pipelined answers is whole: check it as ``http1._Response.read`` would
        (size, a compressed body that decodes), resolve ``first`` with its status, and
        start on the second answer, which has ``total_s`` of its own from now (as when
        it is asked for after the first)."""
        first, decoder, raw = self.first, self.decoder, self.first_body
        assert first is not None
        self.first_body = []
        try:
            if self.received > MAX_ANSWER_BYTES:
                raise UpstreamError("protocol", f"upstream answer over "
                                                f"{MAX_ANSWER_BYTES >> 20} MiB")
            if decoder is not None:
                size = len(decoder.decompress(b"".join(raw), MAX_ANSWER_BYTES + 1))
                if size + len(decoder.flush()) > MAX_ANSWER_BYTES:
                    raise UpstreamError("protocol", f"upstream answer over "
                                                    f"{MAX_ANSWER_BYTES >> 20} MiB")
        except zlib.error as exc:
            self._fail(UpstreamError("protocol", f"upstream sent a bad {self.encoding!r} "
                                                 f"body: {exc}"))
            self.close()
            return
        except UpstreamError as exc:
            self._fail(exc)
            self.close()
            return
        status = self.status
        self.first = None
        self.status, self.content_type = 0, "application/json"
        self.received, self.encoding, self.decoder = 0, b"", None
        now = self.loop.time()
        self.last_data, self.total_at = now, now + self.total_s
        self.headers_done = self.loop.create_future()
        if not first.done():
            first.set_result(status)

    # -- the exchange --------------------------------------------------------------------
    def start(self, request: bytes, read_s: float, total_s: float) -> asyncio.Future[None]:
        """Send one request; the future resolves when the answer's headers are in. The
        answer must go no ``read_s`` without a byte and be whole within ``total_s``."""
        self.status, self.content_type, self.complete = 0, "application/json", False
        self.received, self.encoding, self.decoder = 0, b"", None
        self.pieces.clear()
        self.buffered, self.got_bytes, self.failure = 0, False, None
        self.headers_done = self.loop.create_future()
        now = self.loop.time()
        self.read_s, self.last_data = read_s, now
        self.total_s, self.total_at = total_s, now + total_s
        due = min(now + read_s, self.total_at)
        if self.watchdog is None or self.watch_at > due:  # else the last one's, still armed,
            self._arm(due)  # fires first and looks again (a timer a request cost ~5 us)
        assert self.transport is not None
        self.transport.write(request)
        return self.headers_done

    def start_pair(self, requests: bytes, read_s: float, total_s: float) -> asyncio.Future[int]:
        """Send two pipelined requests in one write; the future resolves with the first
        answer's status when it is whole (``headers_done`` then waits for the second's)."""
        self.start(requests, read_s, total_s)
        self.headers_done = None  # made when the first answer is whole
        self.first = self.loop.create_future()
        self.first_body = []
        return self.first

    def _arm(self, at: float) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
        self.watchdog = self.loop.call_at(at, self._watch)
        self.watch_at = at

    def _watch(self) -> None:
        """Both timeouts on one timer (not one per body piece, nor one each): the answer is
        not whole within ``total_s``, or the engine has sent nothing for ``read_s`` while
        the gateway was waiting for it. A connection given back to the pool keeps its timer
        armed, and the next request on it keeps that one when it fires no later than the
        request's own would; when it fires it judges whatever request is then in flight
        (none: it stops), so a timer is made about once a read timeout per connection in
        use, not once a request."""
        self.watchdog = None
        if self.complete or self.failure is not None or self.closed:
            return
        now = self.loop.time()
        if now >= self.total_at:
            self._timed_out(f"upstream answer not complete within {self.total_s:g} s "
                            f"({self.received} bytes of it received)")
            return
        if self.paused or self.pieces:  # the gateway is behind, not the engine: look later
            self._arm(min(now + self.read_s, self.total_at))
            return
        due = self.last_data + self.read_s
        if now >= due:
            if not self.status:
                self._timed_out(f"upstream sent no answer headers within {self.read_s:g} s")
            else:
                self._timed_out(f"upstream sent nothing for {self.read_s:g} s after "
                                f"{self.received} bytes of its answer")
            return
        self._arm(min(due, self.total_at))

    def stop_watch(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None

    async def next_piece(self) -> bytes | None:
        """The body that arrived since the last call (waiting for some), decoded, or None at
        the end of the answer."""
        while True:
            piece = await self._next_raw()
            decoder = self.decoder
            if decoder is None:
                return piece
            try:
                if piece is None:
                    self.decoder = None
                    return decoder.flush() or None
                out = decoder.decompress(piece, DECODED_PIECE)
            except zlib.error as exc:
                raise UpstreamError("protocol", f"upstream sent a bad {self.encoding!r} "
                                                f"body: {exc}") from None
            tail = decoder.unconsumed_tail
            if tail:  # more than one piece's worth: the rest on the next call
                self.pieces.appendleft(tail)
                self.buffered += len(tail)
            if out:
                return out

    async def _next_raw(self) -> bytes | None:
        while not self.pieces:
            if self.failure is not None:
                raise self.failure
            if self.complete:
                return None
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if len(self.pieces) == 1:
            piece = self.pieces.popleft()
        else:  # all that arrived meanwhile, as one piece: one frame batch, one client write
            piece = b"".join(self.pieces)
            self.pieces.clear()
        self.buffered -= len(piece)
        if self.paused and self.buffered <= HIGH_WATER // 4 and self.transport is not None:
            self.paused = False
            self.last_data = self.loop.time()  # the engine was held back, not silent
            self.transport.resume_reading()
        return piece

    def _timed_out(self, message: str = "upstream timed out") -> None:
        self._fail(UpstreamError("timeout", message))
        self.close()

    def _fail(self, error: UpstreamError) -> None:
        if self.failure is None:
            self.failure = error
        if self.first is not None and not self.first.done():
            self.first.set_exception(error)
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.stop_watch()
        if self.transport is not None:
            self.transport.close()
