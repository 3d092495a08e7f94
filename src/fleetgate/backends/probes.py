"""Health probes for engines, and the one HTTP client of the control plane (which it is).

vLLM: ``GET /health`` (200 = engine alive; the port refuses connections while loading).
SGLang: ``GET /ready`` (a flag check; its ``/health`` runs a real generation and takes >= 1 s).
Other OpenAI servers: ``GET /v1/models``. The probe never raises: it returns a result.

The control plane has one HTTP client: the lean HTTP/1.1 client (``backends/http1.py``),
one instance apart from the relay's (the gateway's lifespan creates and closes it:
``gateway/app.py``; ``AppState.http``), so background checks never take a request's
connection. It carries the probes, the collector's scrapes and capacity reads
(``backends/capacity.py``) and the LoRA adapter calls (``backends/adapters.py``). Its pool
looks a connection up by host: httpx's (which scans every connection for every request)
spent ~50 ms of CPU per endpoint and tick at 1,000 endpoints, and aiohttp's client ~0.2 ms
of CPU a request, most of the collector's cost per endpoint and tick (BENCHMARKS.md,
"Collector at scale").

May touch: the relay client, the network. Must not touch: routing, the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgate.backends.http1 import Http1Backend
from fleetgate.backends.relay import Timeouts, UpstreamError, UpstreamResponse
from fleetgate.catalog.engines import EngineSpec


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    detail: str  # "200", "503", "connect refused", "timeout", ...


async def probe(client: Http1Backend, base_url: str, engine: EngineSpec,
                timeout: float = 2.0, headers: dict[str, str] | None = None) -> ProbeResult:
    try:
        resp = await client.get(base_url + engine.health_path, headers,
                                Timeouts(connect=timeout, read=timeout, total=timeout))
        await resp.read()  # to its end, so the connection is kept for the next probe
        return ProbeResult(resp.status == 200, str(resp.status))
    except UpstreamError as exc:
        return ProbeResult(False, _DETAIL.get(exc.kind, exc.kind))


async def probe_then_get(client: Http1Backend, base_url: str, engine: EngineSpec, url: str,
                         headers: dict[str, str] | None, timeout: float = 2.0,
                         probe_headers: dict[str, str] | None = None,
                         ) -> tuple[ProbeResult, UpstreamResponse | UpstreamError | None]:
    """``probe``, and a GET of ``url`` (the same engine's) pipelined behind it on the same
    connection (``Http1Backend.get_pair``): the probe's result is what ``probe`` gives; the
    GET's response (or failure) only when the probe passed, else None (not asked for, as
    if the GET had waited for the probe)."""
    timeouts = Timeouts(connect=timeout, read=timeout, total=timeout)
    try:
        status, second = await client.get_pair(base_url + engine.health_path, probe_headers,
                                               url, headers, timeouts)
    except UpstreamError as exc:
        return ProbeResult(False, _DETAIL.get(exc.kind, exc.kind)), None
    return ProbeResult(status == 200, str(status)), second


_DETAIL = {"connect": "connect refused", "timeout": "timeout", "protocol": "bad answer"}
