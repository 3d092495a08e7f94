"""Worker registration routes: ``POST /admin/endpoints`` (register or heartbeat) and
``DELETE /admin/endpoints/{id}`` (leave). ``GET /admin/endpoints`` lives in ``admin.py``.

Body of a registration (``gateway/registrations.py``): pool, url, engine, accelerator, models,
price_per_gpu_hour, gpus_per_replica, ttl_s. The answer is ``{"id", "ttl_s", "new"}``;
an invalid body or one that makes the fleet invalid is a 400 with the reasons.

May touch: starlette, the app state. Must not touch: backends.
"""

from __future__ import annotations

import time

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fleetgate.config import ConfigError
from fleetgate.gateway.api.openai import json_ok
from fleetgate.gateway.errors import BadRequest, NotFound
from fleetgate.gateway.registrations import RegistrationBody
from fleetgate.gateway.state import AppState


async def register(request: Request) -> Response:
    state: AppState = request.app.state.fleetgate
    try:
        body = RegistrationBody.model_validate(orjson.loads(await request.body()))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise BadRequest(f"invalid registration: {exc}") from None
    try:
        endpoint, new = await state.register(body, time.monotonic())
    except ConfigError as exc:
        raise BadRequest(f"registration makes the fleet invalid: {'; '.join(exc.errors)}") \
            from None
    return json_ok({"id": endpoint, "ttl_s": body.ttl_s, "new": new}, status=201 if new else 200)


async def deregister(request: Request) -> Response:
    state: AppState = request.app.state.fleetgate
    endpoint = request.path_params["endpoint_id"]
    if not await state.deregister(endpoint=endpoint):
        raise NotFound(f"no registered endpoint {endpoint!r} (configured endpoints are "
                       "removed by editing the config and reloading)", code="not_found")
    return json_ok({"id": endpoint, "removed": True})


routes = [
    Route("/admin/endpoints", register, methods=["POST"]),
    Route("/admin/endpoints/{endpoint_id}", deregister, methods=["DELETE"]),
]
