"""Liveness and readiness: ``/healthz`` (the process answers), ``/health`` (vLLM's liveness
path, which benchmark clients such as guidellm probe: 200 with an empty body once the
gateway has started and can serve, 503 before), ``/readyz`` (config loaded and at least one
endpoint ready) and ``/version`` (``{"version": ...}``, the package's, as vLLM answers).
All are cheap, never touch an engine and need no key.

May touch: starlette, the app state. Must not touch: backends.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from fleetgate import __version__
from fleetgate.gateway.api.openai import json_ok
from fleetgate.gateway.api.schemas import Readiness, Version
from fleetgate.gateway.state import AppState

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Readiness)
async def healthz(request: Request) -> Response:
    """The process answers."""
    return json_ok({"status": "ok"})


@router.get("/health", response_class=Response, responses={
    200: {"description": "The gateway can serve (an empty body, as vLLM answers)",
          "content": {}},
    503: {"description": "Still starting", "content": {}}})
async def health(request: Request) -> Response:
    """vLLM's liveness path: 200 with an empty body while the gateway can serve."""
    started = getattr(request.app.state, "fleetgate", None) is not None
    return Response(status_code=200 if started else 503)


@router.get("/version", response_model=Version)
async def version(request: Request) -> Response:
    """The gateway's version, as vLLM's ``/version`` answers."""
    return json_ok({"version": __version__})


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> Response:
    """Config loaded and at least one endpoint ready (503 otherwise)."""
    state: AppState | None = getattr(request.app.state, "fleetgate", None)
    if state is None:
        return json_ok({"status": "starting"}, status=503)
    fleet = state.generation.fleet
    ready = fleet.live.ready_count()
    total = len(fleet.endpoints)
    body = {"status": "ready" if ready else "not_ready", "endpoints_ready": ready,
            "endpoints_total": total}
    return json_ok(body, status=200 if ready else 503)
