"""The running fleet of one config: endpoints, their emulated engines, live state, collector.

``Fleet`` owns what lives as long as one config: the emulated engine processes it started
for ``emulated://`` endpoints (handed over to the next generation on reload when the same
source is still configured), the ``LiveFleet`` state the router reads snapshots of, and the
collector task. The clock is injected (``time.monotonic`` by default).

An ``emulated://`` pool with ``autoscale:`` has ``max_replicas`` endpoints (*slots*,
``with_slots``), each with its URL from the start (a free port chosen once), of which only
the first ``initial_replicas`` run at start; the gateway's scaler (``gateway/autoscaler.py``)
starts and stops the others' engines (``start_replica``, ``stop_replica``), and the live
state keeps every slot that is not serving out of routing (``LiveFleet.park``). Under
``serve --workers`` the supervisor runs every slot's engine (no process owns the scaling).

``endpoints_of`` turns a pool of the config into ``routing.Endpoint`` rows and ``live_fleet``
builds their live state from the catalog priors: the simulator builds its fleet with the
same two functions. The emulator package is imported only when an ``emulated://`` endpoint
is started.

May touch: config, routing types, state, the emulator launcher, asyncio tasks.
Must not touch: HTTP routes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from fleetgate.backends.adapters import served_adapter_name
from fleetgate.backends.http1 import Http1Backend
from fleetgate.catalog.models import UNKNOWN_MODEL_PROFILE, profile_for_served_name
from fleetgate.catalog.pricing import TokenPrice
from fleetgate.config.schema import FleetConfig, PoolConfig
from fleetgate.routing import Endpoint, Snapshot
from fleetgate.routing.types import Adapter, HostedTerms
from fleetgate.state.adapters import ADAPTER_POLL_S, AdapterLoader, discover_adapters
from fleetgate.state.collector import Collector
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import Prior, endpoint_prior, hosted_prior

if TYPE_CHECKING:
    from fleetgate.emulator import EmulatorHandle

log = logging.getLogger("fleetgate.fleet")

Clock = Callable[[], float]


class Fleet:
    def __init__(self, config: FleetConfig, http: Http1Backend, *,
                 interval_s: float = 1.0, stale_after_s: float = 10.0,
                 clock: Clock = time.monotonic,
                 shared_emulators: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._shared_emulators = shared_emulators or {}  # key -> URL: run by the supervisor
        self.clock = clock
        self._http = http  # the control plane's client (backends/probes.py); not ours to close
        self.interval_s = interval_s
        self._stale_after = stale_after_s
        self.endpoints: list[Endpoint] = fleet_endpoints(config)
        self.emulators: dict[str, EmulatorHandle] = {}  # keyed by endpoint source + models
        self._parked: dict[str, str] = {}  # slots not started at start, by key: their URL
        self.live: LiveFleet = self._build_live()
        self.collector: Collector | None = None
        self._task: asyncio.Task[None] | None = None
        self.adapters: AdapterLoader | None = None  # LoRA loads (a fleet with adapters)
        self._adapter_task: asyncio.Task[None] | None = None

    async def start(self, adopt: dict[str, EmulatorHandle] | None = None,
                    inherit: LiveFleet | None = None) -> None:
        """Start emulated engines (adopting running ones), take over what the previous
        generation's live state knew (``LiveFleet.inherit``), probe once, start collecting."""
        await self._start_emulators(adopt or {})
        discover = {p.name for p in self.config.pools if p.discover_adapters}
        if discover:  # the adapters the engines list: models of their pools
            self.endpoints = await discover_adapters(self._http, self.endpoints, discover)
        self.live = self._build_live()
        for i, ep in enumerate(self.endpoints):  # slots with no engine: not routed from the start
            if emulator_key(ep) in self._parked:
                self.live.park(i, True)
        if inherit is not None:
            carried = self.live.inherit(inherit, self.clock())
            log.info("live state of %d of %d endpoints carried over", carried,
                     len(self.endpoints))
        self.collector = Collector(self.endpoints, self.live, self._http, lambda: self.clock(),
                                   before_tick=self.revive_emulators)
        await self.collector.tick()
        self._task = asyncio.create_task(self.collector.run(self.interval_s),
                                         name="fleetgate-collector")
        if self.live.adapters.enabled:
            self.adapters = AdapterLoader(self.live.adapters, self._http, lambda: self.clock())
            await self.adapters.poll()
            self._adapter_task = asyncio.create_task(self.adapters.run(ADAPTER_POLL_S),
                                                     name="fleetgate-adapters")

    async def stop(self, keep: set[str] | None = None) -> None:
        """Stop collecting and every emulated engine except the sources in ``keep``."""
        await self._stop_tasks()
        doomed = [h for key, h in self.emulators.items() if key not in (keep or set())]
        await asyncio.gather(*(h.stop() for h in doomed), return_exceptions=True)

    async def revive_emulators(self) -> None:
        """Restart every emulated engine that exited, on its old port (its URL, so the
        routing and live state stand; the collector reads its capacity again as after any
        restart). Runs before each collector tick; one that cannot start is tried again at
        the next."""
        await revive_emulators(self.emulators, self.endpoints)

    async def retire(self, keep: set[str], drain_timeout_s: float, poll_s: float = 0.1) -> None:
        """This fleet was replaced (a reload): stop collecting now, and stop its emulated
        engines not in ``keep`` once the requests it dispatched to them have ended (their
        in-flight counts stay on this fleet's live state), at most ``drain_timeout_s`` later.
        Cancelled (the gateway shuts down), it stops them at once."""
        await self._stop_tasks()
        draining = [i for i, ep in enumerate(self.endpoints)
                    if ep.is_emulated and emulator_key(ep) not in keep]
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_timeout_s
        try:
            while loop.time() < end and any(self.live.value(i, "in_flight") > 0
                                            for i in draining):
                await asyncio.sleep(poll_s)
        finally:
            await self.stop(keep)

    async def _stop_tasks(self) -> None:
        tasks = [t for t in (self._task, self._adapter_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def snapshot(self) -> Snapshot:
        return self.live.snapshot(self.clock())

    def index(self, endpoint_id: str) -> int:
        return self.live.index[endpoint_id]

    def _build_live(self) -> LiveFleet:
        return live_fleet(self.endpoints, self._stale_after)

    @property
    def scaled_here(self) -> set[str]:
        """The autoscaled emulated pools whose engines this process starts and stops."""
        if self._shared_emulators:
            return set()
        return {p.name for p in self.config.pools if _slotted(p)}

    async def start_replica(self, i: int) -> None:
        """Start the engine of slot ``i`` (an autoscaled emulated pool's) at its URL."""
        ep = self.endpoints[i]
        key = emulator_key(ep)
        if key in self.emulators and self.emulators[key].returncode is None:
            return
        self.emulators[key] = await _launch(ep, urlsplit(ep.url).port or 0)
        log.info("started replica %s at %s", ep.id, ep.url)

    async def stop_replica(self, i: int) -> None:
        """Stop the engine of slot ``i`` (its requests have ended: the scaler drained it)."""
        handle = self.emulators.pop(emulator_key(self.endpoints[i]), None)
        if handle is not None:
            await handle.stop()
            log.info("stopped replica %s", self.endpoints[i].id)

    async def _start_emulators(self, adopt: dict[str, EmulatorHandle]) -> None:
        shared = self._shared_emulators
        parked = self._parked = self._parked_slots(adopt) if not shared else {}
        wanted = {emulator_key(ep): ep for ep in self.endpoints
                  if ep.is_emulated and emulator_key(ep) not in shared
                  and emulator_key(ep) not in parked}
        dead = [h for k, h in adopt.items() if k in wanted and h.returncode is not None]
        await asyncio.gather(*(h.stop() for h in dead))  # a reload starts them anew
        self.emulators = {k: h for k, h in adopt.items() if k in wanted and h not in dead}
        missing = [wanted[k] for k in wanted if k not in self.emulators]
        try:
            self.emulators.update(await launch_emulators(missing))
        except RuntimeError:
            await self.stop(keep=set(adopt))
            raise
        urls = {**shared, **parked, **{k: h.url for k, h in self.emulators.items()}}
        self.endpoints = [replace(ep, url=urls[emulator_key(ep)]) if ep.is_emulated else ep
                          for ep in self.endpoints]

    def _parked_slots(self, adopt: dict[str, EmulatorHandle]) -> dict[str, str]:
        """The slots not started now (past a pool's ``initial_replicas``, and not running
        from the previous generation), each with the URL its engine will have."""
        out: dict[str, str] = {}
        for pool in self.config.pools:
            if not _slotted(pool):
                continue
            slots = [ep for ep in self.endpoints if ep.pool == pool.name]
            for k, ep in enumerate(slots):
                key = emulator_key(ep)
                if k >= initial_replicas(pool) and key not in adopt:
                    out[key] = f"http://127.0.0.1:{_free_port()}"
        return out


async def launch_emulators(endpoints: list[Endpoint]) -> dict[str, EmulatorHandle]:
    """One emulated engine per distinct emulated source among ``endpoints``, keyed as a
    ``Fleet`` keys them (what ``serve --workers`` hands its workers). All start or none:
    when one fails the others are stopped and ``RuntimeError`` says why."""
    wanted = {emulator_key(ep): ep for ep in endpoints if ep.is_emulated}
    results = await asyncio.gather(*(_launch(ep) for ep in wanted.values()),
                                   return_exceptions=True)
    started = {k: r for k, r in zip(wanted, results, strict=True)
               if not isinstance(r, BaseException)}
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(h.stop() for h in started.values()), return_exceptions=True)
        raise RuntimeError(f"could not start emulated engines: {failed[0]}") from failed[0]
    for key, handle in started.items():
        log.info("started emulated engine %s at %s", key, handle.url)
    return started


async def revive_emulators(emulators: dict[str, EmulatorHandle],
                           endpoints: list[Endpoint]) -> None:
    """Restart, in place in ``emulators``, each engine that exited, on its old port."""
    for key, handle in list(emulators.items()):
        if handle.returncode is None:
            continue
        ep = next(e for e in endpoints if e.is_emulated and emulator_key(e) == key)
        try:
            fresh = await _launch(ep, urlsplit(handle.url).port or 0)
        except Exception as exc:
            log.warning("emulated engine %s exited and could not be restarted: %s", ep.id, exc)
            continue
        await handle.stop()  # closes its pipe
        emulators[key] = fresh
        log.warning("emulated engine %s had exited (code %s); restarted at %s", ep.id,
                    handle.returncode, fresh.url)


def live_fleet(endpoints: list[Endpoint], stale_after_s: float = 10.0) -> LiveFleet:
    """Live state for ``endpoints``, each starting from its catalog prior (the gateway and
    the simulator build it the same way)."""
    return LiveFleet(endpoints, [prior_of(ep) for ep in endpoints], stale_after_s=stale_after_s)


def prior_of(ep: Endpoint) -> Prior:
    """An endpoint's prior; an emulated one's ``speed``, ``tp``, ``stack`` and ``profile``
    come from its ``emulated://`` URL (and its profile is the one the emulator runs). A
    served name the catalog does not know gets the conservative profile, with one warning
    per name."""
    if ep.hosted is not None:  # a hosted API: its configured latency, not a GPU's
        return hosted_prior(ep.hosted.tpot_s, ep.hosted.max_concurrency, ep.max_model_len)
    query = _query(ep.source)
    scale = 1.0 / float(query.get("speed", 1.0)) if ep.is_emulated else 1.0
    served = next(iter(ep.models.values()))
    tp = int(query.get("tp", ep.gpus_per_replica))
    profile = query.get("profile") or (profile_for_served_name(served).name
                                       if ep.is_emulated else None)
    prior = endpoint_prior(ep.accelerator, served, tp, query.get("stack", "stock"), scale,
                           ep.max_model_len, profile)
    if prior.profile == UNKNOWN_MODEL_PROFILE.name and served not in _WARNED_UNKNOWN:
        _WARNED_UNKNOWN.add(served)
        log.warning("model %r is not in the catalog: its endpoints start from a conservative "
                    "profile (the largest catalog model's costs) until the engine reports its "
                    "capacity and the router has learned its speed", served)
    return prior


_WARNED_UNKNOWN: set[str] = set()


def endpoints_of(pool: PoolConfig) -> list[Endpoint]:
    """The endpoints one pool of the config describes, ``<pool>-<n>`` in order. A LoRA
    adapter is one more model of each: its public name -> what the engine serves it as."""
    adapters = pool_adapters(pool)
    models = {**pool.models, **{name: served_adapter_name(pool.engine, pool.models[a.base], name)
                                for name, a in adapters.items()}}
    return [
        Endpoint(id=f"{pool.name}-{i}", pool=pool.name,
                 url="" if src.startswith("emulated://") else src, engine=pool.engine,
                 accelerator=pool.accelerator, vendor=pool.vendor, models=dict(models),
                 labels=dict(pool.labels), price_per_gpu_hour=pool.price_per_gpu_hour,
                 gpus_per_replica=pool.gpus_per_replica, source=src, runtime=pool.runtime,
                 max_model_len=pool.max_model_len, apis=pool.served_apis, api_key=pool.api_key,
                 hosted=hosted_terms(pool), adapters=adapters,
                 max_adapters=pool.max_adapters if adapters or pool.discover_adapters else 0,
                 load_adapters=pool.load_adapters)
        for i, src in enumerate(pool.endpoints)
    ]


def pool_adapters(pool: PoolConfig) -> dict[str, Adapter]:
    """A pool's LoRA adapters as routing sees them."""
    return {a.name: Adapter(a.name, pool.adapter_base(a), a.path, pool.adapter_preloaded(a))
            for a in pool.adapters}


def hosted_terms(pool: PoolConfig) -> HostedTerms | None:
    """A per-token pool's price, cap and expected latency (None for a self-hosted pool)."""
    price, latency = pool.price_per_mtok, pool.expected_latency
    if price is None or latency is None or pool.max_concurrency is None:
        return None
    return HostedTerms(TokenPrice(price.input, price.output), pool.max_concurrency,
                       latency.ttft_ms / 1000, latency.tpot_ms / 1000)


def fleet_endpoints(config: FleetConfig) -> list[Endpoint]:
    """Every pool's endpoints, an autoscaled emulated pool's slots included."""
    return [ep for pool in config.pools
            for ep in endpoints_of(with_slots(pool) if _slotted(pool) else pool)]


def with_slots(pool: PoolConfig) -> PoolConfig:
    """An autoscaled pool with ``max_replicas`` endpoints: the configured ones first, then
    copies of its first source told apart by a ``#slotN`` fragment."""
    scale = pool.autoscale
    if scale is None:
        return pool
    if len(pool.endpoints) > scale.max_replicas:
        raise ValueError(f"pool {pool.name}: {len(pool.endpoints)} endpoints but "
                         f"autoscale.max_replicas is {scale.max_replicas}")
    extra = [f"{pool.endpoints[0].split('#', 1)[0]}#slot{k}"
             for k in range(len(pool.endpoints), scale.max_replicas)]
    return pool.model_copy(update={"endpoints": [*pool.endpoints, *extra]})


def initial_replicas(pool: PoolConfig) -> int:
    """The replicas an autoscaled pool starts with: its configured endpoints, within its
    floor and ceiling."""
    scale = pool.autoscale
    if scale is None:
        return len(pool.endpoints)
    return min(max(len(pool.endpoints), scale.min_replicas), scale.max_replicas)


def _slotted(pool: PoolConfig) -> bool:
    """An autoscaled pool of emulated engines: the gateway starts and stops its replicas."""
    return pool.autoscale is not None and all(
        src.startswith("emulated://") for src in pool.endpoints)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def emulator_key(ep: Endpoint) -> str:
    key = f"{ep.id}|{ep.source}|{','.join(base_served_models(ep))}"
    if ep.adapters:  # what it starts with and may do (a change restarts it)
        key += "|lora:" + ",".join(sorted(f"{a.name}={a.path}" for a in ep.adapters.values()
                                          if a.preload)) + f"|{ep.max_adapters}|{ep.load_adapters}"
    return key


def base_served_models(ep: Endpoint) -> list[str]:
    """The names an endpoint's engine serves its base models under (adapters aside)."""
    return sorted({served for public, served in ep.models.items() if public not in ep.adapters})


def emulated_lora_modules(ep: Endpoint) -> dict[str, str]:
    """The adapters an emulated engine starts with (``--lora-modules``): the preloaded ones,
    a made-up hub id for one without a path."""
    return {a.name: a.path or f"emulated/{a.name}" for a in ep.adapters.values() if a.preload}


def _query(source: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(source).query).items()}


async def _launch(ep: Endpoint, port: int = 0) -> EmulatorHandle:
    from fleetgate.emulator import start_emulator  # only a fleet with emulated:// needs it

    parts = urlsplit(ep.source)
    query = _query(ep.source)
    return await start_emulator(
        engine=parts.netloc,
        gpu=parts.path.strip("/"),
        served_models=base_served_models(ep),
        profile=query.get("profile"),
        speed=float(query.get("speed", 1.0)),
        stack=query.get("stack", "stock"),
        tp=int(query.get("tp", ep.gpus_per_replica)),
        max_queued_requests=int(query["max_queued_requests"])
        if "max_queued_requests" in query else None,
        max_model_len=ep.max_model_len,
        port=port,
        enable_lora=bool(ep.adapters),
        lora_modules=emulated_lora_modules(ep),
        max_loras=ep.max_adapters or None,
        runtime_lora=ep.load_adapters,
    )
