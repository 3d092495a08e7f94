"""``GET /metrics``: the app's private Prometheus registry in the text exposition format.

Answers in OpenMetrics when the scraper asks for it (``Accept:
application/openmetrics-text``), else Prometheus text 0.0.4. The per-endpoint gauges are
read from the live state during the scrape (``metrics.FleetCollector``).

May touch: starlette, prometheus_client, ``app.state.telemetry``. Must not touch: the
request path.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from starlette.responses import Response

from fleetgate.gateway.telemetry import Telemetry


def telemetry_of(request: Request) -> Telemetry:
    telemetry: Telemetry = request.app.state.telemetry
    return telemetry


router = APIRouter(tags=["telemetry"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}})
async def metrics(request: Request) -> Response:
    """Prometheus metrics, series prefixed ``fleetgate_``."""
    registry = telemetry_of(request).registry
    if "application/openmetrics-text" in request.headers.get("accept", ""):
        return Response(openmetrics.generate_latest(registry),
                        media_type=openmetrics.CONTENT_TYPE_LATEST)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
