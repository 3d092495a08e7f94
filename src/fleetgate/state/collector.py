"""The collector: probes health and scrapes ``/metrics`` of every endpoint, in the background.

One ``tick()`` visits all endpoints concurrently with short timeouts and writes the results
into ``LiveFleet``; ``run(interval)`` ticks forever. Never on the request path: a slow or
dead engine delays nothing but its own update. Tests call ``tick()`` directly with an
injected clock instead of waiting for the loop.

What one visit costs is what a fleet of thousands of engines pays every second, so a visit
does as little as it can (BENCHMARKS.md, "Collector at scale"):

- **The scrape is the liveness check of a ready endpoint.** A ready endpoint is probed
  every ``PROBE_EVERY``-th tick (staggered over the fleet) and scraped every tick; a scrape
  that fails is followed by a probe at once, so an engine that dies is noticed in the same
  tick as before. Endpoints that are not ready, and engines without metrics, are probed
  every tick (and scraped only after a passing probe).
- **Only the series the router reads are parsed.** The engines send their whole
  exposition (63 KB for vLLM: its ``/metrics`` route is prometheus-fastapi-instrumentator's,
  which ignores prometheus_client's ``?name[]=`` filter, as a real vLLM showed in
  ``tests/engines``); the parser finds each wanted family with ``str.find`` and reads
  only its lines (``backends/metrics.py``: ~23 µs for the 63 KB with the last scrape's
  places as hints, 27 µs before each family was read in one function on the bytes).
- **The lean client.** Probes, scrapes and capacity reads go out on ``backends/http1.py``:
  the control plane's one client (``backends/probes.py``; handed in, and closed by whoever
  made it: the gateway's lifespan), one after the other on one kept-alive connection per
  endpoint. When a ready endpoint's probe and scrape are both due, they are pipelined
  (``Http1Backend.get_pair``: both requests in one write, the answers in order), so the
  probe costs a small answer's parse, not a whole exchange (~15 µs a visit, amortised,
  as a separate exchange); its outcome is the same as the probe and then the scrape: a
  probe that fails drops the scrape, as if it had not been asked for.

A scrape that fails or does not parse leaves the previous load in place (it expires as
stale after ``LiveFleet.stale_after_s``) and counts in ``scrape_errors``.

Capacity (KV tokens, batch cap, context: ``backends/capacity.py``) is read at the first
successful contact, in the same tick and before the endpoint is marked ready, so the router
never routes on the catalog's guess when the engine can tell; again after the engine was
unreachable (a restart or reconnect) or its token counter went backwards (a restart between
two probes); and every ``CAPACITY_REFRESH_S`` in case. A read that finds nothing is retried
after ``CAPACITY_RETRY_S``. A context the config sets for the pool stays the upper bound.

May touch: numpy, backends (relay client, health probe, metrics parser), the
scraping shard, routing live state. Must not touch: HTTP routes, the router.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from fleetgate.backends.capacity import EngineCapacity, read_capacity
from fleetgate.backends.http1 import Http1Backend
from fleetgate.backends.metrics import (
    EngineLoad,
    MetricsParseError,
    parse_engine_metrics,
)
from fleetgate.backends.probes import ProbeResult, probe, probe_then_get
from fleetgate.backends.relay import Timeouts, UpstreamError, UpstreamResponse
from fleetgate.routing import Endpoint
from fleetgate.state.live import LiveFleet
from fleetgate.state.shard import ScrapeShard

log = logging.getLogger("fleetgate.collector")

SCRAPE_TIMEOUT_S = 2.0
PROBE_EVERY = 5  # ticks between probes of a ready endpoint whose scrapes answer
MAX_SCRAPE_BYTES = 16 * 1024 * 1024
VISITS_AT_ONCE = 256  # visits started together; more start in batches (``_visit``)
SPREAD_S = 0.25  # at most this long to start a tick's batches
STEPS = 4  # while replicas share the scraping: a full tick and 3 takeover steps per interval
_TIMEOUTS = Timeouts(connect=SCRAPE_TIMEOUT_S, read=SCRAPE_TIMEOUT_S, total=SCRAPE_TIMEOUT_S)
CAPACITY_RETRY_S = 30.0
CAPACITY_REFRESH_S = 600.0


class Collector:
    def __init__(self, endpoints: Sequence[Endpoint], live: LiveFleet,
                 http: Http1Backend, clock: Callable[[], float],
                 before_tick: Callable[[], Awaitable[None]] | None = None) -> None:
        self._before_tick = before_tick  # the fleet's: restart dead emulated engines
        self._endpoints = list(endpoints)
        self._live = live
        self._http = http  # the control plane's client: probes, scrapes, capacity reads
        self._clock = clock
        self.scrape_errors: Counter[str] = Counter()
        self.ticks = 0
        self.capacity: dict[str, EngineCapacity] = {}  # endpoint id -> its last report
        self._capacity_due = [0.0] * len(self._endpoints)  # clock time of the next read
        # where each metric family was in the endpoint's last scrape (``parse_engine_metrics``)
        self._hints: list[dict[bytes, int]] = [{} for _ in self._endpoints]
        self.shard: ScrapeShard | None = None  # set when replicas share the scraping
        self.visits = 0  # endpoint visits (probe and/or scrape) this replica made

    async def tick(self, full: bool = True) -> None:
        """Visit the endpoints due (all of them, or this replica's share: ``state/shard.py``);
        ``full=False`` is the quarter-interval step that only takes over a dead peer's."""
        if full and self._before_tick is not None:
            await self._before_tick()
        shard = self.shard
        if shard is None:
            due = list(range(len(self._endpoints))) if full else []
        else:
            await shard.pull()  # the peers' rows as of now: a takeover judged on fresh ones
            due = np.flatnonzero(shard.due(self._clock(), full)).tolist()
        await self._visit(due)
        if shard is not None and due:
            await shard.publish()
        if full:
            self._live.tick(self._clock())
            self.ticks += 1

    async def _visit(self, due: list[int]) -> None:
        """Visit these endpoints, all at once up to ``VISITS_AT_ONCE``; past that, the
        visits start in batches spread over ``SPREAD_S`` at most, so that a tick of
        thousands never holds the event loop (requests, the replica sync) for its whole
        length: at 10,000 endpoints one ``gather`` held it long enough for the replica's
        share in the store to lapse (BENCHMARKS.md, "Collector at scale")."""
        eps, tasks = self._endpoints, []
        batches = range(0, len(due), VISITS_AT_ONCE)
        pause = min(SPREAD_S / len(batches), 0.05) if len(batches) > 1 else 0.0
        create = asyncio.get_running_loop().create_task
        try:
            for start in batches:
                if start:
                    await asyncio.sleep(pause)
                tasks += [create(self._one(i, eps[i])) for i in due[start:start + VISITS_AT_ONCE]]
            # each awaited in turn, not gathered: gather's callback and result slot per
            # visit cost ~2 us (a done task's await is ~free); a failed visit raises as there
            for task in tasks:
                await task
        except asyncio.CancelledError:  # as gather: cancelled, the visits are too
            for task in tasks:
                task.cancel()
            raise

    async def run(self, interval_s: float) -> None:
        """Full ticks on fixed deadlines (a slow tick delays the next one, never the whole
        schedule: a peer judges this replica's rows by their age); while replicas share the
        scraping, takeover steps at the quarter-intervals between them that are not past,
        so a dead peer's endpoints are visited within ``TAKEOVER`` + 1/4 of an interval
        plus the visits (at half steps, the rows of a replica killed at 10,000 endpoints
        reached 2.02 intervals, BENCHMARKS.md)."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            last, due = due, max(due + interval_s, loop.time())  # behind: from now, no burst
            if self.shard is not None:
                for k in range(1, STEPS):
                    step = last + k * interval_s / STEPS
                    if step > loop.time() and step < due:
                        await asyncio.sleep(step - loop.time())
                        await self._guarded(full=False)
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._guarded(full=True)

    async def _guarded(self, full: bool) -> None:
        try:
            await self.tick(full=full)
        except Exception:  # a collector bug must not end collection
            log.exception("collector tick failed")

    def peer_capacity(self, i: int, capacity: EngineCapacity) -> None:
        """What endpoint ``i`` reported to the replica that scraped it (``state/shard.py``):
        this replica need not ask the engine itself until the next refresh."""
        self.capacity[self._endpoints[i].id] = capacity
        self._capacity_due[i] = max(self._capacity_due[i], self._clock() + CAPACITY_REFRESH_S)

    async def _one(self, i: int, ep: Endpoint) -> None:
        if not ep.url:
            return
        self.visits += 1
        # On one kept-alive connection (a socket per endpoint, not two): one after the other,
        # or pipelined when a ready endpoint's probe is due with its scrape.
        ready = self._live.stats[i].health.state == "ready"
        probed = (not ready or not ep.spec.metrics_path
                  or (self.ticks + i) % PROBE_EVERY == 0)
        health: ProbeResult | None
        if probed and ready and ep.spec.metrics_path:  # both due: pipelined, one exchange
            health, load = await self._probe_and_scrape(ep, i)
            ok = health.ok
        else:
            health = await self._probe(ep) if probed else None
            ok = health is None or health.ok
            load = await self._scrape(ep, i) if ok else None
        if load is None and health is None:  # the scrape failed: is the engine still up?
            health = await self._probe(ep)
            ok = health.ok
        capacity = None
        if ok and self._clock() >= self._capacity_due[i]:
            capacity = await read_capacity(self._http, ep.url, ep.spec, SCRAPE_TIMEOUT_S,
                                           ep.auth_headers)
        now = self._clock()
        self._capacity_seen(i, ep, now, ok, load, capacity)
        if health is not None and self._live.on_probe(i, now, health.ok, health.detail):
            log.info("endpoint %s is %s (%s)", ep.id, self._live.stats[i].health.state,
                     health.detail)
        if load is not None:
            self._live.on_scrape(i, now, load.waiting, load.running, load.kv_usage,
                                 load.generation_tokens_total, load.gen_throughput)
        if self.shard is not None:
            health_now = self._live.stats[i].health
            self.shard.visited(i, now, health_now.state, health_now.detail, load,
                               self.capacity.get(ep.id))

    async def _probe(self, ep: Endpoint) -> ProbeResult:
        return await probe(self._http, ep.url, ep.spec, SCRAPE_TIMEOUT_S, ep.auth_headers)

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

    async def _probe_and_scrape(self, ep: Endpoint, i: int,
                                ) -> tuple[ProbeResult, EngineLoad | None]:
        """The probe and the scrape of a ready endpoint, pipelined on its connection: the
        same results as ``_probe`` and then, if it passed, ``_scrape``."""
        headers = {"accept": "text/plain", **(ep.auth_headers or {})}
        health, answer = await probe_then_get(self._http, ep.url, ep.spec,
                                              ep.url + (ep.spec.metrics_path or ""), headers,
                                              SCRAPE_TIMEOUT_S, ep.auth_headers)
        return health, None if answer is None else await self._scraped(ep, i, answer)

    async def _scrape(self, ep: Endpoint, i: int) -> EngineLoad | None:
        if not ep.spec.metrics_path:
            return None
        url = ep.url + ep.spec.metrics_path
        headers = {"accept": "text/plain", **(ep.auth_headers or {})}
        try:
            resp = await self._http.get(url, headers, _TIMEOUTS)
        except UpstreamError as exc:
            self._scrape_failed(ep, exc)
            return None
        return await self._scraped(ep, i, resp)

    async def _scraped(self, ep: Endpoint, i: int,
                       answer: UpstreamResponse | UpstreamError) -> EngineLoad | None:
        """The load in a scrape's answer; None (counted in ``scrape_errors``) when it failed
        or does not parse."""
        if isinstance(answer, UpstreamError):
            self._scrape_failed(ep, answer)
            return None
        try:
            body = await answer.read()
            if answer.status != 200:
                raise MetricsParseError(f"HTTP {answer.status}")
            if len(body) > MAX_SCRAPE_BYTES:
                raise MetricsParseError(f"{len(body)} bytes of metrics")
            return parse_engine_metrics(body, ep.engine, self._hints[i])
        except (UpstreamError, MetricsParseError) as exc:
            self._scrape_failed(ep, exc)
            return None

    def _scrape_failed(self, ep: Endpoint, exc: Exception) -> None:
        self.scrape_errors[ep.id] += 1
        log.debug("scrape of %s failed: %s", ep.id, exc)
