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
``protocol``. This file keeps the pool and the answers; one connection (its parser, body
pieces, flow control, decoding and watchdog) is ``http1_conn.py``, what it writes
``http1_wire.py``.

May touch: asyncio, ssl, httptools, the network. Must not touch: routing, the gateway.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

from fleetgate.backends.http1_conn import MAX_ANSWER_BYTES, Connection
from fleetgate.backends.http1_wire import Key, head, header_lines, lines, parse
from fleetgate.backends.relay import Timeouts, UpstreamError, UpstreamResponse

T = TypeVar("T")


READ_BUFFER = 256 * 1024
SWEEP_EVERY = 1024  # connections given back between two sweeps of the idle pool


class _Response:
    """``UpstreamResponse`` over one connection; gives it back to the pool when read to its
    end, closes it otherwise."""

    __slots__ = ("_backend", "_conn", "_done", "content_type", "status")

    @property
    def received(self) -> int:
        """Body bytes of the answer so far, as the engine sent them."""
        return self._conn.received

    def __init__(self, backend: Http1Backend, conn: Connection) -> None:
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
            self._backend.release(conn)  # its watchdog stays armed (``Connection._watch``)
        else:
            conn.stop_watch()
            if not conn.closed:
                conn.close()


class Http1Backend:
    """The production relay client (module doc). Create inside a running event loop."""

    def __init__(self, max_idle_per_host: int = 256, keepalive_s: float = 30.0) -> None:
        self._idle: dict[Key, list[Connection]] = {}
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
                    send: Callable[[Connection], Awaitable[T]]) -> tuple[Connection, T]:
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

    def release(self, conn: Connection) -> None:
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

    def _idle_connection(self, key: Key) -> Connection | None:
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

    async def _connect(self, key: Key, connect_s: float) -> Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        if scheme == "https" and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            async with asyncio.timeout(connect_s):
                transport, conn = await loop.create_connection(
                    lambda: Connection(key, loop, self._read), host, port,
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
