"""The ASGI app: ``create_app(settings, overrides)`` and the lifespan that owns every resource.

The lifespan loads the config, opens the pooled relay client (aiohttp) and the probe client
(httpx), starts the fleet (emulated engines, health loop), builds the router and the chat
service, and hangs them on ``app.state.fleetgate``; on shutdown it closes them in reverse.
Nothing is global: tests build as many apps as they like, with ``overrides`` replacing
parts (``config``, ``backend``, ``router``, ``otel_env``: the ``OTEL_*`` mapping tracing reads
instead of ``os.environ``). Telemetry (``telemetry/``) is built here too and hangs on
``app.state.telemetry``; its tracer provider is flushed and shut down with the app.

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
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from fleetgate.backends.relay import AiohttpBackend, Backend, Timeouts
from fleetgate.config import ConfigError, FleetConfig, default_config_path, load_config
from fleetgate.gateway.api import admin, health, openai
from fleetgate.gateway.chat import ChatService
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import GatewayError, envelope, error_response, json_error
from fleetgate.gateway.settings import Settings
from fleetgate.gateway.state import AppState, build_generation
from fleetgate.gateway.telemetry import Telemetry, build_telemetry
from fleetgate.gateway.telemetry import routes as telemetry_routes

log = logging.getLogger("fleetgate")


def create_app(settings: Settings, overrides: dict[str, Any] | None = None) -> Starlette:
    overrides = overrides or {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        config: FleetConfig = overrides.get("config") or load_config(
            settings.config_path or default_config_path())
        backend: Backend = overrides.get("backend") or AiohttpBackend()
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=256))
        state: AppState | None = None
        telemetry: Telemetry | None = None
        try:
            gen = await build_generation(config, settings, http, overrides.get("router"))
            timeouts = Timeouts(settings.connect_timeout_s, settings.read_timeout_s,
                                settings.total_timeout_s)
            telemetry = build_telemetry(
                settings, lambda: (state.generation if state else gen).fleet,
                overrides.get("otel_env"))
            app.state.telemetry = telemetry
            chat = ChatService(lambda: state.generation if state else gen, backend, timeouts,
                               DecisionLog(), observer=telemetry.observer)
            state = AppState(settings, config, gen, chat, http, time.time(),
                             frozenset(config.public_models()), asyncio.Lock())
            app.state.fleetgate = state
            _announce(config)
            _install_sighup(state)
            yield
        finally:
            if state is not None:
                await state.generation.fleet.stop()
            if telemetry is not None:
                await telemetry.close()
            await backend.close()
            await http.aclose()

    return Starlette(
        routes=[*openai.routes, *health.routes, *admin.routes, *telemetry_routes.routes],
        lifespan=lifespan,
        exception_handlers={
            GatewayError: _gateway_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )


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


def _announce(config: FleetConfig) -> None:
    endpoints = sum(len(p.endpoints) for p in config.pools)
    log.info("fleet: %d pools, %d endpoints, models %s", len(config.pools), endpoints,
             ", ".join(config.public_models()))
    if config.auth is None or not config.auth.keys:
        log.warning("NO API KEYS CONFIGURED: this gateway is open to anyone who can reach it")


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
