"""OpenAI-compatible routes: chat, completions, responses, embeddings, messages; ``/v1/models``.

The five proxy routes share one handler: parse (``parse.py``), authenticate, check the
policy and the model (404 for a model nobody serves, 400 for one served but not over this
API), admit against the caller's limits, then hand a ``ProxyRequest`` to the proxy service.
An admitted request's answer (error or not; a stream's start) carries the key's rate-limit
headers (``limits.LimitEnforcer.rate_headers``).
They are plain Starlette routes inside the FastAPI app: no per-request model validation on
the hot path. ``/openapi.json`` still documents their bodies (``schemas.OPENAI_BODIES``,
added by ``app.py``).

May touch: starlette, gateway services. Must not touch: backends or routing internals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fleetgate.gateway.api.parse import (
    decode_json,
    header_map,
    read_body,
    request_id_of,
    routing_request,
    wants_usage,
)
from fleetgate.gateway.errors import BadRequest, GatewayError, NotFound
from fleetgate.gateway.proxy.apis import APIS, Api
from fleetgate.gateway.proxy.client import ClientWatch, SSEResponse
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.state import AppState

SHUTDOWN_FRAMES = {name: api.error_frame(503, "the gateway is shutting down; retry the request")
                   for name, api in APIS.items()}


async def proxy(request: Request, api: Api) -> Response:
    state: AppState = request.app.state.fleetgate
    headers = header_map(request.scope["headers"])
    request_id = request_id_of(headers.get("x-request-id"))
    request.state.request_id = request_id
    principal = state.keys.authenticate(headers)
    body = decode_json(await read_body(request, state.settings.max_body_bytes,
                                       state.settings.body_timeout_s,
                                       headers.get("content-length")))
    routing = routing_request(api.name, body, headers, principal.tenant)
    if routing.policy is not None and routing.policy not in state.config.policies:
        raise BadRequest(f"unknown policy {routing.policy!r} in x-fleetgate-policy; known: "
                         f"{', '.join(state.config.policies)}", param="x-fleetgate-policy")
    principal.check_policy(routing.policy)
    apis = state.models.get(routing.model)
    if apis is None:
        raise NotFound(f"The model '{routing.model}' does not exist. Available: "
                       f"{', '.join(sorted(state.models))}", param="model")
    if api.name not in apis:
        raise BadRequest(f"model '{routing.model}' is not served over {api.path} by any pool "
                         f"(it serves: {', '.join(sorted(apis))})", param="model",
                         code="unsupported_api")
    principal.check_model(routing.model)
    prepared = ProxyRequest(api, routing, body, request_id, wants_usage(body),
                            headers.get("traceparent"),
                            await state.limits.admit(principal, routing,
                                                     state.generation.fleet.snapshot),
                            principal.priority_for(headers.get("x-priority")),
                            principal.weight, allowed_models=principal.models,
                            tracestate=headers.get("tracestate"))
    watch = ClientWatch(request.receive)  # the body is read: the next receive is a disconnect
    try:
        response = await state.proxy.handle(prepared)
    except BaseException as exc:
        watch.close()
        if isinstance(exc, asyncio.CancelledError) and watch.left():
            return Response(status_code=499)  # the client left: nobody reads it
        if isinstance(exc, GatewayError) and prepared.admission is not None:
            exc.headers.update(state.limits.rate_headers(prepared.admission, final=True))
        raise
    if prepared.admission is not None:  # a stream's go with its start: not sent yet
        response.raw_headers.extend(
            (k.encode(), v.encode()) for k, v in state.limits.rate_headers(
                prepared.admission, final=not isinstance(response, SSEResponse)).items())
    if isinstance(response, SSEResponse):  # the stream watches on, and ends at shutdown
        response.watch = watch
        response.stop = getattr(request.app.state, "stop_streams", None)
        response.shutdown_frame = SHUTDOWN_FRAMES[api.name]
    else:
        watch.close()
    return response


def _handler(api: Api) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        return await proxy(request, api)

    handle.__name__ = f"{api.name}_handler"
    return handle


async def list_models(request: Request) -> Response:
    state: AppState = request.app.state.fleetgate
    principal = state.keys.authenticate(request.headers)
    created = int(state.started_at)
    parents = {name: adapter.base for ep in state.generation.fleet.endpoints  # LoRA adapters
               for name, adapter in ep.adapters.items()}  # name their base model
    data = [{"id": m, "object": "model", "created": created, "owned_by": "fleetgate",
             "root": m, "parent": parents.get(m)}
            for m in sorted(state.models)
            if principal.models is None or m in principal.models]
    return json_ok({"object": "list", "data": data})


def json_ok(body: object, status: int = 200) -> Response:
    """``body`` as JSON; numpy numbers (the live state's) as JSON numbers."""
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json")


routes = [Route(api.path, _handler(api), methods=["POST"]) for api in APIS.values()]
BY_PATH = {api.path: api for api in APIS.values()}  # the app's fast path (app.GatewayApp)
routes.append(Route("/v1/models", list_models, methods=["GET"]))
