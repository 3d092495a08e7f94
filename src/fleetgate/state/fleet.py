"""The running fleet of one config: endpoints, their emulated engines, live state, collector.

``Fleet`` owns what lives as long as one config: the emulated engine processes it started
for ``emulated://`` endpoints (handed over to the next generation on reload when the same
source is still configured), the ``LiveFleet`` state the router reads snapshots of, and the
collector task. The clock is injected (``time.monotonic`` by default).

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
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import aiohttp

from fleetgate.catalog.models import UNKNOWN_MODEL_PROFILE, profile_for_served_name
from fleetgate.config.schema import FleetConfig, PoolConfig
from fleetgate.routing import Endpoint, Snapshot
from fleetgate.state.collector import Collector
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import Prior, endpoint_prior

if TYPE_CHECKING:
    from fleetgate.emulator import EmulatorHandle

log = logging.getLogger("fleetgate.fleet")

Clock = Callable[[], float]


class Fleet:
    def __init__(self, config: FleetConfig, http: aiohttp.ClientSession, *,
                 interval_s: float = 1.0, stale_after_s: float = 10.0,
                 clock: Clock = time.monotonic,
                 shared_emulators: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._shared_emulators = shared_emulators or {}  # key -> URL: run by the supervisor
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
        self.collector = Collector(self.endpoints, self.live, self._http, lambda: self.clock(),
                                   before_tick=self.revive_emulators)
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
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        draining = [i for i, ep in enumerate(self.endpoints)
                    if ep.is_emulated and _emulator_key(ep) not in keep]
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_timeout_s
        try:
            while loop.time() < end and any(self.live.value(i, "in_flight") > 0
                                            for i in draining):
                await asyncio.sleep(poll_s)
        finally:
            await self.stop(keep)

    def snapshot(self) -> Snapshot:
        return self.live.snapshot(self.clock())

    def index(self, endpoint_id: str) -> int:
        return self.live.index[endpoint_id]

    def _build_live(self) -> LiveFleet:
        return live_fleet(self.endpoints, self._stale_after)

    async def _start_emulators(self, adopt: dict[str, EmulatorHandle]) -> None:
        shared = self._shared_emulators
        wanted = {_emulator_key(ep): ep for ep in self.endpoints
                  if ep.is_emulated and _emulator_key(ep) not in shared}
        dead = [h for k, h in adopt.items() if k in wanted and h.returncode is not None]
        await asyncio.gather(*(h.stop() for h in dead))  # a reload starts them anew
        self.emulators = {k: h for k, h in adopt.items() if k in wanted and h not in dead}
        missing = [wanted[k] for k in wanted if k not in self.emulators]
        try:
            self.emulators.update(await launch_emulators(missing))
        except RuntimeError:
            await self.stop(keep=set(adopt))
            raise
        urls = {**shared, **{k: h.url for k, h in self.emulators.items()}}
        self.endpoints = [replace(ep, url=urls[_emulator_key(ep)]) if ep.is_emulated else ep
                          for ep in self.endpoints]


async def launch_emulators(endpoints: list[Endpoint]) -> dict[str, EmulatorHandle]:
    """One emulated engine per distinct emulated source among ``endpoints``, keyed as a
    ``Fleet`` keys them (what ``serve --workers`` hands its workers). All start or none:
    when one fails the others are stopped and ``RuntimeError`` says why."""
    wanted = {_emulator_key(ep): ep for ep in endpoints if ep.is_emulated}
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
        ep = next(e for e in endpoints if e.is_emulated and _emulator_key(e) == key)
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
    """The endpoints one pool of the config describes, ``<pool>-<n>`` in order."""
    return [
        Endpoint(id=f"{pool.name}-{i}", pool=pool.name,
                 url="" if src.startswith("emulated://") else src, engine=pool.engine,
                 accelerator=pool.accelerator, vendor=pool.vendor, models=dict(pool.models),
                 labels=dict(pool.labels), price_per_gpu_hour=pool.price_per_gpu_hour,
                 gpus_per_replica=pool.gpus_per_replica, source=src, runtime=pool.runtime,
                 max_model_len=pool.max_model_len, apis=pool.served_apis)
        for i, src in enumerate(pool.endpoints)
    ]


def fleet_endpoints(config: FleetConfig) -> list[Endpoint]:
    return [ep for pool in config.pools for ep in endpoints_of(pool)]


def _emulator_key(ep: Endpoint) -> str:
    return f"{ep.id}|{ep.source}|{','.join(sorted(set(ep.models.values())))}"


def _query(source: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(source).query).items()}


async def _launch(ep: Endpoint, port: int = 0) -> EmulatorHandle:
    from fleetgate.emulator import start_emulator  # only a fleet with emulated:// needs it

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
        port=port,
    )
