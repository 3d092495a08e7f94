"""What one running gateway holds, and the reload that swaps a whole generation at once.

``AppState`` is built by the lifespan in ``app.py`` and hung on ``app.state.fleetgate``;
never global. ``generation`` (config + fleet + router) is replaced as one reference on
reload: requests already routed finish on the generation they started with.

Reload: load and validate the file, build every policy pipeline, start the new fleet
(adopting the emulated engines that are still configured, taking over the live state of
the endpoints that are still there, probing every endpoint once), then swap. The old fleet
stops collecting at once; the emulated engines the new one did not adopt (a removed pool)
stop once the requests still running on them have ended, at most ``total_timeout_s`` later
(``Fleet.retire``), so a reload never fails requests in flight. Any failure before the swap
leaves the running generation serving and is reported with its YAML paths.

May touch: config loader, routing builders, gateway services. Must not touch: HTTP routes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from fleetgate.backends.http1 import Http1Backend
from fleetgate.config import ConfigError, FleetConfig, default_config_path, load_config
from fleetgate.gateway.auth import KeyTable
from fleetgate.gateway.autoscaler import GatewayScaler
from fleetgate.gateway.costs import CostLedger
from fleetgate.gateway.limits import LimitEnforcer
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.gateway.proxy.shadow import ShadowMirror
from fleetgate.gateway.registrations import (
    Registration,
    RegistrationBody,
    decode,
    encode,
    endpoint_id,
    merge,
)
from fleetgate.gateway.settings import Settings
from fleetgate.routing import Endpoint, PolicyError, Router, build_router
from fleetgate.routing.policies import FallbackRoutes
from fleetgate.state.fleet import Fleet
from fleetgate.state.store import MemoryLimits, Stores
from fleetgate.state.sync import PeerSync

log = logging.getLogger("fleetgate")


@dataclass(slots=True)
class AppState:
    settings: Settings
    config: FleetConfig
    generation: Generation
    proxy: ProxyService
    http: Http1Backend  # the control plane's one client: probes, scrapes, capacity, adapters
    started_at: float
    models: dict[str, frozenset[str]]  # public model -> the APIs some pool serves it over
    reload_lock: asyncio.Lock
    keys: KeyTable = field(default_factory=lambda: KeyTable(None))
    limits: LimitEnforcer = field(default_factory=lambda: LimitEnforcer(MemoryLimits()))
    registrations: dict[str, Registration] = field(default_factory=dict)  # by engine URL
    stores: Stores | None = None
    sync: PeerSync | None = None
    shadow: ShadowMirror | None = None  # mirrors to candidate pools; GET /admin/shadow
    retiring: set[asyncio.Task[None]] = field(default_factory=set)  # replaced fleets draining
    ledger: CostLedger | None = None  # this replica's charges (telemetry's ledger)
    scaler: GatewayScaler | None = None  # autoscale: pools; GET /admin/scaling
    _rejected: list[tuple[str, RegistrationBody]] | None = None  # shared set that failed

    async def reload(self) -> FleetConfig:
        """Re-read the config file; raises ConfigError (nothing changed) when it is bad."""
        async with self.reload_lock:
            path = self.settings.config_path or default_config_path()
            config = load_config(path)
            await self._apply(config)
            log.info("reloaded %s: %d pools, policies %s", path, len(config.pools),
                     ", ".join(config.policies))
            return config

    async def register(self, body: RegistrationBody, now: float) -> tuple[str, bool]:
        """Add (or refresh) a worker's endpoint; returns its id and whether it is new. The
        registration goes to the shared store too (after the fleet accepted it), where the
        other replicas pick it up."""
        async with self.reload_lock:
            known = self.registrations.get(body.url)
            self.registrations[body.url] = Registration(body, now + body.ttl_s)
            new = known is None or known.body != body
            if new:
                try:
                    await self._apply(self.config)
                except Exception:
                    if known is None:
                        self.registrations.pop(body.url, None)
                    else:
                        self.registrations[body.url] = known
                    raise
            if self.stores is not None:
                await self.stores.shared.put_registration(body.url, encode(body), body.ttl_s,
                                                          time.time())
            return str(endpoint_id(self.generation.fleet.config, body.url)), new

    async def deregister(self, endpoint: str | None = None, now: float | None = None) -> bool:
        """Remove one endpoint by id (from the shared store too), or every registration
        expired at ``now`` (this replica's own clock: used while the store is down)."""
        async with self.reload_lock:
            fleet_config = self.generation.fleet.config
            doomed = [url for url, reg in self.registrations.items()
                      if endpoint_id(fleet_config, url) == endpoint
                      or (now is not None and reg.expires_at <= now)]
            for url in doomed:
                log.info("endpoint %s leaves the fleet", endpoint_id(fleet_config, url))
                del self.registrations[url]
                if endpoint is not None and self.stores is not None:
                    await self.stores.shared.drop_registration(url)
            if doomed:
                await self._apply(self.config)
            return bool(doomed)

    async def sync_registrations(self, now: float) -> bool:
        """Adopt the fleet's registrations from the shared store (every sync interval);
        True when the generation was rebuilt. While the store is down (or without one),
        expire this replica's own registrations by their TTL instead."""
        shared = self.stores.shared if self.stores is not None else None
        if shared is None:
            return await self.deregister(now=now)
        async with self.reload_lock:
            found = await shared.registrations()
            if getattr(shared, "degraded", False):
                expire = True
            else:
                expire = False
                wanted: dict[str, Registration] = {}
                for reg in found:
                    try:
                        body = decode(reg.record)
                    except ValidationError:
                        log.warning("ignoring a malformed registration of %s", reg.key[:200])
                        continue
                    wanted[body.url] = Registration(body, now + reg.ttl_left_s)
                order = [(url, r.body) for url, r in wanted.items()]
                if order == [(url, r.body) for url, r in self.registrations.items()]:
                    self.registrations = wanted  # heartbeats: new expiry times only
                    return False
                if order == self._rejected:
                    return False
                old = self.registrations
                self.registrations = wanted
                try:
                    await self._apply(self.config)
                except Exception as exc:
                    self.registrations = old
                    self._rejected = order
                    log.error("the fleet's registrations make this replica's fleet invalid; "
                              "keeping the previous one: %s", exc)
                    return False
                self._rejected = None
                gone = sorted(set(old) - set(wanted))
                log.info("registrations from the fleet: %d (%s)", len(wanted),
                         f"left: {', '.join(gone)}" if gone else "joined or changed")
                return True
        return await self.deregister(now=now) if expire else False

    async def _apply(self, config: FleetConfig) -> None:
        effective = merge(config, list(self.registrations.values()))
        old = self.generation
        gen = await build_generation(effective, self.settings, self.http, previous=old.fleet)
        self.generation, self.config = gen, config
        self.models = served_models(effective, gen.fleet.endpoints)
        self.keys = KeyTable(config.auth)
        retiring = asyncio.create_task(old.fleet.retire(set(gen.fleet.emulators),
                                                        self.settings.total_timeout_s))
        self.retiring.add(retiring)  # its removed engines finish their requests first
        retiring.add_done_callback(self.retiring.discard)

    async def close_retiring(self) -> None:
        """Shutdown: stop the engines of replaced generations that are still draining."""
        for task in list(self.retiring):
            task.cancel()
        await asyncio.gather(*self.retiring, return_exceptions=True)


async def build_generation(config: FleetConfig, settings: Settings, http: Http1Backend,
                           router: Router | None = None,
                           previous: Fleet | None = None) -> Generation:
    """A new generation; ``previous`` (a reload) hands over its emulated engines, its live
    state and its clock."""
    try:
        router = router or build_router(config)
    except PolicyError as exc:
        raise ConfigError(str(settings.config_path or "config"), exc.errors) from None
    fleet = Fleet(config, http, interval_s=settings.health_interval_s,
                  stale_after_s=settings.stale_after_s,
                  clock=previous.clock if previous else time.monotonic,
                  shared_emulators=settings.shared_emulators)
    if previous is None:
        await fleet.start()
    else:
        await fleet.start(previous.emulators, previous.live)
    attempts = {name: p.max_attempts for name, p in config.policies.items()}
    first_byte = {name: p.first_byte_timeout_s for name, p in config.policies.items()}
    shadow = {name: p.shadow for name, p in config.policies.items() if p.shadow is not None}
    resume = {name: p.resume_streams for name, p in config.policies.items()}
    return Generation(fleet, router, attempts, first_byte, shadow, resume,
                      FallbackRoutes.from_config(config))


def served_models(config: FleetConfig,
                  endpoints: Sequence[Endpoint] = ()) -> dict[str, frozenset[str]]:
    """Public model -> the APIs at least one pool serves it over (a LoRA adapter is one
    more model of the pools that declare it, or whose engines list it: ``endpoints``)."""
    apis: dict[str, set[str]] = {}
    for pool in config.pools:
        for model in [*pool.models, *(a.name for a in pool.adapters)]:
            apis.setdefault(model, set()).update(pool.served_apis)
    for ep in endpoints:
        for name in ep.adapters:
            apis.setdefault(name, set()).update(ep.served_apis)
    return {model: frozenset(found) for model, found in apis.items()}
