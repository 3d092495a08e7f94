"""Desired replicas per pool, from demand and each replica's SLO capacity: one scaler for
``fleetgate simulate`` and ``fleetgate serve``.

Per group of pools that serve the same models (pools sharing a model are one group, llm-d's
"variants" of a model), every ``TICK_S``:

* demand = the requests per second the gateway sends the group's replicas (``signals.py``),
  plus those it refused for want of capacity (shed, or no endpoint: ``state.admission``
  ``Refused``), plus those waiting in its admission queue as the rate they would make
  running (Little's law: each as many requests a second as one running on the group's
  replicas, rate sent over requests on them; a closed-loop burst of 32 clients is sent only
  as fast as the fleet serves it, so the queue is its only sign), averaged over the last
  ``DEMAND_WINDOW_S``;
* a replica of pool p carries ``capacity_p x target_utilization_p x packing`` of it,
  ``capacity_p`` the requests per second it runs within the SLO, from the router's own
  model of a replica (``signals.py``: the catalog prior as corrected by the class's
  learned speed);
* ``packing``, per group, is how the group holds its SLO (the results the gateway judged
  over the last minute, ``SloCapacity.outcomes``): from 1, it rises ``PACK_UP`` a tick
  while under ``PACK_UP_UNDER`` (40%) of the SLO's miss budget (1%) is missed, falls
  ``PACK_DOWN`` a tick while over the budget, never under 1 (``target_utilization`` is the
  most headroom kept) nor over a replica's whole capacity (``1 / target_utilization``).
  So the bill follows the router: one that holds the SLO on fuller replicas is given fewer
  of them. On the matrix's autoscaled cells at a target of 0.8 cost held 99.3-99.7% where
  round_robin fell to 95.1-97.4% on the same replicas (BENCHMARKS.md, issue 23); with one
  fixed target every router was bought the same fleet;
* what is paid for anyway is used first: pools without ``autoscale`` at their ready count,
  autoscaled ones at their floor (``min_replicas``);
* the rest is bought on the autoscaled pools in order of $ per unit of SLO capacity, each
  up to its ceiling; the last, partial replica goes to the pool where one replica covering
  the rest costs least per hour (a small dear replica may beat a big cheap one there);
* a group that cannot be carried even at every ceiling asks for every ceiling.

Hysteresis as Kubernetes' HPA does it: up at once; down only to the highest desire of the
last ``scale_down_delay_s`` (a stabilisation window; the replicas a pool has when the scaler
first sees it count as a desire then), and one replica per pool per tick, so
the dearest pools (bought last) give their replicas back first. Starting replicas count as
supply: a burst does not buy twice while the first ones boot.

May touch: config (AutoscaleConfig). Must not touch: I/O, clocks (``now`` is passed in),
live state (``signals.py`` reads it).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from fleetgate.config.schema import AutoscaleConfig

EPS = 1e-9
TICK_S = 5.0  # how often serve and simulate tick the scaler
DEMAND_WINDOW_S = 20.0
MISS_BUDGET = 0.01  # "99% within the SLO"
PACK_UP_UNDER = 0.4  # of the budget: missing less than this, replicas are filled fuller
PACK_UP, PACK_DOWN = 0.01, 0.05  # a tick's step of a group's packing
PACK_MIN = 1.0
MIN_JUDGED = 200.0  # results in the last minute before the packing moves


@dataclass(frozen=True)
class PoolState:
    """One pool as the scaler sees it at a tick."""

    name: str
    models: frozenset[str]
    usd_per_replica_hour: float
    capacity: float  # requests per second one replica runs within the SLO
    load: float  # requests per second sent to its replicas now
    ready: int
    starting: int = 0
    draining: int = 0
    autoscale: AutoscaleConfig | None = None
    outcomes: tuple[float, float] = (0.0, 0.0)  # results judged and missed, last minute
    active: float = 0.0  # requests on its replicas now

    @property
    def live(self) -> int:
        """Replicas that serve or will: ready and starting (draining ones are leaving)."""
        return self.ready + self.starting

    @property
    def per_replica(self) -> float:
        """The demand one replica is meant to carry."""
        target = self.autoscale.target_utilization if self.autoscale else 1.0
        return max(self.capacity * target, EPS)


@dataclass(frozen=True)
class Target:
    pool: str
    desired: int
    current: int
    reason: str
    usd_per_hour: float  # the replicas billed now (ready, starting, draining)
    usd_per_hour_at_desired: float
    load: float  # requests per second sent to the pool's replicas at this tick
    replica_capacity: float  # requests per second one replica runs within the SLO
    packing: float = 1.0  # its group's: how much fuller than target_utilization


def groups(pools: list[PoolState]) -> list[list[PoolState]]:
    """Pools joined by shared models (connected components), in config order."""
    out: list[list[PoolState]] = []
    for pool in pools:
        joined = [g for g in out if any(pool.models & p.models for p in g)]
        merged = [p for g in joined for p in g] + [pool]
        out = [g for g in out if g not in joined] + [merged]
    return out


def allocate(pools: list[PoolState], demand: float,
             pack: float = 1.0) -> tuple[dict[str, int], str]:
    """Replicas per autoscaled pool of one group to carry ``demand`` with each replica
    filled ``pack`` times its target utilization (module docstring), and why, in a few
    words (the capacities in it are at that fill)."""
    scaled = [p for p in pools if p.autoscale is not None]
    want = {p.name: p.autoscale.min_replicas for p in scaled if p.autoscale}
    paid = sum(p.ready * p.per_replica for p in pools if p.autoscale is None)
    paid += sum(want[p.name] * p.per_replica for p in scaled)
    rest = demand / pack - paid
    if rest <= EPS:
        return want, f"demand {demand:.1f} req/s fits the paid-for capacity {paid * pack:.1f}"
    order = sorted(scaled, key=lambda p: (p.usd_per_replica_hour / p.per_replica, p.name))
    for k, pool in enumerate(order):
        spec = pool.autoscale
        assert spec is not None
        room = spec.max_replicas - want[pool.name]
        if room <= 0:
            continue
        whole = math.floor(rest / pool.per_replica + EPS)
        if whole >= room:
            want[pool.name] += room
            rest -= room * pool.per_replica
            continue
        want[pool.name] += whole
        rest -= whole * pool.per_replica
        if rest > EPS:
            last = _cheapest_cover(order[k:], want, rest)
            want[last.name] += 1
            rest -= last.per_replica
        break
    if rest > EPS:
        return want, (f"demand {demand:.1f} req/s exceeds every ceiling "
                      f"(short by {rest * pack:.1f})")
    return want, f"demand {demand:.1f} req/s: cheapest $ per unit of SLO capacity first"


def _cheapest_cover(order: list[PoolState], want: dict[str, int], rest: float) -> PoolState:
    """The pool whose one more replica covers ``rest`` for the least $/hour (the first in
    ``order`` with room when none covers it)."""
    room = [p for p in order if p.autoscale and want[p.name] < p.autoscale.max_replicas]
    covering = [p for p in room if p.per_replica >= rest - EPS]
    if covering:
        return min(covering, key=lambda p: (p.usd_per_replica_hour, order.index(p)))
    return room[0]


@dataclass
class FleetScaler:
    """The stateful part: each group's recent demand (averaged over ``DEMAND_WINDOW_S``:
    a burst's rate must last to buy replicas) and each pool's recent desires (the
    stabilisation window)."""

    demand: dict[frozenset[str], deque[tuple[float, float]]] = field(default_factory=dict)
    history: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    packing: dict[frozenset[str], tuple[float, float]] = field(default_factory=dict)

    def tick(self, now: float, pools: list[PoolState], waiting: dict[str, float] | None = None,
             refused: dict[str, float] | None = None) -> dict[str, Target]:
        """Targets for every autoscaled pool. Per public model, counted once for the group
        that serves it: ``waiting``, requests queued in the gateway (admission), as the rate
        they would make running; ``refused``, requests per second it refused for want of
        capacity."""
        out: dict[str, Target] = {}
        for group in groups(pools):
            models = frozenset().union(*(p.models for p in group))
            sent, active = sum(p.load for p in group), sum(p.active for p in group)
            queued = sum(n for m, n in (waiting or {}).items() if m in models)
            now_demand = sent + queued * (sent / active if active >= 1 and sent > 0
                                          else 1.0 / DEMAND_WINDOW_S) + sum(
                n for m, n in (refused or {}).items() if m in models)
            pack = self._pack(now, models, group)
            want, why = allocate(group, self._smoothed(now, models, now_demand), pack)
            if pack != 1.0:
                why += f"; replicas filled to {pack:.2f}x the target utilization (the SLO's " \
                       "misses over the last minute set it)"
            for pool in group:
                if pool.autoscale is not None:
                    out[pool.name] = self._settle(now, pool, want[pool.name], why, pack)
        return out

    def _pack(self, now: float, key: frozenset[str], group: list[PoolState]) -> float:
        """How much fuller than its target utilization the group's replicas are filled
        (module docstring): ``PACK_UP`` more each ``TICK_S`` while the group misses under
        ``PACK_UP_UNDER`` of the SLO's budget, ``PACK_DOWN`` less while it misses over it."""
        judged = sum(p.outcomes[0] for p in group)
        missed = sum(p.outcomes[1] for p in group)
        pack, then = self.packing.get(key, (1.0, now))
        ticks = min(max(now - then, 0.0) / TICK_S, 1.0)
        targets = [p.autoscale.target_utilization for p in group if p.autoscale]
        if judged >= MIN_JUDGED:
            if missed > MISS_BUDGET * judged:
                pack -= PACK_DOWN * ticks
            elif missed < PACK_UP_UNDER * MISS_BUDGET * judged:
                pack += PACK_UP * ticks
        pack = min(max(pack, PACK_MIN), 1.0 / max(targets) if targets else 1.0)
        self.packing[key] = (pack, now)
        return pack

    def _smoothed(self, now: float, key: frozenset[str], value: float) -> float:
        seen = self.demand.setdefault(key, deque())
        seen.append((now, value))
        while now - seen[0][0] > DEMAND_WINDOW_S:
            seen.popleft()
        return sum(v for _, v in seen) / len(seen)

    def _settle(self, now: float, pool: PoolState, raw: int, why: str,
                pack: float) -> Target:
        spec = pool.autoscale
        assert spec is not None
        seen = self.history.get(pool.name)
        if seen is None:  # what a pool has when first seen counts as a desire then
            seen = self.history[pool.name] = deque([(now, pool.live)])
        seen.append((now, raw))
        while seen and now - seen[0][0] > spec.scale_down_delay_s:
            seen.popleft()
        held = max(d for _, d in seen)
        desired = raw
        if raw < pool.live:
            desired = max(held if held < pool.live else pool.live, pool.live - 1, raw)
            if desired > raw:
                why += f"; down to {raw} after {spec.scale_down_delay_s:g} s lower"
        desired = min(max(desired, spec.min_replicas), spec.max_replicas)
        billed = pool.ready + pool.starting + pool.draining
        return Target(pool.name, desired, pool.live, why, billed * pool.usd_per_replica_hour,
                      desired * pool.usd_per_replica_hour, pool.load, pool.capacity, pack)
