"""Liveness and readiness: ``/healthz`` (the process answers) and ``/readyz`` (config loaded
and at least one endpoint ready). Both are cheap and never touch an engine.

May touch: starlette, the app state. Must not touch: backends.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from fleetgate.gateway.api.openai import json_ok
from fleetgate.gateway.api.schemas import Readiness
from fleetgate.gateway.state import AppState

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Readiness)
async def healthz(request: Request) -> Response:
    """The process answers."""
    return json_ok({"status": "ok"})


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
