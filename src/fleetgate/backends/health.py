"""Health probes for engines: the cheap readiness check each engine documents.

vLLM: ``GET /health`` (200 = engine alive; the port refuses connections while loading).
SGLang: ``GET /ready`` (a flag check; its ``/health`` runs a real generation and takes >= 1 s).
Other OpenAI servers: ``GET /v1/models``. The probe never raises: it returns a result.

May touch: httpx, the network. Must not touch: routing, the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from fleetgate.backends.engines import EngineSpec


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    detail: str  # "200", "503", "connect refused", "timeout", ...


async def probe(
    client: httpx.AsyncClient, base_url: str, engine: EngineSpec, timeout: float = 2.0
) -> ProbeResult:
    try:
        resp = await client.get(base_url + engine.health_path, timeout=timeout)
    except httpx.ConnectError:
        return ProbeResult(False, "connect refused")
    except httpx.TimeoutException:
        return ProbeResult(False, "timeout")
    except httpx.HTTPError as exc:
        return ProbeResult(False, type(exc).__name__)
    return ProbeResult(resp.status_code == 200, str(resp.status_code))
