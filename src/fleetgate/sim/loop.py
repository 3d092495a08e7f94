"""The discrete-event loop: arrivals, engine steps, scrapes, faults and autoscaling in virtual time.

One ``Simulation`` runs one policy over one fleet and one ``RequestSet``. Events:

* an arrival: the gateway routes and dispatches it (``gateway.py``);
* a replica's step (or decode run, ``replica.py``) ends: its tokens go to the gateway;
* every ``SCRAPE_INTERVAL_S`` the collector's tick: each endpoint is probed (down, not yet
  started or deregistered replicas fail the probe) and scraped (waiting, running, KV usage,
  generation counter), then ``LiveFleet.tick`` (stale scrapes expire, idle learned
  corrections relax): what ``state/collector.py`` does, at the
  instant of the tick (a real scrape takes milliseconds);
* injected faults (``workload.faults``) and the autoscaler's ticks.

Simultaneous events run in a fixed order (engine events before arrivals at the same
instant, then by insertion), so one seed gives the same run, byte for byte. Arrivals stop
at the duration; the requests still in flight are then run to completion (at most
``DRAIN_LIMIT_S`` more), so every request that arrived is judged.

May touch: the sim fleet, gateway, autoscaler, routing's ``build_router``. Must not touch:
wall clocks, I/O.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from functools import partial

from fleetgate.routing import build_router
from fleetgate.scaling import DRAINING, OFF, READY, STARTING, TICK_S
from fleetgate.sim.arrivals import RequestSet
from fleetgate.sim.autoscale import Autoscaler
from fleetgate.sim.fleet import SimFleet
from fleetgate.sim.gateway import SimGateway
from fleetgate.sim.outcomes import Outcomes
from fleetgate.sim.workload import Fault

SCRAPE_INTERVAL_S = 1.0
DRAIN_LIMIT_S = 3600.0
_REPLICA, _SCRAPE, _CALL = 0, 1, 2


class Simulation:
    def __init__(self, fleet: SimFleet, requests: RequestSet, policy: str, seed: int,
                 duration_s: float, faults: list[Fault] | None = None) -> None:
        self.fleet, self.duration = fleet, duration_s
        self.requests = requests.until(duration_s)
        router = build_router(fleet.config, seed)
        attempts = {name: p.max_attempts for name, p in fleet.config.policies.items()}
        self.gw = SimGateway(self.requests, router, fleet.live, fleet.replicas, attempts,
                             policy, self._reschedule, self._call_at)
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._calls: dict[int, Callable[[float], None]] = {}
        self._seq = itertools.count()
        self._version = [0] * len(fleet.replicas)
        self.scaler = Autoscaler(fleet)
        self._since = {i: 0.0 for i, s in self.scaler.state.items() if s != OFF}
        self._provisioned: list[tuple[int, float, float]] = []
        for i, s in self.scaler.state.items():
            if s == OFF:  # a slot with no replica yet: never a candidate, not even pending
                fleet.live.park(i, True)
                fleet.live.on_probe(i, 0.0, False, "not provisioned")
        for fault in faults or []:
            self._schedule_fault(fault)
        if self.scaler.managed:
            self._call_at(TICK_S, self._autoscale)

    # -- running -------------------------------------------------------------------------
    def run(self) -> Outcomes:
        arrivals = self.requests.arrival_s.tolist()
        heap, gw = self._heap, self.gw
        self._scrape(0.0)  # the gateway probes once before it serves (state.fleet.start)
        self._push(SCRAPE_INTERVAL_S, _SCRAPE, 0, 0)
        k, n = 0, len(arrivals)
        end = self.duration + DRAIN_LIMIT_S
        while True:
            t_next = arrivals[k] if k < n else math.inf
            if heap and heap[0][0] <= t_next:
                t, _, kind, i, version = heapq.heappop(heap)
                if t > end:
                    break
                if kind == _REPLICA:
                    if version == self._version[i]:
                        self._replica_event(i, t)
                elif kind == _SCRAPE:
                    self._tick(t, k >= n)
                else:
                    self._calls.pop(i)(t)
            elif k < n:
                gw.arrive(k, t_next)
                k += 1
            else:
                break
            if k >= n and not gw.flights:
                break
        self._close_billing()
        self.gw.out.provisioned = self._provisioned
        return self.gw.out

    def _replica_event(self, i: int, now: float) -> None:
        gw = self.gw
        for ev in self.fleet.replicas[i].advance():
            r = int(ev.request_id)
            if ev.index == 0:
                gw.first_token(r, now)
            if ev.finished:
                gw.finished(r, now)
        self._reschedule(i)

    def _reschedule(self, i: int) -> None:
        self._version[i] += 1
        t = self.fleet.replicas[i].next_time
        if t is not None:
            self._push(t, _REPLICA, i, self._version[i])

    def _push(self, t: float, kind: int, i: int, version: int) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, i, version))

    def _call_at(self, t: float, fn: Callable[[float], None]) -> None:
        key = next(self._seq)
        self._calls[key] = fn
        self._push(t, _CALL, key, 0)

    # -- the collector ---------------------------------------------------------------------
    def _tick(self, now: float, draining: bool) -> None:
        self._scrape(now)
        if not draining or self.gw.flights:
            self._push(now + SCRAPE_INTERVAL_S, _SCRAPE, 0, 0)

    def _scrape(self, now: float) -> None:
        live, state = self.fleet.live, self.scaler.state
        for i, replica in enumerate(self.fleet.replicas):
            if not replica.up or state[i] not in (READY, DRAINING):
                live.on_probe(i, now, False, "no answer")
                continue
            live.on_probe(i, now, True, "ok")
            if replica.hosted:  # engine: openai exports no /metrics: probed only
                continue
            g = replica.gauges(now)
            live.on_scrape(i, now, g.waiting, g.running, g.kv_usage,
                           g.generation_tokens_total, None)
        live.tick(now)
        self._finish_drains(now)

    # -- autoscaling ---------------------------------------------------------------------
    def _autoscale(self, now: float) -> None:
        live = self.fleet.live
        waiting = {model: float(len(self.gw.queue)) for model in self.requests.models}
        for action in self.scaler.tick(self.fleet, now, waiting, self.gw.refused.per_s(now)):
            i = action.endpoint
            if action.kind == "start":
                self.scaler.state[i] = STARTING
                self._since[i] = now
                spec = next(p.autoscale for p in self.fleet.pools if i in p.slots)
                assert spec is not None
                self._call_at(now + spec.cold_start_s, partial(self._ready, i))
            else:  # deregistered: no new traffic (a starting one never had any)
                self.scaler.state[i] = DRAINING
                live.park(i, True)
        self._finish_drains(now)
        if now + TICK_S <= self.duration:
            self._call_at(now + TICK_S, self._autoscale)

    def _ready(self, i: int, now: float) -> None:
        if self.scaler.state[i] == STARTING:
            self.scaler.state[i] = READY
            self.fleet.live.on_probe(i, now, True, "registered")
            self.fleet.live.park(i, False)

    def _finish_drains(self, now: float) -> None:
        for i, s in self.scaler.state.items():
            if s == DRAINING and not self.gw.on_endpoint[i]:
                self.scaler.state[i] = OFF
                self._provisioned.append((i, self._since.pop(i), now))

    def _close_billing(self) -> None:
        for i, since in sorted(self._since.items()):
            self._provisioned.append((i, since, max(since, self.duration)))
        self._since.clear()

    # -- faults --------------------------------------------------------------------------
    def _schedule_fault(self, fault: Fault) -> None:
        targets = [i for i, ep in enumerate(self.fleet.endpoints)
                   if ep.id == fault.endpoint or ep.pool == fault.pool]
        if not targets:
            raise ValueError(f"fault at {fault.at_s}s names no endpoint of this fleet "
                             f"({fault.endpoint or fault.pool})")
        for i in targets:
            if fault.down_for_s is not None:
                self._call_at(fault.at_s, partial(self._down, i))
                self._call_at(fault.at_s + fault.down_for_s, partial(self._up, i))
            else:
                slow = float(fault.slow or 1.0)
                self._call_at(fault.at_s, partial(self._slow, i, slow))
                if fault.for_s is not None:
                    self._call_at(fault.at_s + fault.for_s, partial(self._slow, i, 1.0))

    def _down(self, i: int, now: float) -> None:
        self.fleet.replicas[i].go_down()
        self._version[i] += 1
        self.gw.endpoint_died(i, now)

    def _up(self, i: int, now: float) -> None:
        self.fleet.replicas[i].come_up()

    def _slow(self, i: int, factor: float, now: float) -> None:
        if self.fleet.replicas[i].set_slow(factor, now):
            self._reschedule(i)
