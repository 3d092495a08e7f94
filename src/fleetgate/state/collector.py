"""The collector: probes health and scrapes ``/metrics`` of every endpoint, in the background.

One ``tick()`` probes and scrapes all endpoints concurrently (per endpoint: the probe, then
the scrape if the probe passed) with short timeouts and writes the results into
``LiveFleet``; ``run(interval)`` ticks forever. Never on the request path:
a slow or dead engine delays nothing but its own update. Tests call ``tick()`` directly with
an injected clock instead of waiting for the loop.

A scrape that fails or does not parse leaves the previous load in place (it expires as
stale after ``LiveFleet.stale_after_s``) and counts in ``scrape_errors``. Engines without a
metrics endpoint (``openai``) are only probed.

May touch: aiohttp, backends (health probe, metrics parser), routing live state.
Must not touch: HTTP routes, the router.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence

import aiohttp

from fleetgate.backends.metrics import (
    EngineLoad,
    MetricsParseError,
    parse_engine_metrics,
)
from fleetgate.backends.probes import probe
from fleetgate.routing import Endpoint
from fleetgate.state.live import LiveFleet

log = logging.getLogger("fleetgate.collector")

SCRAPE_TIMEOUT_S = 2.0


class Collector:
    def __init__(self, endpoints: Sequence[Endpoint], live: LiveFleet,
                 http: aiohttp.ClientSession, clock: Callable[[], float]) -> None:
        self._endpoints = list(endpoints)
        self._live = live
        self._http = http
        self._clock = clock
        self.scrape_errors: Counter[str] = Counter()
        self.ticks = 0

    async def tick(self) -> None:
        await asyncio.gather(*(self._one(i, ep) for i, ep in enumerate(self._endpoints)))
        self._live.expire_scrapes(self._clock())
        self.ticks += 1

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.tick()
            except Exception:  # a collector bug must not end collection
                log.exception("collector tick failed")

    async def _one(self, i: int, ep: Endpoint) -> None:
        if not ep.url:
            return
        # One after the other on one kept-alive connection (a socket per endpoint, not two);
        # an engine that fails its probe is not scraped (no second timeout to wait for).
        health = await probe(self._http, ep.url, ep.spec, SCRAPE_TIMEOUT_S)
        load = await self._scrape(ep) if health.ok else None
        now = self._clock()
        if self._live.on_probe(i, now, health.ok, health.detail):
            log.info("endpoint %s is %s (%s)", ep.id, self._live.stats[i].health.state,
                     health.detail)
        if load is not None:
            self._live.on_scrape(i, now, load.waiting, load.running, load.kv_usage,
                                 load.generation_tokens_total, load.gen_throughput)

    async def _scrape(self, ep: Endpoint) -> EngineLoad | None:
        if not ep.spec.metrics_path:
            return None
        try:
            async with self._http.get(ep.url + str(ep.spec.metrics_path),
                                      timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S),
                                      headers={"accept": "text/plain"}) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise MetricsParseError(f"HTTP {resp.status}")
            return parse_engine_metrics(text, ep.engine)
        except (TimeoutError, aiohttp.ClientError, MetricsParseError) as exc:
            self.scrape_errors[ep.id] += 1
            log.debug("scrape of %s failed: %s", ep.id, exc)
            return None
