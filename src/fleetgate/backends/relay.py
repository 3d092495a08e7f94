"""The relay seam: POST a request to an engine and hand back its status, headers and bytes.

``Backend`` is the protocol the request path talks to; ``backends/http1.py`` is the
production client (a lean HTTP/1.1 keep-alive client: aiohttp's client cost about a third of
the gateway's CPU per request, BENCHMARKS.md), ``backends/fake.py`` a scripted one for
tests. The control plane (probes, scrapes, capacity reads, adapter calls) has an instance of
the same client apart from the relay's (``backends/probes.py``).

Timeouts: ``connect`` for the TCP connect, ``read`` for the wait before the first byte and
between chunks (idle), ``total`` for the whole exchange. A failure is raised as a typed
``UpstreamError`` that says whether the request may be retried elsewhere.

May touch: nothing (types only). Must not touch: routing, the gateway, config.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol


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

    @property
    def received(self) -> int:
        """Body bytes the engine has sent so far (what a deadline's message reports)."""
        ...

    async def read(self) -> bytes: ...
    def chunks(self) -> AsyncIterator[bytes]: ...
    def close(self) -> None: ...


class Backend(Protocol):
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts
    ) -> UpstreamResponse: ...
    async def close(self) -> None: ...
