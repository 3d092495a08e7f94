"""Health probes for engines, and the HTTP client the background checks share.

vLLM: ``GET /health`` (200 = engine alive; the port refuses connections while loading).
SGLang: ``GET /ready`` (a flag check; its ``/health`` runs a real generation and takes >= 1 s).
Other OpenAI servers: ``GET /v1/models``. The probe never raises: it returns a result.

``background_session()`` is the aiohttp session for probes and scrapes, apart from the
relay's so background checks never take a request's connection. aiohttp looks a pooled
connection up by host: with 1,000 endpoints, httpx's pool (which scans every connection for
every request) spent ~50 ms of CPU per endpoint and tick (BENCHMARKS.md, "Collector").

May touch: aiohttp, the network. Must not touch: routing, the gateway.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import aiohttp

from fleetgate.catalog.engines import EngineSpec


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    detail: str  # "200", "503", "connect refused", "timeout", ...


def background_session(max_connections: int = 4096) -> aiohttp.ClientSession:
    """Create inside a running event loop; the owner closes it."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=2,
                                     keepalive_timeout=30.0, family=socket.AF_UNSPEC)
    return aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))


async def probe(session: aiohttp.ClientSession, base_url: str, engine: EngineSpec,
                timeout: float = 2.0) -> ProbeResult:
    try:
        async with session.get(base_url + engine.health_path,
                               timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await resp.read()  # drain, so the connection is kept for the next probe
            return ProbeResult(resp.status == 200, str(resp.status))
    except aiohttp.ClientConnectorError:
        return ProbeResult(False, "connect refused")
    except TimeoutError:  # aiohttp's timeouts are TimeoutErrors too
        return ProbeResult(False, "timeout")
    except aiohttp.ClientError as exc:
        return ProbeResult(False, type(exc).__name__)
