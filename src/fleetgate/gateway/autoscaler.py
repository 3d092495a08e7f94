"""The fleet scaler in ``serve``: every ``scaling.TICK_S`` the same scaler ``simulate`` runs
(``fleetgate.scaling``) reads the current generation's live state, the admission queue and
what admission refused, and says how many replicas each autoscaled pool should have.

* An ``emulated://`` pool with ``autoscale:`` (``Fleet.scaled_here``) is actuated here: a
  replica asked for gets its engine started at once and takes traffic once it answers its
  probe and ``cold_start_s`` has passed since it was asked for (a pod's boot, emulated); a
  replica chosen to drain (``scaling.changes``) gets no new request from that instant
  (``LiveFleet.park``) and its engine stops once its last request has ended, so a shrink
  fails nothing.
* Any other autoscaled pool is published only: ``fleetgate_pool_desired_replicas{pool}``
  for KEDA or an HPA (``deploy/k8s``), which add or remove pods; their endpoints come and go
  through ``fleetgate worker`` registration.

``GET /admin/scaling`` (``report``) and the gauges ``fleetgate_pool_desired_replicas`` and
``fleetgate_pool_replicas{pool,state}`` read the last tick. A reload (a new generation)
starts from the engines that are running: their slots are ready, the others off.

May touch: the current generation's fleet (engines, live state), scaling, asyncio tasks.
Must not touch: HTTP routes, the request path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fleetgate.scaling import (
    DRAINING,
    OFF,
    READY,
    STARTING,
    TICK_S,
    FleetScaler,
    ScaledPool,
    Target,
    changes,
    observe,
    scaled_pools,
)
from fleetgate.scaling.signals import scaling_slo
from fleetgate.state.fleet import Fleet, emulator_key

log = logging.getLogger("fleetgate.scaling")
_HEALTH_READY = "ready"


class GatewayScaler:
    def __init__(self, fleet: Callable[[], Fleet],
                 waiting: Callable[[], dict[str, float]],
                 refused: Callable[[], dict[str, float]] = dict) -> None:
        self._current = fleet
        self._waiting = waiting
        self._refused = refused
        self._fleet: Fleet | None = None
        self._pools: list[ScaledPool] = []
        self._scaler = FleetScaler()
        self._asked: dict[int, float] = {}  # slot -> when it was asked to start
        self._launched: set[int] = set()  # slots whose engine answers
        self._tasks: set[asyncio.Task[None]] = set()
        self.targets: dict[str, Target] = {}

    async def run(self, interval_s: float = TICK_S) -> None:
        try:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    self.tick()
                except Exception:  # a scaler bug must not end scaling
                    log.exception("scaler tick failed")
        finally:
            for task in self._tasks:
                task.cancel()

    def tick(self) -> dict[str, Target]:
        fleet = self._current()
        if fleet is not self._fleet:
            self._adopt(fleet)
        now = fleet.clock()
        self._settle(fleet, now)
        pools = observe(fleet.live, self._pools, scaling_slo(fleet.config), now)
        self.targets = self._scaler.tick(now, pools, self._waiting(), self._refused())
        for pool in self._pools:
            if pool.managed:
                start, drain = changes(pool, self.targets[pool.name].desired, fleet.live)
                for i in start:
                    self._start(fleet, pool, i, now)
                for i in drain:
                    pool.state[i] = DRAINING
                    fleet.live.park(i, True)
                    log.info("replica %s drains (%s)", fleet.endpoints[i].id,
                             self.targets[pool.name].reason)
        return self.targets

    def report(self) -> dict[str, Any]:
        """``GET /admin/scaling``: per autoscaled pool, what it has and what it wants."""
        out: dict[str, Any] = {}
        for pool in self._pools:
            target = self.targets.get(pool.name)
            if pool.autoscale is None or target is None:
                continue
            counts = self.counts(pool)
            out[pool.name] = {
                "desired": target.desired, "current": target.current, **counts,
                "min": pool.autoscale.min_replicas, "max": pool.autoscale.max_replicas,
                "actuated": pool.managed, "reason": target.reason,
                "load_per_s": round(target.load, 2),
                "replica_capacity_per_s": round(target.replica_capacity, 2),
                "packing": round(target.packing, 3),
                "usd_per_hour": round(target.usd_per_hour, 4),
                "usd_per_hour_at_desired": round(target.usd_per_hour_at_desired, 4)}
        return {"pools": out}

    def counts(self, pool: ScaledPool) -> dict[str, int]:
        if pool.managed:
            return {name: len(pool.in_state(state)) for name, state in
                    (("ready", READY), ("starting", STARTING), ("draining", DRAINING))}
        fleet = self._fleet
        ready = sum(1 for i in pool.slots if fleet is not None
                    and fleet.live.stats[i].health.state == _HEALTH_READY)
        return {"ready": ready, "starting": 0, "draining": 0}

    # -- carrying it out ---------------------------------------------------------------
    def _adopt(self, fleet: Fleet) -> None:
        """A new generation: its slots with a running engine are ready, the rest off."""
        self._fleet, self._asked, self._launched = fleet, {}, set()
        running = {k for k, h in fleet.emulators.items() if h.returncode is None}
        self._pools = scaled_pools(fleet.config, fleet.endpoints, fleet.scaled_here)
        for pool in self._pools:
            if not pool.managed:
                continue
            for i in pool.slots:
                on = emulator_key(fleet.endpoints[i]) in running
                pool.state[i] = READY if on else OFF
                fleet.live.park(i, not on)

    def _start(self, fleet: Fleet, pool: ScaledPool, i: int, now: float) -> None:
        pool.state[i] = STARTING
        self._asked[i] = now
        log.info("replica %s starts (%s)", fleet.endpoints[i].id, self.targets[pool.name].reason)
        self._spawn(self._launch(fleet, pool, i))

    async def _launch(self, fleet: Fleet, pool: ScaledPool, i: int) -> None:
        try:
            await fleet.start_replica(i)
        except Exception as exc:
            log.warning("replica %s could not start: %s", fleet.endpoints[i].id, exc)
            if pool.state.get(i) == STARTING:
                pool.state[i] = OFF  # asked for again at the next tick if still wanted
            return
        self._launched.add(i)

    def _settle(self, fleet: Fleet, now: float) -> None:
        """Starting replicas past their cold start that answer take traffic; draining ones
        with no request left stop."""
        live = fleet.live
        for pool in self._pools:
            if not pool.managed or pool.autoscale is None:
                continue
            for i in pool.in_state(STARTING):
                booted = now - self._asked.get(i, now) >= pool.autoscale.cold_start_s
                if booted and i in self._launched and \
                        live.stats[i].health.state == _HEALTH_READY:
                    pool.state[i] = READY
                    live.park(i, False)
                    log.info("replica %s is ready", fleet.endpoints[i].id)
            for i in pool.in_state(DRAINING):
                if live.value(i, "in_flight") + live.value(i, "peer_in_flight") <= 0:
                    pool.state[i] = OFF
                    self._launched.discard(i)
                    self._spawn(fleet.stop_replica(i))

    def _spawn(self, job: Any) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
