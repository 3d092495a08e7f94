"""The collector: probes health and scrapes ``/metrics`` of every endpoint, in the background.

One ``tick()`` probes and scrapes all endpoints concurrently (per endpoint: the probe, then
the scrape if the probe passed) with short timeouts and writes the results into
``LiveFleet``; ``run(interval)`` ticks forever. Never on the request path:
a slow or dead engine delays nothing but its own update. Tests call ``tick()`` directly with
an injected clock instead of waiting for the loop.

A scrape that fails or does not parse leaves the previous load in place (it expires as
stale after ``LiveFleet.stale_after_s``) and counts in ``scrape_errors``. Engines without a
metrics endpoint (``openai``) are only probed.

Capacity (KV tokens, batch cap, context: ``backends/capacity.py``) is read at the first
successful contact, in the same tick and before the endpoint is marked ready, so the router
never routes on the catalog's guess when the engine can tell; again after the engine was
unreachable (a restart or reconnect) or its token counter went backwards (a restart between
two probes); and every ``CAPACITY_REFRESH_S`` in case. A read that finds nothing is retried
after ``CAPACITY_RETRY_S``. A context the config sets for the pool stays the upper bound.

May touch: aiohttp, backends (health probe, metrics parser), routing live state.
Must not touch: HTTP routes, the router.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import aiohttp

from fleetgate.backends.capacity import EngineCapacity, read_capacity
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
CAPACITY_RETRY_S = 30.0
CAPACITY_REFRESH_S = 600.0


class Collector:
    def __init__(self, endpoints: Sequence[Endpoint], live: LiveFleet,
                 http: aiohttp.ClientSession, clock: Callable[[], float],
                 before_tick: Callable[[], Awaitable[None]] | None = None) -> None:
        self._before_tick = before_tick  # the fleet's: restart dead emulated engines
        self._endpoints = list(endpoints)
        self._live = live
        self._http = http
        self._clock = clock
        self.scrape_errors: Counter[str] = Counter()
        self.ticks = 0
        self.capacity: dict[str, EngineCapacity] = {}  # endpoint id -> its last report
        self._capacity_due = [0.0] * len(self._endpoints)  # clock time of the next read

    async def tick(self) -> None:
        if self._before_tick is not None:
            await self._before_tick()
        await asyncio.gather(*(self._one(i, ep) for i, ep in enumerate(self._endpoints)))
        self._live.tick(self._clock())
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
        capacity = None
        if health.ok and self._clock() >= self._capacity_due[i]:
            capacity = await read_capacity(self._http, ep.url, ep.spec, SCRAPE_TIMEOUT_S)
        now = self._clock()
        self._capacity_seen(i, ep, now, health.ok, load, capacity)
        if self._live.on_probe(i, now, health.ok, health.detail):
            log.info("endpoint %s is %s (%s)", ep.id, self._live.stats[i].health.state,
                     health.detail)
        if load is not None:
            self._live.on_scrape(i, now, load.waiting, load.running, load.kv_usage,
                                 load.generation_tokens_total, load.gen_throughput)

    def _capacity_seen(self, i: int, ep: Endpoint, now: float, ok: bool,
                       load: EngineLoad | None, capacity: EngineCapacity | None) -> None:
        """Apply a capacity report and schedule the next read (module docstring)."""
        if not ok:
            self._capacity_due[i] = 0.0  # whatever answers next may be a new engine
            return
        last_total = self._live.stats[i].last_gen_total
        if (load is not None and load.generation_tokens_total is not None
                and load.generation_tokens_total < last_total):
            self._capacity_due[i] = 0.0  # counters restarted: so did the engine
        if capacity is None:
            return
        if capacity.empty:
            self._capacity_due[i] = now + CAPACITY_RETRY_S
            return
        self._capacity_due[i] = now + CAPACITY_REFRESH_S
        context = capacity.max_model_len
        if context is not None and ep.max_model_len:
            context = min(context, ep.max_model_len)
        self.capacity[ep.id] = capacity
        if self._live.on_capacity(i, capacity.kv_capacity_tokens, capacity.max_batch, context):
            log.info("endpoint %s reports KV %s tokens, batch cap %s, context %s", ep.id,
                     capacity.kv_capacity_tokens, capacity.max_batch, context)

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
