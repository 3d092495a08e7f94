"""An in-process gateway on a real uvicorn server (real HTTP on a local port), for tests that
need to reach inside: drive the collector tick by tick, read live state, swap configs.

The collector's own loop is parked (a one-hour interval): tests call ``tick()`` themselves,
so nothing waits on a timer. The server is ``fleetgate serve``'s (``gateway/server.py``:
its header and shutdown deadlines).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import yaml

from fleetgate.gateway.app import create_app
from fleetgate.gateway.server import GatewayServer, server_config
from fleetgate.gateway.settings import Settings
from fleetgate.gateway.state import AppState


@asynccontextmanager
async def inproc_gateway(config: dict, tmp: Path, **settings: object
                         ) -> AsyncIterator[tuple[str, AppState]]:
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    options = Settings(config_path=path, health_interval_s=3600, **settings)
    app = create_app(options)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = GatewayServer(server_config(app, "127.0.0.1", port, "warning",
                                         options.header_timeout_s, options.shutdown_timeout_s,
                                         lifespan="on"),
                           app.state.stop_streams, options.shutdown_timeout_s)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(600):
        if server.started or task.done():
            break
        await asyncio.sleep(0.05)
    if not server.started:
        raise RuntimeError("in-process gateway did not start") from task.exception() \
            if task.done() else None
    url = f"http://127.0.0.1:{port}"
    SERVERS[url] = server
    try:
        yield url, app.state.fleetgate
    finally:
        server.should_exit = True
        await task
        SERVERS.pop(url, None)


SERVERS: dict[str, GatewayServer] = {}  # url -> its server (a test may shut it down itself)


async def tick(state: AppState, n: int = 1) -> None:
    """Run the collector n times (probes + scrapes of every endpoint)."""
    collector = state.generation.fleet.collector
    assert collector is not None
    for _ in range(n):
        await collector.tick()
