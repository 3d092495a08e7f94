"""The running fleet of one config: endpoints, their emulated engines, live state, collector.

``Fleet`` owns what lives as long as one config: the emulated engine processes it started
for ``emulated://`` endpoints (handed over to the next generation on reload when the same
source is still configured), the ``LiveFleet`` state the router reads snapshots of, and the
collector task. The clock is injected (``time.monotonic`` by default).

May touch: backends (endpoints, emulator launcher), routing live state, asyncio tasks.
Must not touch: HTTP routes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import parse_qs, urlsplit

import aiohttp

from fleetgate.backends.emulator import EmulatorHandle, start_emulator
from fleetgate.backends.endpoints import Endpoint, fleet_endpoints
from fleetgate.config.schema import FleetConfig
from fleetgate.gateway.collector import Collector
from fleetgate.routing import EndpointInfo, LiveFleet, Snapshot, endpoint_prior

log = logging.getLogger("fleetgate.fleet")

Clock = Callable[[], float]


class Fleet:
    def __init__(self, config: FleetConfig, http: aiohttp.ClientSession, *,
                 interval_s: float = 1.0, stale_after_s: float = 10.0,
                 clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self._http = http
        self._interval = interval_s
        self._stale_after = stale_after_s
        self.endpoints: list[Endpoint] = fleet_endpoints(config)
        self.emulators: dict[str, EmulatorHandle] = {}  # keyed by endpoint source + models
        self.live: LiveFleet = self._build_live()
        self.collector: Collector | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, adopt: dict[str, EmulatorHandle] | None = None,
                    inherit: LiveFleet | None = None) -> None:
        """Start emulated engines (adopting running ones), take over what the previous
        generation's live state knew (``LiveFleet.inherit``), probe once, start collecting."""
        await self._start_emulators(adopt or {})
        self.live = self._build_live()
        if inherit is not None:
            carried = self.live.inherit(inherit, self.clock())
            log.info("live state of %d of %d endpoints carried over", carried,
                     len(self.endpoints))
        self.collector = Collector(self.endpoints, self.live, self._http, lambda: self.clock())
        await self.collector.tick()
        self._task = asyncio.create_task(self.collector.run(self._interval),
                                         name="fleetgate-collector")

    async def stop(self, keep: set[str] | None = None) -> None:
        """Stop collecting and every emulated engine except the sources in ``keep``."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        doomed = [h for key, h in self.emulators.items() if key not in (keep or set())]
        await asyncio.gather(*(h.stop() for h in doomed), return_exceptions=True)

    def snapshot(self) -> Snapshot:
        return self.live.snapshot(self.clock())

    def index(self, endpoint_id: str) -> int:
        return self.live.index[endpoint_id]

    def _build_live(self) -> LiveFleet:
        infos, priors = [], []
        for ep in self.endpoints:
            query = _query(ep.source)
            scale = 1.0 / float(query.get("speed", 1.0)) if ep.is_emulated else 1.0
            served = next(iter(ep.models.values()))
            tp = int(query.get("tp", ep.gpus_per_replica))
            priors.append(endpoint_prior(ep.accelerator, served, tp,
                                         query.get("stack", "stock"), scale, ep.max_model_len,
                                         query.get("profile")))
            infos.append(EndpointInfo(ep.id, ep.pool, ep.url, ep.engine.name, ep.accelerator,
                                      ep.vendor, ep.models, ep.labels, ep.price_per_replica_hour,
                                      ep.gpus_per_replica))
        return LiveFleet(infos, priors, stale_after_s=self._stale_after)

    async def _start_emulators(self, adopt: dict[str, EmulatorHandle]) -> None:
        wanted = {_emulator_key(ep): ep for ep in self.endpoints if ep.is_emulated}
        self.emulators = {k: h for k, h in adopt.items() if k in wanted}
        missing = [k for k in wanted if k not in self.emulators]
        results = await asyncio.gather(*(_launch(wanted[k]) for k in missing),
                                       return_exceptions=True)
        for key, result in zip(missing, results, strict=True):
            if not isinstance(result, BaseException):
                self.emulators[key] = result
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.stop(keep=set(adopt))
            raise RuntimeError(f"could not start emulated engines: {failed[0]}") from failed[0]
        self.endpoints = [replace(ep, url=self.emulators[_emulator_key(ep)].url)
                          if ep.is_emulated else ep for ep in self.endpoints]
        for key in missing:
            log.info("started emulated engine %s at %s", key, self.emulators[key].url)


def _emulator_key(ep: Endpoint) -> str:
    return f"{ep.id}|{ep.source}|{','.join(sorted(set(ep.models.values())))}"


def _query(source: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(source).query).items()}


async def _launch(ep: Endpoint) -> EmulatorHandle:
    parts = urlsplit(ep.source)
    query = _query(ep.source)
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
        max_model_len=ep.max_model_len,
    )
