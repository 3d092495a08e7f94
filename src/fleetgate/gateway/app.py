"""The ASGI app: ``create_app(settings, overrides)`` and the lifespan that owns every resource.

The lifespan loads the config, opens the pooled relay client and the probe/scrape client
(both aiohttp, apart), starts the fleet (emulated engines, health loop), builds the router
and the chat service, and hangs them on ``app.state.fleetgate``; on shutdown it closes
them in reverse. Nothing is global: tests build as many apps as they like, with
``overrides`` replacing parts (``config``, ``backend``, ``router``, ``otel_env``: the
``OTEL_*`` mapping tracing reads instead of ``os.environ``). Telemetry (``telemetry/``) is
built here too and hangs on ``app.state.telemetry``; its tracer provider is flushed and
shut down with the app.

Errors: typed ``GatewayError``s map to the OpenAI envelope; an unknown route or method gets
the envelope too; any other exception is logged with its trace and answered with a plain
500 envelope. A client never sees a stack trace or an HTML page.

May touch: everything in gateway/, and the layers below it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetgate.backends.probes import background_session
from fleetgate.backends.relay import AiohttpBackend, Backend, Timeouts
from fleetgate.config import ConfigError, FleetConfig, default_config_path, load_config
from fleetgate.gateway.api import admin, health, openai, workers
from fleetgate.gateway.auth import KeyTable
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import GatewayError, envelope, error_response, json_error
from fleetgate.gateway.limits import LimitEnforcer, LimitsObserver
from fleetgate.gateway.proxy.observer import CompositeObserver
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.gateway.settings import Settings
from fleetgate.gateway.state import AppState, build_generation
from fleetgate.gateway.telemetry import build_telemetry
from fleetgate.gateway.telemetry import routes as telemetry_routes
from fleetgate.state.store import create_stores, new_replica_id
from fleetgate.state.sync import PeerSync

log = logging.getLogger("fleetgate")


def create_app(settings: Settings, overrides: dict[str, Any] | None = None) -> Starlette:
    overrides = overrides or {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            state = await _start(app, settings, overrides, stack)
            _announce(state.config, state)
            _install_sighup(state)
            yield

    return Starlette(
        routes=[*openai.routes, *health.routes, *admin.routes, *workers.routes,
                *telemetry_routes.routes],
        lifespan=lifespan,
        middleware=[Middleware(AdminGate)],
        exception_handlers={
            GatewayError: _gateway_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )


async def _start(app: Starlette, settings: Settings, overrides: dict[str, Any],
                 stack: AsyncExitStack) -> AppState:
    """Build every resource; ``stack`` closes them in reverse order on shutdown."""
    config: FleetConfig = overrides.get("config") or load_config(
        settings.config_path or default_config_path())
    backend: Backend = overrides.get("backend") or AiohttpBackend()
    stack.push_async_callback(backend.close)
    http = background_session()
    stack.push_async_callback(http.close)
    stores = create_stores(settings.redis_url, prefix=settings.redis_prefix)
    stack.push_async_callback(stores.close)
    gen = await build_generation(config, settings, http, overrides.get("router"))
    ref: list[AppState] = []
    stack.push_async_callback(lambda: (ref[0].generation if ref else gen).fleet.stop())

    def current() -> Generation:
        return ref[0].generation if ref else gen

    telemetry = build_telemetry(settings, lambda: current().fleet, overrides.get("otel_env"))
    stack.push_async_callback(telemetry.close)
    app.state.telemetry = telemetry
    limits = LimitEnforcer(stores.limits)
    timeouts = Timeouts(settings.connect_timeout_s, settings.read_timeout_s,
                        settings.total_timeout_s)
    chat = ProxyService(current, backend, timeouts, DecisionLog(),
                       observer=CompositeObserver(telemetry.observer, LimitsObserver(limits)))
    state = AppState(settings, config, gen, chat, http, time.time(),
                     frozenset(config.public_models()), asyncio.Lock(), KeyTable(config.auth),
                     limits, stores=stores)
    ref.append(state)
    app.state.fleetgate = state
    sync = PeerSync(stores.shared, new_replica_id(), lambda: current().fleet,
                    settings.sync_interval_s)
    state.sync = sync
    for job in (sync.run(), _expire_registrations(state)):
        task = asyncio.create_task(job)
        stack.callback(task.cancel)
    return state


async def _expire_registrations(state: AppState) -> None:
    """Remove workers whose heartbeat lapsed (checked every second)."""
    while True:
        await asyncio.sleep(1.0)
        try:
            await state.deregister(now=time.monotonic())
        except Exception:
            log.exception("could not remove expired workers")


class AdminGate:
    """``/admin/*`` needs an admin key once the config has keys (pure ASGI: no overhead
    for other paths)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/admin"):
            state: AppState | None = getattr(scope["app"].state, "fleetgate", None)
            if state is not None:
                try:
                    state.keys.authorize_admin(Headers(scope=scope))
                except GatewayError as exc:
                    await error_response(exc)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


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
    store = "redis" if state.settings.redis_url else "in-memory (one replica)"
    log.info("state store: %s; replica %s", store, state.sync.replica_id if state.sync else "-")
    if state.keys.open:
        log.warning("NO API KEYS CONFIGURED: this gateway is open to anyone who can reach it, "
                    "admin API included")


def _request_id_header(request: Request) -> dict[str, str]:
    rid = getattr(request.state, "request_id", None) or request.headers.get("x-request-id")
    return {"x-request-id": rid} if rid else {}


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc, _request_id_header(request))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail if exc.status_code != 404 else f"no route for {request.url.path}"
    return json_error(exc.status_code, envelope(exc.status_code, str(message)),
                      {**(exc.headers or {}), **_request_id_header(request)})


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    body = envelope(500, "internal gateway error; see the gateway log for this request id")
    return json_error(500, body, _request_id_header(request))
