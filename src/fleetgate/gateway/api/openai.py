"""OpenAI-compatible routes: chat, completions, responses, embeddings, messages; ``/v1/models``.

The five proxy routes share one handler: parse (``parse.py``), authenticate, check the
policy and the model (404 for a model nobody serves, 400 for one served but not over this
API), admit against the caller's limits, then hand a ``ProxyRequest`` to the proxy service.
They are plain Starlette routes inside the FastAPI app: no per-request model validation on
the hot path. ``/openapi.json`` still documents their bodies (``schemas.OPENAI_BODIES``,
added by ``app.py``).

May touch: starlette, gateway services. Must not touch: backends or routing internals.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from fleetgate.gateway.api.parse import (
    decode_json,
    read_body,
    request_id_of,
    routing_request,
    wants_usage,
)
from fleetgate.gateway.errors import BadRequest, NotFound
from fleetgate.gateway.proxy.apis import APIS, Api
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.state import AppState


async def _proxy(request: Request, api: Api) -> Response:
    state: AppState = request.app.state.fleetgate
    request_id = request_id_of(request.headers.get("x-request-id"))
    request.state.request_id = request_id
    principal = state.keys.authenticate(request.headers)
    body = decode_json(await read_body(request, state.settings.max_body_bytes,
                                       state.settings.body_timeout_s))
    routing = replace(routing_request(api.name, body, request), tenant=principal.tenant)
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
                            request.headers.get("traceparent"),
                            await state.limits.admit(principal),
                            principal.priority_for(request.headers.get("x-priority")),
                            principal.weight)
    response = await unless_client_leaves(request, state.proxy.handle(prepared))
    stop: asyncio.Event | None = getattr(request.app.state, "stop_streams", None)
    if isinstance(response, StreamingResponse) and stop is not None:
        response.body_iterator = _until_shutdown(response.body_iterator, stop, api)
    return response


async def _until_shutdown(frames: AsyncIterable[Any], stop: asyncio.Event,
                          api: Api) -> AsyncIterator[Any]:
    """A stream that ends at the server's shutdown deadline (``gateway/server.py``): at its
    next frame after it, with the API's error event (and ``[DONE]``); the relay is closed
    (the attempt cancelled, the engine's request aborted). One flag test per frame."""
    it = aiter(frames)
    try:
        async for frame in it:
            if stop.is_set():
                yield api.error_frame(503, "the gateway is shutting down; retry the request")
                return
            yield frame
    finally:
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


async def unless_client_leaves(request: Request, work: Awaitable[Response]) -> Response:
    """``work`` (the proxied exchange), cancelled when the client disconnects before it
    returns: a non-streamed answer (or a stream before its first byte) is not computed for
    nobody, charged and logged as served, nor does it keep its concurrency slot. The attempt
    ends through its ``cancelled()`` path (the relay closes the upstream connection, so the
    engine aborts the request). The body has been read: the next ``receive`` is the
    disconnect. A stream, once returned, watches for it itself."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request itself was cancelled (shutdown)
        task.cancel()
        gone.cancel()
        raise
    if task.done():
        gone.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return Response(status_code=499)  # nobody reads it


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _handler(api: Api) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        return await _proxy(request, api)

    handle.__name__ = f"{api.name}_handler"
    return handle


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


routes = [Route(api.path, _handler(api), methods=["POST"]) for api in APIS.values()]
routes.append(Route("/v1/models", list_models, methods=["GET"]))
