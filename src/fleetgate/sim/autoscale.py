"""Replica autoscaling of pools in the simulator (``autoscale:`` on a pool; the gateway ignores it).

What a Kubernetes HPA/KEDA setup on the engines' own metrics would do, per pool:

* signal: the engines' ``running + waiting`` (what the collector scrapes every second),
  summed over the pool's live replicas and averaged over the last ``WINDOW_S``;
* capacity of one replica: the concurrency it sustains within the workload's SLO
  (``capacity.py``: measured on the same engine model with the workload's request mix);
* desired = ceil(signal / (capacity x target_utilization)), clipped to [min, max];
* scale up at once (a new replica is billed from the decision and takes traffic after
  ``cold_start_s``); scale down only after the desire has stayed lower for
  ``SCALE_DOWN_AFTER_S``, one replica per tick: it stops taking traffic at once (the worker
  deregisters), finishes what it holds, then stops being billed.

The router is what makes this matter: load concentrated on the pools that are cheapest per
token lets the dear ones shrink to ``min_replicas``.

May touch: the sim fleet's pool descriptions. Must not touch: routing, live state.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from fleetgate.sim.fleet import SimPool

TICK_S = 10.0
WINDOW_S = 30.0
SCALE_DOWN_AFTER_S = 60.0
OFF, STARTING, ON, DRAINING = 0, 1, 2, 3


@dataclass
class PoolScaler:
    pool: SimPool
    capacity: float  # concurrency one replica sustains within the SLO
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    lower_since: float | None = None

    def record(self, now: float, load: float) -> None:
        self.samples.append((now, load))
        while self.samples and now - self.samples[0][0] > WINDOW_S:
            self.samples.popleft()

    def desired(self) -> int:
        spec = self.pool.autoscale
        assert spec is not None
        load = sum(v for _, v in self.samples) / len(self.samples) if self.samples else 0.0
        want = math.ceil(load / max(self.capacity * spec.target_utilization, 1e-9) - 1e-9)
        return min(max(want, spec.min_replicas), spec.max_replicas)


@dataclass(frozen=True)
class Action:
    kind: str  # "start" | "drain"
    endpoint: int


class Autoscaler:
    """Slot states per endpoint of the autoscaled pools; ``tick`` says what to change."""

    def __init__(self, pools: list[SimPool], capacity: dict[str, float]) -> None:
        self.scalers = [PoolScaler(p, capacity[p.name]) for p in pools if p.autoscale]
        self.state: dict[int, int] = {}
        for p in pools:
            for k, i in enumerate(p.slots):
                self.state[i] = ON if k < p.initial else OFF

    def live_slots(self, scaler: PoolScaler) -> list[int]:
        return [i for i in scaler.pool.slots if self.state[i] in (STARTING, ON)]

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for sc in self.scalers:
            have = self.live_slots(sc)
            want = sc.desired()
            if want > len(have):
                sc.lower_since = None
                free = [i for i in sc.pool.slots if self.state[i] == OFF]
                actions += [Action("start", i) for i in free[:want - len(have)]]
            elif want < len(have):
                if sc.lower_since is None:
                    sc.lower_since = now
                if now - sc.lower_since >= SCALE_DOWN_AFTER_S:
                    started = [i for i in have if self.state[i] == STARTING]
                    actions.append(Action("drain", (started or have)[-1]))
                    sc.lower_since = now
            else:
                sc.lower_since = None
        return actions
