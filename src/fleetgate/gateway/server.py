"""The HTTP server around the app: uvicorn, with the two deadlines uvicorn lacks.

- **Slow headers** (slowloris): uvicorn bounds an idle keep-alive connection but not a
  request whose headers never finish. ``guarded_httptools(header_timeout_s)`` is uvicorn's
  httptools protocol with a deadline from the request's first byte (or the connection's
  opening) to the end of its headers: past it the connection gets a 408 in the OpenAI
  envelope and is closed. The body's own deadline is the app's (``api/parse.read_body``:
  408 in the envelope).
- **Shutdown**: ``GatewayServer`` waits for running requests up to ``shutdown_timeout_s``,
  then sets ``stop_streams``: every stream still open ends with the API's error event (and
  ``[DONE]``) at its next frame (``api/openai.py``); uvicorn's own graceful timeout, a few
  seconds later, cancels whatever is left.

- **Oversize headers**: httptools has no size limit of its own (it gathers a header of any
  length in memory before the protocol sees it), so the request line and headers are counted
  as they arrive, in ``data_received`` before parsing: past ``MAX_HEADER_BYTES`` (64 KiB in
  all) the connection gets a 431 in the OpenAI envelope and stops being read. The close is a
  *lingering* one (as nginx does): the answer is sent, the write side shut, and whatever the
  client still sends is read and thrown away until it closes or ``LINGER_S`` passes, so a
  client still writing its header gets the 431 instead of a reset, and the gateway's memory
  never holds more than 64 KiB of any header block. (Bytes of a pipelined request that
  arrive in the same read as the end of the one before are not counted: one read at most.)

- **One write per plain answer**: uvicorn writes an answer's head and its body in two
  system calls. Each request's transport is wrapped (``_HeadWithBody``) so that a head
  followed by a body of known length waits for that body and both go out in one write
  (on loopback, each write also runs the receiving side's network stack on this core).
  A stream's head, or a head with no body to follow, is written at once.

What the app cannot wrap: a request uvicorn cannot parse (malformed request line or
headers, a bad ``Content-Length``) is answered by uvicorn itself with a plain-text 400 and
``connection: close`` before the app sees anything; a trailing slash or an unknown route is
the app's (an enveloped 404).

May touch: uvicorn, asyncio. Must not touch: the request path.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from typing import Any

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("fleetgate")

SHUTDOWN_GRACE_S = 5.0  # after the deadline: for streams to write their error event


MAX_HEADER_BYTES = 64 * 1024  # the request line and all headers of one request
LINGER_S = 5.0  # after a 431: how long the rest of the client's bytes are read and dropped


def _envelope(status: str, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error",
                                   "param": None, "code": code}})
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            + body)


def _envelope_408(message: str) -> bytes:
    return _envelope("408 Request Timeout", "request_timeout", message)


class _HeadWithBody:
    """A request cycle's transport: holds the answer's head while a body of known length is
    still to come, and writes it with the body's first bytes (module doc). Every other
    write, and everything else, goes straight to the connection's transport."""

    __slots__ = ("_cycle", "_head", "_state", "_transport")

    def __init__(self, cycle: Any, transport: asyncio.Transport) -> None:
        self._cycle, self._transport = cycle, transport
        self._head, self._state = b"", 0  # 0: no head yet; 1: head held; 2: head written

    def write(self, data: bytes) -> None:
        if self._state == 1:
            data, self._head, self._state = self._head + data, b"", 2
        elif self._state == 0 and self._cycle.response_started:  # this is the head
            self._state = 2
            cycle = self._cycle
            if cycle.chunked_encoding is False and cycle.expected_content_length > 0 \
                    and cycle.scope["method"] != "HEAD":
                self._head, self._state = data, 1
                return
        self._transport.write(data)

    def close(self) -> None:
        if self._state == 1:  # the answer failed after its head: the head still goes
            self.write(b"")
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _GuardedHttpTools(HttpToolsProtocol):
    header_timeout_s = 10.0
    max_header_bytes = MAX_HEADER_BYTES
    _deadline: asyncio.TimerHandle | None = None
    _begun = False
    _in_head = True  # the bytes arriving now are a request line or headers
    _head_bytes = 0
    _refused = False  # over the cap: the rest of the connection is read and dropped
    _refusal_due = False  # over the cap behind a running answer: refused when it ends
    _linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._in_head:
            super().data_received(data)
            return
        room = self.max_header_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return
        if room > 0:
            self._head_bytes += room
            super().data_received(data[:room])
        if self._in_head:
            if not self.transport.is_closing():
                self._too_large()
            return
        self.data_received(data[room:])  # the headers ended within the cap: the rest is body

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._begun = False
        self._in_head = False
        super().on_headers_complete()
        if self.cycle is not None:  # set by uvicorn unless it refused the request
            self.cycle.on_disconnect = None  # type: ignore[attr-defined]  # client.py hooks it
            self.cycle.transport = _HeadWithBody(  # type: ignore[assignment]
                self.cycle, self.transport)

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes = True, 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._refusal_due and not self.transport.is_closing():
            self.server_state.total_requests += 1
            self._refuse()
            return
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger is not None:
            self._linger.cancel()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # uvicorn marks an unfinished answer
            hook = getattr(cycle, "on_disconnect", None)
            if hook is not None:
                hook()  # the request's ClientWatch: no task waits on receive() for this

    def _too_large(self) -> None:
        """The request's head passed the cap: 431 and a lingering close (module doc)."""
        self._disarm()
        self._refused = True
        if self.cycle is not None and not self.cycle.response_complete:
            self._refusal_due = True  # pipelined behind a running answer: after it
            return
        self._refuse()

    def _refuse(self) -> None:
        log.warning("request headers over %d bytes: answered 431 and closed",
                    self.max_header_bytes)
        transport = self.transport
        transport.write(_envelope(
            "431 Request Header Fields Too Large", "request_header_fields_too_large",
            f"request line and headers exceed {self.max_header_bytes // 1024} KiB"))
        if transport.can_write_eof():
            transport.write_eof()  # the client reads the 431, then closes: eof_received
            self._linger = self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._refused:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()  # a pipelined request behind a running one: its turn comes later
            return
        if self._begun:  # part of a request came: say why it is closed
            self.transport.write(_envelope_408(
                f"request headers not received within {self.header_timeout_s:g} s"))
        self.transport.close()


def guarded_httptools(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline on request headers (module doc)."""
    return type("GuardedHttpTools", (_GuardedHttpTools,), {"header_timeout_s": header_timeout_s})


class GatewayServer(uvicorn.Server):
    """uvicorn's server with a shutdown deadline for streams (module doc); with
    ``freeze_gc``, once started, what start-up built is moved out of the garbage collector's
    reach (``gc.freeze``): full collections otherwise walk every object the app, numpy,
    numba and the routing tables made, a pause of ~100 ms every few thousand requests that
    was the gateway's p99 under load (BENCHMARKS.md). Off in-process (tests build many apps)."""

    def __init__(self, config: uvicorn.Config, stop_streams: asyncio.Event,
                 shutdown_timeout_s: float, freeze_gc: bool = False) -> None:
        super().__init__(config)
        self.stop_streams = stop_streams
        self.shutdown_timeout_s = shutdown_timeout_s
        self.freeze_gc = freeze_gc

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.freeze_gc and not self.should_exit:
            gc.collect()
            gc.freeze()

    async def _wait_tasks_to_complete(self) -> None:
        waiting = asyncio.ensure_future(super()._wait_tasks_to_complete())
        try:
            await asyncio.wait_for(asyncio.shield(waiting), self.shutdown_timeout_s)
        except TimeoutError:
            log.warning("shutdown: requests still running after %g s; ending their streams",
                        self.shutdown_timeout_s)
            self.stop_streams.set()
            await waiting


def server_config(app: Any, host: str, port: int, log_level: str, header_timeout_s: float,
                  shutdown_timeout_s: float, **options: Any) -> uvicorn.Config:
    """The gateway's uvicorn settings (``fleetgate serve``; tests use the same)."""
    return uvicorn.Config(
        app, host=host, port=port, loop=options.pop("loop", "uvloop"),
        http=guarded_httptools(header_timeout_s), access_log=False, log_level=log_level,
        # nothing reads the client's address or scheme: no X-Forwarded-* rewriting middleware
        proxy_headers=False,
        timeout_keep_alive=30, timeout_graceful_shutdown=int(shutdown_timeout_s
                                                             + SHUTDOWN_GRACE_S + 0.999),
        **options)
