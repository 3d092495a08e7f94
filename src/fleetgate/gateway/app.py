"""The app: ``create_app(settings, overrides)`` (FastAPI) and the lifespan that owns every resource.

The lifespan loads the config, opens the pooled relay client and, apart from it, the control
plane's one client (probes, scrapes, capacity reads, adapter calls: ``backends/probes.py``;
both ``backends/http1.py``), starts the fleet (emulated engines, health loop), builds the
router and the proxy service, and hangs them on ``app.state.fleetgate``; on shutdown it
closes them in reverse. Nothing is global: tests build as many apps as they like, with a typed
``Overrides`` replacing parts. Telemetry (``telemetry/``) is built here too and hangs on
``app.state.telemetry``; its tracer provider is flushed and shut down with the app.

FastAPI serves ``/openapi.json`` and ``/docs`` (behind the admin key when auth is on, as
the admin API they describe). A WebSocket upgrade gets the OpenAI envelope too
(``refuse_websocket``). The admin, registration, health and metrics
routes are typed FastAPI routes (their models are in the document). The five OpenAI proxy
routes are plain Starlette routes inside the same app, so the hot path reads the raw body
and answers directly, with no per-request validation; ``_openapi`` adds their request
bodies (``schemas.OPENAI_BODIES``) to the document for schema-driven clients and fuzzers.

Errors: typed ``GatewayError``s map to the OpenAI envelope; a request FastAPI cannot
validate gets a 400 envelope; an unknown route or method gets the envelope too; any other
exception is logged with its trace and answered with a plain 500 envelope. A client never
sees a stack trace or an HTML page.

May touch: everything in gateway/, and the layers below it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetgate import __version__
from fleetgate.backends.http1 import Http1Backend
from fleetgate.backends.relay import Backend, Timeouts
from fleetgate.config import ConfigError, FleetConfig, default_config_path, load_config
from fleetgate.gateway.api import admin, health, openai, workers
from fleetgate.gateway.api.parse import request_id_of
from fleetgate.gateway.api.schemas import OPENAI_BODIES, ErrorEnvelope, ModelList
from fleetgate.gateway.auth import KeyTable
from fleetgate.gateway.autoscaler import GatewayScaler
from fleetgate.gateway.costs import CostLedger
from fleetgate.gateway.dashboard import router as dashboard_router
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import (
    Forbidden,
    GatewayError,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
    envelope,
    error_response,
    json_error,
)
from fleetgate.gateway.limits import LimitEnforcer, LimitsObserver
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.observer import CompositeObserver
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.gateway.proxy.shadow import ShadowMirror
from fleetgate.gateway.settings import Settings
from fleetgate.gateway.state import AppState, build_generation, served_models
from fleetgate.gateway.telemetry import build_telemetry
from fleetgate.gateway.telemetry import routes as telemetry_routes
from fleetgate.gateway.telemetry.scaling import ScalingCollector
from fleetgate.gateway.telemetry.spend import SpendCollector
from fleetgate.routing import Router
from fleetgate.state.store import Stores, create_stores, new_replica_id
from fleetgate.state.sync import PeerSync

log = logging.getLogger("fleetgate")


@dataclass(frozen=True, slots=True)
class Overrides:
    """Parts a test (or an embedding program) supplies instead of the defaults."""

    config: FleetConfig | None = None  # instead of reading settings.config_path
    backend: Backend | None = None  # the relay client (e.g. backends.fake.FakeBackend)
    router: Router | None = None  # instead of building one from the config's policies
    otel_env: Mapping[str, str] | None = None  # the OTEL_* variables, instead of os.environ


def create_app(settings: Settings, overrides: Overrides | None = None) -> FastAPI:
    parts = overrides or Overrides()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            state = await _start(app, settings, parts, stack)
            _announce(state.config, state)
            _install_sighup(state)
            yield

    app = GatewayApp(title="fleetgate", version=__version__, lifespan=lifespan,
                     description="OpenAI-compatible inference gateway for mixed AMD + NVIDIA "
                                 "GPU fleets: routes by live latency, queue depth and "
                                 "$/GPU-hour.",
                     docs_url="/docs", redoc_url=None, openapi_url="/openapi.json",
                     middleware=[Middleware(AdminGate)], redirect_slashes=False,
                     exception_handlers={
                         GatewayError: _gateway_error,
                         RequestValidationError: _invalid_request,
                         HTTPException: _http_error,
                         Exception: _unexpected_error,
                     })
    app.router.routes.extend(openai.routes)
    for router in (health.router, admin.router, workers.router, telemetry_routes.router,
                   dashboard_router):
        app.include_router(router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.state.stop_streams = asyncio.Event()  # set at the shutdown deadline (server.py)
    return app


class GatewayApp(FastAPI):
    """FastAPI with a raw-ASGI fast path for the five OpenAI proxy routes.

    A ``POST`` to one of their paths goes straight to its handler, past FastAPI's and
    Starlette's per-request layers (FastAPI's own telemetry check, the error and exception
    middlewares, the router, the admin gate). Those wrap ``send`` too, so every frame of a
    stream crossed two more closures: about a quarter of the gateway's CPU on a stream
    (BENCHMARKS.md, issue 17). The same handler is still a Starlette route (other
    methods, a root path: the normal stack answers), and errors end the same way: a
    ``GatewayError`` as its envelope, anything else logged and a 500 envelope."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            api = openai.BY_PATH.get(scope["path"])
            if api is not None:
                scope["app"] = self
                await _proxy_route(scope, receive, send, api)
                return
        if scope["type"] == "websocket":
            await refuse_websocket(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """The gateway serves no WebSocket: an upgrade is refused like any other request, with
    the OpenAI envelope (405 on an API path, which takes POST; else 404), through the ASGI
    denial-response extension (uvicorn's default ``websockets`` implementation has it);
    a server without it can only close the handshake (403, empty)."""
    path = scope.get("path", "")
    if path in openai.BY_PATH:
        status, message = 405, f"{path} takes POST with a JSON body, not a WebSocket"
    else:
        status, message = 404, f"no route for {path[:200]} (the gateway serves no WebSocket)"
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    rid = request_id_of(Headers(scope=scope).get("x-request-id"))
    body = orjson.dumps(envelope(status, message))
    await send({"type": "websocket.http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"x-request-id", rid.encode())]})
    await send({"type": "websocket.http.response.body", "body": body})


async def _proxy_route(scope: Scope, receive: Receive, send: Send, api: Any) -> None:
    request = Request(scope, receive, send)
    try:
        response = await openai.proxy(request, api)
    except GatewayError as exc:
        response = await _gateway_error(request, exc)
    except Exception as exc:
        response = await _unexpected_error(request, exc)
    try:
        await response(scope, receive, send)
    except Exception:  # the response has started: nothing left to tell the client
        log.exception("error while sending the answer to %s", request.url.path)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the OpenAI proxy routes with their request bodies."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description,
                      routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(ErrorEnvelope.model_json_schema(ref_template=REF)["$defs"])
    schemas["ErrorEnvelope"] = _no_defs(ErrorEnvelope.model_json_schema(ref_template=REF))
    error = {"description": "OpenAI error envelope",
             "content": {"application/json": {"schema": {"$ref": REF.format(
                 model="ErrorEnvelope")}}}}
    for name, model in OPENAI_BODIES.items():
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        doc["paths"][APIS[name].path] = {"post": {
            "tags": ["openai"], "summary": f"{name} (relayed to a pool serving it)",
            "operationId": f"{name}_create",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": REF.format(model=model.__name__)}}}},
            "responses": {"200": {"description": "the engine's answer (JSON, or SSE when "
                                  "stream is true)"},
                          **{str(s): error for s in (400, 401, 404, 413, 429, 502, 503, 504)}},
        }}
    models = ModelList.model_json_schema(ref_template=REF)
    schemas.update(models.pop("$defs", {}))
    schemas["ModelList"] = models
    doc["paths"]["/v1/models"] = {"get": {
        "tags": ["openai"], "summary": "public models", "operationId": "models_list",
        "responses": {"200": {"description": "the models", "content": {"application/json": {
            "schema": {"$ref": REF.format(model="ModelList")}}}}, "401": error}}}
    for operations in doc["paths"].values():  # invalid input is a 400 envelope, not a 422
        for operation in operations.values():
            if operation.get("responses", {}).pop("422", None) is not None:
                operation["responses"]["400"] = error
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    app.openapi_schema = doc
    return doc


REF = "#/components/schemas/{model}"


def _no_defs(schema: dict[str, Any]) -> dict[str, Any]:
    schema.pop("$defs", None)
    return schema


async def _start(app: FastAPI, settings: Settings, overrides: Overrides,
                 stack: AsyncExitStack) -> AppState:
    """Build every resource; ``stack`` closes them in reverse order on shutdown."""
    config: FleetConfig = overrides.config or load_config(
        settings.config_path or default_config_path())
    backend: Backend = overrides.backend or Http1Backend()
    stack.push_async_callback(backend.close)
    http = Http1Backend(max_idle_per_host=2)  # the control plane's one client
    stack.push_async_callback(http.close)
    stores = create_stores(settings.redis_url, prefix=settings.redis_prefix,
                           local_socket=settings.store_socket)
    stack.push_async_callback(stores.close)
    gen = await build_generation(config, settings, http, overrides.router)
    ref: list[AppState] = []
    stack.push_async_callback(lambda: (ref[0].generation if ref else gen).fleet.stop())

    def current() -> Generation:
        return ref[0].generation if ref else gen

    telemetry = build_telemetry(settings, lambda: current().fleet, overrides.otel_env)
    stack.push_async_callback(telemetry.close)
    app.state.telemetry = telemetry
    limits = LimitEnforcer(stores.limits)
    timeouts = Timeouts(settings.connect_timeout_s, settings.read_timeout_s,
                        settings.total_timeout_s)
    shadow = ShadowMirror(current, backend, timeouts, lambda: current().fleet.clock())
    stack.push_async_callback(shadow.drain)
    replica_id = new_replica_id()
    proxy = ProxyService(current, backend, timeouts, DecisionLog(replica=replica_id),
                         observer=CompositeObserver(telemetry.observer, LimitsObserver(limits),
                                                    shadow))
    state = AppState(settings, config, gen, proxy, http, time.time(),
                     served_models(gen.fleet.config, gen.fleet.endpoints), asyncio.Lock(),
                     KeyTable(config.auth),
                     limits, stores=stores, ledger=telemetry.ledger)
    state.shadow = shadow
    stack.push_async_callback(state.close_retiring)
    ref.append(state)
    telemetry.registry.register(SpendCollector(lambda: ref[0] if ref else None))
    app.state.fleetgate = state
    sync = PeerSync(stores.shared, replica_id, lambda: current().fleet,
                    settings.sync_interval_s)
    state.sync = sync
    costs = CostPublisher(stores, telemetry.ledger, replica_id)
    state.scaler = GatewayScaler(lambda: current().fleet, proxy.flow.waiting_by_model,
                                 proxy.flow.refused_by_model)
    telemetry.registry.register(ScalingCollector(state.scaler))
    for job in (sync.run(), _fleet_sync(state, costs, settings.sync_interval_s),
                state.scaler.run(settings.scale_interval_s)):
        task = asyncio.create_task(job)
        stack.callback(task.cancel)
    stack.push_async_callback(costs.publish)  # the last charges, before the store closes
    return state


COSTS_TTL_S = 35 * 86400.0  # a replica's cost snapshot outlives it by this much
COSTS_REFRESH_S = 3600.0  # republished unchanged this often (its TTL restarts)


@dataclass(slots=True)
class CostPublisher:
    """Publishes this replica's ledger snapshot to the shared store when it changed."""

    stores: Stores
    ledger: CostLedger
    replica_id: str
    _version: int = -1
    _at: float = 0.0

    async def publish(self, force: bool = False) -> None:
        version, now = self.ledger.version(), time.monotonic()
        if not force and version == self._version and now - self._at < COSTS_REFRESH_S:
            return
        await self.stores.shared.publish_blob("costs", self.replica_id,
                                              self.ledger.snapshot().encode(), COSTS_TTL_S)
        if not getattr(self.stores.shared, "degraded", False):
            self._version, self._at = version, now


async def _fleet_sync(state: AppState, costs: CostPublisher, interval_s: float) -> None:
    """Every sync interval (at most 1 s): adopt the fleet's worker registrations (and expire
    lapsed ones), and publish this replica's costs when they changed."""
    every = min(1.0, interval_s)
    while True:
        await asyncio.sleep(every)
        try:
            await state.sync_registrations(time.monotonic())
        except Exception:
            log.exception("could not sync the fleet's registrations")
        try:
            await costs.publish()
        except Exception:
            log.exception("could not publish this replica's costs")


DOC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/openapi.json"})


class AdminGate:
    """``/admin/*``, ``/metrics`` (tenants and their spend) and the API document
    (``DOC_PATHS``: it lists every admin path) need an admin key once the config has keys;
    all stay open on an open gateway. An admin request that
    changes something (not GET/HEAD) must come from no browser origin or the gateway's own
    (a web page's cross-origin POST is refused, open mode included), a body must be
    ``application/json`` (415: a ``text/plain`` POST needs no CORS preflight) and at most
    ``ADMIN_MAX_BODY_BYTES`` (413), read here before the route sees it. Pure ASGI: no
    overhead for other paths."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith("/admin") or path == "/metrics" or path in DOC_PATHS:
            state: AppState | None = getattr(scope["app"].state, "fleetgate", None)
            headers = Headers(scope=scope)
            try:
                if state is not None:
                    state.keys.authorize_admin(headers)
                if path.startswith("/admin") and scope["method"] not in ("GET", "HEAD"):
                    deadline = state.settings.body_timeout_s if state is not None else 30.0
                    receive = await _admin_body(headers, receive, deadline)
            except GatewayError as exc:
                await error_response(exc)(scope, receive, send)
                return
        await self.app(scope, receive, send)


ADMIN_MAX_BODY_BYTES = 64 * 1024


async def _admin_body(headers: Headers, receive: Receive, timeout_s: float) -> Receive:
    """Check an admin write (``AdminGate``) and read its body (within ``timeout_s``: 408);
    returns a ``receive`` that replays it."""
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != headers.get("host"):
        raise Forbidden(f"admin requests from another origin ({origin[:100]}) are refused")
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > ADMIN_MAX_BODY_BYTES:
        raise PayloadTooLarge(f"admin request body exceeds {ADMIN_MAX_BODY_BYTES} bytes")
    body, more = b"", True
    try:
        async with asyncio.timeout(timeout_s):
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > ADMIN_MAX_BODY_BYTES:
                    raise PayloadTooLarge(
                        f"admin request body exceeds {ADMIN_MAX_BODY_BYTES} bytes")
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {timeout_s:g} s") from None
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if body and kind != "application/json":
        raise UnsupportedMediaType(f"admin request bodies must be application/json, "
                                   f"not {kind[:100] or 'unspecified'}")
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _install_sighup(state: AppState) -> None:
    """SIGHUP re-reads the config, like POST /admin/reload (errors are logged)."""

    async def reload() -> None:
        try:
            await state.reload()
        except ConfigError as exc:
            log.error("reload rejected, still serving the old config: %s", exc)
        except Exception:
            log.exception("reload failed, still serving the old config")

    try:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(reload()))
    except (NotImplementedError, RuntimeError, ValueError):
        log.info("SIGHUP reload unavailable here; use POST /admin/reload")


def _announce(config: FleetConfig, state: AppState) -> None:
    endpoints = sum(len(p.endpoints) for p in config.pools)
    log.info("fleet: %d pools, %d endpoints, models %s", len(config.pools), endpoints,
             ", ".join(config.public_models()))
    store = ("redis" if state.settings.redis_url else
             "the supervisor's (serve --workers)" if state.settings.store_socket else
             "in-memory (one replica)")
    log.info("state store: %s; replica %s", store, state.sync.replica_id if state.sync else "-")
    if state.keys.open:
        log.warning("NO API KEYS CONFIGURED: this gateway is open to anyone who can reach it, "
                    "admin API included")


def _request_id_header(request: Request) -> dict[str, str]:
    rid = getattr(request.state, "request_id", None)
    if rid is None and (given := request.headers.get("x-request-id")) is not None:
        rid = request_id_of(given)  # the one policy: bounded, a safe charset
    return {"x-request-id": rid} if rid else {}


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc, _request_id_header(request))


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = f"invalid request: {where + ': ' if where else ''}{first.get('msg', 'invalid')}"
    return json_error(400, envelope(400, message, param=where or None),
                      _request_id_header(request))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail if exc.status_code != 404 else f"no route for {request.url.path}"
    return json_error(exc.status_code, envelope(exc.status_code, str(message)),
                      {**(exc.headers or {}), **_request_id_header(request)})


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    body = envelope(500, "internal gateway error; see the gateway log for this request id")
    return json_error(500, body, _request_id_header(request))
