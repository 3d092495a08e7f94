"""What one running gateway holds, and the reload that swaps a whole generation at once.

``AppState`` is built by the lifespan in ``app.py`` and hung on ``app.state.fleetgate``;
never global. ``generation`` (config + fleet + router) is replaced as one reference on
reload: requests already routed finish on the generation they started with.

Reload: load and validate the file, build every policy pipeline, start the new fleet
(adopting the emulated engines that are still configured, taking over the live state of
the endpoints that are still there, probing every endpoint once), then swap and stop the
old fleet. Any failure before the swap leaves the running
generation serving and is reported with its YAML paths.

May touch: config loader, routing builders, gateway services. Must not touch: HTTP routes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import aiohttp

from fleetgate.config import ConfigError, FleetConfig, default_config_path, load_config
from fleetgate.gateway.auth import KeyTable
from fleetgate.gateway.limits import LimitEnforcer
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.gateway.proxy.shadow import ShadowMirror
from fleetgate.gateway.registrations import Registration, RegistrationBody, endpoint_id, merge
from fleetgate.gateway.settings import Settings
from fleetgate.routing import PolicyError, Router, build_router
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
    http: aiohttp.ClientSession  # probes and scrapes (backends.probes.background_session)
    started_at: float
    models: dict[str, frozenset[str]]  # public model -> the APIs some pool serves it over
    reload_lock: asyncio.Lock
    keys: KeyTable = field(default_factory=lambda: KeyTable(None))
    limits: LimitEnforcer = field(default_factory=lambda: LimitEnforcer(MemoryLimits()))
    registrations: dict[str, Registration] = field(default_factory=dict)  # by engine URL
    stores: Stores | None = None
    sync: PeerSync | None = None
    shadow: ShadowMirror | None = None  # mirrors to candidate pools; GET /admin/shadow

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
        """Add (or refresh) a worker's endpoint; returns its id and whether it is new."""
        async with self.reload_lock:
            known = self.registrations.get(body.url)
            self.registrations[body.url] = Registration(body, now + body.ttl_s)
            if known is not None and known.body == body:
                return str(endpoint_id(self.generation.fleet.config, body.url)), False
            try:
                await self._apply(self.config)
            except Exception:
                self.registrations.pop(body.url, None)
                raise
            return str(endpoint_id(self.generation.fleet.config, body.url)), True

    async def deregister(self, endpoint: str | None = None, now: float | None = None) -> bool:
        """Remove one endpoint by id, or every registration expired at ``now``."""
        async with self.reload_lock:
            fleet_config = self.generation.fleet.config
            doomed = [url for url, reg in self.registrations.items()
                      if endpoint_id(fleet_config, url) == endpoint
                      or (now is not None and reg.expires_at <= now)]
            for url in doomed:
                log.info("endpoint %s leaves the fleet", endpoint_id(fleet_config, url))
                del self.registrations[url]
            if doomed:
                await self._apply(self.config)
            return bool(doomed)

    async def _apply(self, config: FleetConfig) -> None:
        effective = merge(config, list(self.registrations.values()))
        old = self.generation
        gen = await build_generation(effective, self.settings, self.http, previous=old.fleet)
        self.generation, self.config = gen, config
        self.models = served_models(effective)
        self.keys = KeyTable(config.auth)
        await old.fleet.stop(keep=set(gen.fleet.emulators))


async def build_generation(config: FleetConfig, settings: Settings, http: aiohttp.ClientSession,
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
                  clock=previous.clock if previous else time.monotonic)
    if previous is None:
        await fleet.start()
    else:
        await fleet.start(previous.emulators, previous.live)
    attempts = {name: p.max_attempts for name, p in config.policies.items()}
    first_byte = {name: p.first_byte_timeout_s for name, p in config.policies.items()}
    shadow = {name: p.shadow for name, p in config.policies.items() if p.shadow is not None}
    return Generation(fleet, router, attempts, first_byte, shadow)


def served_models(config: FleetConfig) -> dict[str, frozenset[str]]:
    """Public model -> the APIs at least one pool serves it over."""
    apis: dict[str, set[str]] = {}
    for pool in config.pools:
        for model in pool.models:
            apis.setdefault(model, set()).update(pool.served_apis)
    return {model: frozenset(found) for model, found in apis.items()}
