"""The relay client: a lean HTTP/1.1 keep-alive client on asyncio protocols and httptools.

Why not aiohttp: for one POST and its answer, aiohttp's client (request and response
objects, its writer, timeout contexts, payload registry) was about a third of the gateway's
CPU per request against an instant engine (BENCHMARKS.md, issue 17). This client does what
the relay needs and nothing else: one write per request (headers and body together), the
answer parsed by httptools' C parser (status, headers, ``content-length`` or chunked
bodies), body pieces handed on as they arrive, and the connection kept for the next request
to the same engine when the answer was read to its end.

- **Pool**: idle connections per (scheme, host, port), newest first, at most
  ``max_idle_per_host``; one idle past ``keepalive_s`` is closed instead of reused. There
  is no cap on connections in use: how many requests an engine gets at once is the
  router's and admission's business. A
  request that fails on a reused connection before any byte of its answer (the engine
  closed it while idle) is sent again once on a new connection: the engine never saw it.
- **Timeouts**: ``connect`` for the TCP (and TLS) connect, ``read`` for the wait before the
  first byte and between body pieces, ``total`` for the whole exchange: the last two on one
  timer per request, re-armed for whichever comes first.
- **Hosts come and go** (pods of an autoscaled pool): every ``SWEEP_EVERY`` connections
  given back, the pool closes what went stale and forgets hosts left with no idle
  connection; the per-URL and per-host caches stop growing (``http1_wire.CACHE_LIMIT``).
- **Flow control**: reading from the engine pauses while more than ``HIGH_WATER`` bytes wait
  for the client, so a slow client slows the engine's socket, not the gateway's memory.
- **Close**: ``close()`` on an answer not read to its end closes the connection, so the
  engine sees the disconnect and aborts the request (vLLM and SGLang both do).
- **Encoding** (issue 24): requests say ``accept-encoding: identity`` (without it any coding
  is acceptable, RFC 9110), and an answer compressed anyway (a proxy in front of the engine)
  is decoded here: ``gzip``/``x-gzip``/``deflate`` with zlib, lazily as the body is read, at
  most ``DECODED_PIECE`` bytes out per piece (a compression bomb inflates no faster than
  the relay reads); any other coding is a ``protocol`` failure. The gateway rewrites the
  model name and reads the usage, so it must see the bytes, and the client then gets them
  plain, without a ``content-encoding``.
- **Size**: a whole answer read with ``read()`` is at most ``MAX_ANSWER_BYTES`` (128 MiB,
  room for a large embeddings batch in JSON); past it, a ``protocol`` failure. Streams are
  bounded per frame (``sse.MAX_FRAME_BYTES``), not in total.

Failures are ``UpstreamError``s with the same kinds as before: ``connect``, ``timeout``,
``protocol``.

May touch: asyncio, ssl, httptools, the network. Must not touch: routing, the gateway.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httptools

from fleetgate.backends.http1_wire import Key, head, header_lines, lines, parse
from fleetgate.backends.relay import Timeouts, UpstreamError, UpstreamResponse

HIGH_WATER = 256 * 1024  # bytes waiting for the client before the engine's socket pauses
DECODED_PIECE = 1024 * 1024  # at most this much decompressed out of one piece at a time
MAX_ANSWER_BYTES = 128 * 1024 * 1024  # a whole (non-streamed) answer, decoded
_DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate"})
T = TypeVar("T")


READ_BUFFER = 256 * 1024
SWEEP_EVERY = 1024  # connections given back between two sweeps of the idle pool


class _Connection(asyncio.BufferedProtocol):
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
        # two pipelined requests (``Http1Backend.get_pair``): resolves with the first's status
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
        """The first of two pipelined answers is whole: check it as ``_Response.read`` would
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


class _Response:
    """``UpstreamResponse`` over one connection; gives it back to the pool when read to its
    end, closes it otherwise."""

    __slots__ = ("_backend", "_conn", "_done", "content_type", "status")

    @property
    def received(self) -> int:
        """Body bytes of the answer so far, as the engine sent them."""
        return self._conn.received

    def __init__(self, backend: Http1Backend, conn: _Connection) -> None:
        self._backend, self._conn = backend, conn
        self._done = False
        self.status = conn.status
        self.content_type = conn.content_type

    async def read(self) -> bytes:
        parts, size = [], 0
        try:
            while (piece := await self._conn.next_piece()) is not None:
                size += len(piece)
                if size > MAX_ANSWER_BYTES:
                    raise UpstreamError("protocol", f"upstream answer over "
                                                    f"{MAX_ANSWER_BYTES >> 20} MiB")
                parts.append(piece)
        finally:
            self.close()
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._done:
            return
        while (piece := await self._conn.next_piece()) is not None:
            yield piece

    def close(self) -> None:
        if self._done:  # once: the connection may already serve another request
            return
        self._done = True
        conn = self._conn
        if conn.complete and conn.failure is None and conn.keep_alive and not conn.closed:
            self._backend.release(conn)  # its watchdog stays armed (``_Connection._watch``)
        else:
            conn.stop_watch()
            if not conn.closed:
                conn.close()


class Http1Backend:
    """The production relay client (module doc). Create inside a running event loop."""

    def __init__(self, max_idle_per_host: int = 256, keepalive_s: float = 30.0) -> None:
        self._idle: dict[Key, list[_Connection]] = {}
        self._max_idle = max_idle_per_host
        self._keepalive_s = keepalive_s
        self._tls: ssl.SSLContext | None = None
        self._releases = 0
        self._read = memoryview(bytearray(READ_BUFFER))  # the connections' (get_buffer)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   timeouts: Timeouts) -> UpstreamResponse:
        key, path = parse(url)
        request = head(key, "POST", path) + header_lines(headers, len(body)) + body
        return await self._exchange(key, request, timeouts)

    async def get(self, url: str, headers: Mapping[str, str] | None,
                  timeouts: Timeouts) -> UpstreamResponse:
        """A GET (the control plane: probes, scrapes, capacity reads, adapter listings)."""
        key, path = parse(url)
        request = head(key, "GET", path) + lines(headers)
        return await self._exchange(key, request, timeouts)

    async def get_pair(self, first_url: str, first_headers: Mapping[str, str] | None,
                       url: str, headers: Mapping[str, str] | None, timeouts: Timeouts,
                       ) -> tuple[int, UpstreamResponse | UpstreamError | None]:
        """Two GETs to one engine pipelined (HTTP/1.1): both requests in one write on one
        connection, the answers read in order (the collector's probe and scrape: one
        exchange's cost instead of two; uvicorn, under vLLM and SGLang, answers pipelined
        requests in order). The first answer is read whole and dropped: its status is
        returned, its failure raised, as ``get`` then ``read`` would. The second comes
        back only after a 200 (else None: dropped with the connection): its response to
        read, or its failure. An engine that closed the connection before any of the
        second answer (``connection: close`` on the first) is asked again on a new one."""
        key, path = parse(first_url)
        key2, path2 = parse(url)
        if key2 != key:
            raise ValueError("get_pair asks one engine")
        request = (head(key, "GET", path) + lines(first_headers)
                   + head(key, "GET", path2) + lines(headers))
        conn, status = await self._sent(
            key, timeouts, lambda c: c.start_pair(request, timeouts.read, timeouts.total))
        assert conn.headers_done is not None
        second = conn.headers_done
        if status != 200:  # the second answer is not wanted
            conn.close()
            _drop(second)
            return status, None
        try:
            await second
        except UpstreamError as exc:
            conn.close()
            if conn.status or exc.kind == "timeout":
                return status, exc
            try:  # closed before the second answer began: the engine did not take it
                return status, await self.get(url, headers, timeouts)
            except UpstreamError as again:
                return status, again
        except BaseException:
            conn.close()
            raise
        return status, _Response(self, conn)

    async def _exchange(self, key: Key, request: bytes, timeouts: Timeouts) -> UpstreamResponse:
        conn, _ = await self._sent(
            key, timeouts, lambda c: c.start(request, timeouts.read, timeouts.total))
        return _Response(self, conn)

    async def _sent(self, key: Key, timeouts: Timeouts,
                    send: Callable[[_Connection], Awaitable[T]]) -> tuple[_Connection, T]:
        """``send`` on an idle connection to ``key``, or on a new one when there is none or
        the engine had closed the idle one before it saw the request; the connection and
        what ``send`` gave (a request's headers are in)."""
        for reused in (True, False):
            conn = self._idle_connection(key) if reused else None
            if reused and conn is None:
                continue
            if conn is None:
                conn = await self._connect(key, timeouts.connect)
            try:
                return conn, await send(conn)
            except UpstreamError:
                conn.close()
                if reused and not conn.got_bytes:
                    continue  # the engine closed it while idle and never saw the request
                raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    def release(self, conn: _Connection) -> None:
        self._releases += 1
        if self._releases % SWEEP_EVERY == 0:
            self.sweep()
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self._max_idle:
            idle[:] = [c for c in idle if not c.closed]  # those the engine closed meanwhile
            if len(idle) >= self._max_idle:
                conn.close()
                return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def sweep(self) -> None:
        """Close idle connections past ``keepalive_s``, forget closed ones, and drop hosts
        left with none: an engine that went away (a pod scaled down, a registration that
        lapsed) is never asked for again, so its entry would otherwise stay."""
        now = time.monotonic()
        for key, idle in list(self._idle.items()):
            kept = []
            for conn in idle:
                if conn.closed or now - conn.idle_since >= self._keepalive_s:
                    conn.close()
                else:
                    kept.append(conn)
            if kept:
                idle[:] = kept
            else:
                del self._idle[key]

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    def _idle_connection(self, key: Key) -> _Connection | None:
        idle = self._idle.get(key)
        if idle is None:
            return None
        now = time.monotonic()
        found = None
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self._keepalive_s:
                found = conn
                break
            conn.close()
        if not idle:  # a host gone for good leaves nothing behind
            del self._idle[key]
        return found

    async def _connect(self, key: Key, connect_s: float) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        if scheme == "https" and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            async with asyncio.timeout(connect_s):
                transport, conn = await loop.create_connection(
                    lambda: _Connection(key, loop, self._read), host, port,
                    ssl=self._tls if scheme == "https" else None)
        except TimeoutError:
            raise UpstreamError("timeout", f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise UpstreamError("connect", f"cannot connect: {exc}") from None
        conn.transport = transport  # uvloop may call connection_made after returning
        return conn


def _drop(future: asyncio.Future[None]) -> None:
    """A future no one will await: its exception, if any, marked as seen."""
    if future.done():
        if not future.cancelled():
            future.exception()
    else:
        future.cancel()
