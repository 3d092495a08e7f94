"""The relay client: POST a request to an engine and hand back its status, headers and bytes.

One shared, pooled aiohttp session with HTTP/1.1 keep-alive, created and closed by its
owner (the gateway lifespan). aiohttp is the relay client because it costs about a sixth of
httpx's CPU per request (DESIGN.md §4); probes and scrapes use their own aiohttp session
(``health.background_session``). The
``Backend`` protocol is the seam, so the client can change without touching the gateway.

Timeouts: ``connect`` for the TCP connect, ``read`` for the wait before the first byte and
between chunks (idle), ``total`` for the whole exchange. A failure is raised as a typed
``UpstreamError`` that says whether the request may be retried elsewhere.

May touch: aiohttp, the network. Must not touch: routing, the gateway, config.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 3.0
    read: float = 120.0
    total: float = 600.0


class UpstreamError(Exception):
    """The engine could not be reached or stopped answering; ``kind`` names what happened."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # connect | timeout | protocol


class UpstreamResponse(Protocol):
    status: int
    content_type: str

    async def read(self) -> bytes: ...
    def chunks(self) -> AsyncIterator[bytes]: ...
    def close(self) -> None: ...


class Backend(Protocol):
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts
    ) -> UpstreamResponse: ...
    async def close(self) -> None: ...


class _AiohttpResponse:
    __slots__ = ("_resp", "content_type", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_type = resp.headers.get("content-type", "application/json")

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _classify(exc) from None
        finally:
            self._resp.release()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _classify(exc) from None

    def close(self) -> None:
        # close (not release): a half-read stream must drop the connection so the engine
        # sees the disconnect and aborts the request.
        self._resp.close()


class AiohttpBackend:
    """The production relay client. Create inside a running event loop."""

    def __init__(self, max_connections: int = 1024, per_host: int = 256) -> None:
        connector = aiohttp.TCPConnector(
            limit=max_connections,
            limit_per_host=per_host,
            keepalive_timeout=30.0,
            enable_cleanup_closed=True,
            family=socket.AF_UNSPEC,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts
    ) -> UpstreamResponse:
        timeout = aiohttp.ClientTimeout(
            total=timeouts.total, sock_connect=timeouts.connect, sock_read=timeouts.read
        )
        try:
            resp = await self._session.post(url, data=body, headers=headers, timeout=timeout)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _classify(exc) from None
        return _AiohttpResponse(resp)

    async def close(self) -> None:
        await self._session.close()


def _classify(exc: BaseException) -> UpstreamError:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError("connect", f"cannot connect: {exc.os_error}")
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamError("timeout", "upstream timed out")
    return UpstreamError("protocol", f"upstream failed: {type(exc).__name__}: {exc}")
