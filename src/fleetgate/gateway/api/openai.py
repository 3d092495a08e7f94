"""OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Each handler parses (``parse.py``), delegates to ``ProxyService`` and lets the app's error
handler map typed errors to the OpenAI envelope.

May touch: starlette, gateway services. Must not touch: backends or routing internals.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fleetgate.gateway.api.parse import (
    CHAT,
    COMPLETIONS,
    decode_json,
    read_body,
    routing_request,
    wants_usage,
)
from fleetgate.gateway.errors import BadRequest, NotFound
from fleetgate.gateway.proxy.service import PreparedRequest
from fleetgate.gateway.state import AppState


async def _proxy(request: Request, path: str) -> Response:
    state: AppState = request.app.state.fleetgate
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    request.state.request_id = request_id
    principal = state.keys.authenticate(request.headers)
    body = decode_json(await read_body(request, state.settings.max_body_bytes))
    routing = replace(routing_request(path, body, request), tenant=principal.tenant)
    if routing.policy is not None and routing.policy not in state.config.policies:
        raise BadRequest(f"unknown policy {routing.policy!r} in x-fleetgate-policy; known: "
                         f"{', '.join(state.config.policies)}", param="x-fleetgate-policy")
    principal.check_policy(routing.policy)
    if routing.model not in state.models:
        raise NotFound(f"The model '{routing.model}' does not exist. Available: "
                       f"{', '.join(sorted(state.models))}", param="model")
    principal.check_model(routing.model)
    await state.limits.admit(principal, request_id)
    prepared = PreparedRequest(
        path=path,
        routing=routing,
        body=body,
        request_id=request_id,
        client_wants_usage=wants_usage(body),
        traceparent=request.headers.get("traceparent"),
    )
    return await state.chat.handle(prepared)


async def chat_completions(request: Request) -> Response:
    return await _proxy(request, CHAT)


async def completions(request: Request) -> Response:
    return await _proxy(request, COMPLETIONS)


async def list_models(request: Request) -> Response:
    state: AppState = request.app.state.fleetgate
    principal = state.keys.authenticate(request.headers)
    created = int(state.started_at)
    data = [{"id": m, "object": "model", "created": created, "owned_by": "fleetgate"}
            for m in sorted(state.models)
            if principal.models is None or m in principal.models]
    return json_ok({"object": "list", "data": data})


def json_ok(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


routes = [
    Route(CHAT, chat_completions, methods=["POST"]),
    Route(COMPLETIONS, completions, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
]
