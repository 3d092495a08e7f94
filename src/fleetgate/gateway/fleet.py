"""The running fleet: endpoints from the config, their emulated engines, health and in-flight.

``Fleet`` owns what lives as long as one config: the emulated engine processes it started
for ``emulated://`` endpoints, the health-probe task, and each endpoint's mutable live state
(health, consecutive failures, in-flight count). The router never sees this object: it gets
an immutable ``Snapshot`` from ``snapshot()``.

Health states: ``pending`` until the first probe answers, ``ready`` after a successful probe,
``not_ready`` after ``FAILS_TO_NOT_READY`` failed probes in a row, or at once when a relay
attempt cannot even connect (a refused port is unambiguous). A ready probe brings it back.

May touch: backends (probes, emulator launcher), asyncio tasks. Must not touch: HTTP routes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from urllib.parse import parse_qs, urlsplit

import httpx

from fleetgate.backends.emulator import EmulatorHandle, start_emulator
from fleetgate.backends.endpoints import Endpoint, fleet_endpoints
from fleetgate.backends.health import probe
from fleetgate.config.schema import FleetConfig
from fleetgate.routing.types import EndpointView, Health, Snapshot

log = logging.getLogger("fleetgate.fleet")

FAILS_TO_NOT_READY = 2


@dataclass(slots=True)
class LiveEndpoint:
    endpoint: Endpoint
    health: Health = "pending"
    failed_probes: int = 0
    last_probe: str = ""
    in_flight: int = 0

    def view(self) -> EndpointView:
        ep = self.endpoint
        return EndpointView(
            id=ep.id, pool=ep.pool, url=ep.url, engine=ep.engine.name,
            accelerator=ep.accelerator, vendor=ep.vendor, models=ep.models,
            price_per_replica_hour=ep.price_per_replica_hour, health=self.health,
            in_flight=self.in_flight,
        )


class Fleet:
    def __init__(self, config: FleetConfig, http: httpx.AsyncClient,
                 health_interval_s: float = 1.0) -> None:
        self.config = config
        self._http = http
        self._interval = health_interval_s
        self._emulators: list[EmulatorHandle] = []
        self._task: asyncio.Task[None] | None = None
        self.live: dict[str, LiveEndpoint] = {
            ep.id: LiveEndpoint(ep) for ep in fleet_endpoints(config)
        }

    async def start(self) -> None:
        await self._start_emulators()
        await self.probe_all()
        self._task = asyncio.create_task(self._health_loop(), name="fleetgate-health")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(h.stop() for h in self._emulators), return_exceptions=True)
        self._emulators.clear()

    def snapshot(self) -> Snapshot:
        return Snapshot(tuple(le.view() for le in self.live.values()))

    def ready_count(self) -> int:
        return sum(1 for le in self.live.values() if le.health == "ready")

    def connect_failed(self, endpoint_id: str) -> None:
        le = self.live.get(endpoint_id)
        if le is not None and le.health != "not_ready":
            log.warning("endpoint %s refused a connection: marked not ready", endpoint_id)
            le.health, le.last_probe = "not_ready", "connect refused (relay)"

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(le) for le in self.live.values()))

    async def _probe(self, le: LiveEndpoint) -> None:
        if not le.endpoint.url:
            return
        result = await probe(self._http, le.endpoint.url, le.endpoint.engine)
        le.last_probe = result.detail
        if result.ok:
            if le.health != "ready":
                log.info("endpoint %s is ready", le.endpoint.id)
            le.health, le.failed_probes = "ready", 0
            return
        le.failed_probes += 1
        if le.failed_probes >= FAILS_TO_NOT_READY and le.health != "not_ready":
            log.warning("endpoint %s not ready: %s", le.endpoint.id, result.detail)
            le.health = "not_ready"

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.probe_all()
            except Exception:  # a probe bug must not end health checking
                log.exception("health probe round failed")

    async def _start_emulators(self) -> None:
        pending = [le for le in self.live.values() if le.endpoint.is_emulated]
        results = await asyncio.gather(*(_launch(le.endpoint) for le in pending),
                                       return_exceptions=True)
        self._emulators = [h for h in results if not isinstance(h, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.stop()
            raise RuntimeError(f"could not start emulated engines: {failed[0]}") from failed[0]
        for le, handle in zip(pending, self._emulators, strict=True):
            le.endpoint = replace(le.endpoint, url=handle.url)
            log.info("started %s for %s at %s", le.endpoint.source, le.endpoint.id, handle.url)


async def _launch(ep: Endpoint) -> EmulatorHandle:
    parts = urlsplit(ep.source)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return await start_emulator(
        engine=parts.netloc,
        gpu=parts.path.strip("/"),
        served_models=sorted(set(ep.models.values())),
        profile=query.get("profile"),
        speed=float(query.get("speed", 1.0)),
        stack=query.get("stack", "stock"),
        tp=int(query.get("tp", ep.gpus_per_replica)),
        max_queued_requests=int(query["max_queued_requests"])
        if "max_queued_requests" in query else None,
    )
