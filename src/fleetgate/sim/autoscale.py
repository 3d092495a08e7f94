"""Replica autoscaling of pools in the simulator (``autoscale:`` on a pool): the scaler of
``fleetgate.scaling``, the one ``serve`` runs, over simulated replicas.

Every ``scaling.TICK_S`` the scaler reads the live fleet (``scaling.signals``: load, the
router's SLO capacity per replica, the gateway's admission queue) and says how many
replicas each autoscaled pool should have. Here that is carried out as a Kubernetes
deployment would: a new replica is billed from the decision and takes traffic after
``cold_start_s``; a replica chosen to drain (``scaling.changes``: a starting one first, else
the ready one with the fewest requests) stops taking traffic at once, finishes what it
holds, then stops being billed.

May touch: the sim fleet's pool descriptions, scaling. Must not touch: routing, I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgate.scaling import (
    READY,
    FleetScaler,
    Target,
    changes,
    observe,
    scaled_pools,
)
from fleetgate.scaling.signals import scaling_slo
from fleetgate.sim.fleet import SimFleet


@dataclass(frozen=True)
class Action:
    kind: str  # "start" | "drain"
    endpoint: int


class Autoscaler:
    """Slot states of the autoscaled pools; ``tick`` says what to change."""

    def __init__(self, fleet: SimFleet) -> None:
        managed = {p.name for p in fleet.pools if p.autoscale}
        self.pools = scaled_pools(fleet.config, fleet.endpoints, managed,
                                  {p.name: p.initial for p in fleet.pools})
        self.managed = [p for p in self.pools if p.managed]
        self.slo = scaling_slo(fleet.config)
        self.scaler = FleetScaler()
        self.targets: dict[str, Target] = {}
        self.state: dict[int, int] = {i: READY for i in range(len(fleet.endpoints))}
        for pool in self.managed:
            self.state.update(pool.state)
            pool.state = self.state  # one table: the pools' views of it

    def tick(self, fleet: SimFleet, now: float, waiting: dict[str, float],
             refused: dict[str, float]) -> list[Action]:
        self.targets = self.scaler.tick(now, observe(fleet.live, self.pools, self.slo, now),
                                        waiting, refused)
        actions: list[Action] = []
        for pool in self.managed:
            start, drain = changes(pool, self.targets[pool.name].desired, fleet.live)
            actions += [Action("start", i) for i in start] + [Action("drain", i) for i in drain]
        return actions

