"""Worker registration routes: ``POST /admin/endpoints`` (register or heartbeat) and
``DELETE /admin/endpoints/{id}`` (leave). ``GET /admin/endpoints`` lives in ``admin.py``.

Body of a registration (``gateway/registrations.py``): pool, url, engine, accelerator, models,
price_per_gpu_hour, gpus_per_replica, ttl_s. The answer is ``{"id", "ttl_s", "new"}``;
an invalid body or one that makes the fleet invalid is a 400 with the reasons.

May touch: starlette, the app state. Must not touch: backends.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response

from fleetgate.config import ConfigError
from fleetgate.gateway.api.schemas import DeregistrationResult, ErrorEnvelope, RegistrationResult
from fleetgate.gateway.errors import BadRequest, NotFound
from fleetgate.gateway.registrations import RegistrationBody
from fleetgate.gateway.state import AppState

router = APIRouter(prefix="/admin", tags=["workers"], responses={
    401: {"model": ErrorEnvelope, "description": "no or bad admin key (when auth is on)"}})


@router.post("/endpoints", response_model=RegistrationResult, status_code=201,
             responses={200: {"model": RegistrationResult, "description": "a heartbeat"},
                        400: {"model": ErrorEnvelope}})
async def register(body: RegistrationBody, request: Request, response: Response) -> Any:
    """Register a worker's engine (201), or refresh its heartbeat (200)."""
    state: AppState = request.app.state.fleetgate
    try:
        endpoint, new = await state.register(body, time.monotonic())
    except ConfigError as exc:
        raise BadRequest(f"registration makes the fleet invalid: {'; '.join(exc.errors)}") \
            from None
    response.status_code = 201 if new else 200
    return {"id": endpoint, "ttl_s": body.ttl_s, "new": new}


@router.delete("/endpoints/{endpoint_id}", response_model=DeregistrationResult,
               responses={404: {"model": ErrorEnvelope}})
async def deregister(endpoint_id: str, request: Request) -> Any:
    """Remove a registered endpoint (a worker leaving)."""
    state: AppState = request.app.state.fleetgate
    if not await state.deregister(endpoint=endpoint_id):
        raise NotFound(f"no registered endpoint {endpoint_id!r} (configured endpoints are "
                       "removed by editing the config and reloading)", code="not_found")
    return {"id": endpoint_id, "removed": True}
