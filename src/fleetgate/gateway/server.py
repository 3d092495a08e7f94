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

What the app cannot wrap: a request uvicorn cannot parse (malformed request line or
headers, headers beyond httptools' size limit, a bad ``Content-Length``) is answered by
uvicorn itself with a plain-text 400 and ``connection: close`` before the app sees anything;
a trailing slash or an unknown route is the app's (an enveloped 404).

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


def _envelope_408(message: str) -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error",
                                   "param": None, "code": "request_timeout"}})
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            + body)


class _GuardedHttpTools(HttpToolsProtocol):
    header_timeout_s = 10.0
    _deadline: asyncio.TimerHandle | None = None
    _begun = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._begun = False
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
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
