"""Admission control: what waits, in which order, and what is shed when the fleet is full.

When a policy has an SLO and every usable endpoint serving the model is at its SLO
capacity (``room`` is 0: the router's ``slo_capacity`` less the requests already active,
summed), a request is not sent to queue without bound inside an engine. (When no endpoint
could meet the SLO at any load, waiting would not help: the request goes fastest-first.)
By priority (``x-priority: high|normal|low``, or the API key's):

- ``high`` goes to the fastest endpoint at once (it may exceed an SLO capacity; it is the
  class whose SLO must hold);
- ``normal`` and ``low`` wait here, in a bounded queue, for a slot: ``admit`` says whether a
  request may wait at all (its predicted wait, the queue ahead of it over the fleet's drain
  rate, must fit its TTFT budget) and how long (its deadline); past it, it is shed with 429
  and a ``Retry-After`` of the predicted drain time.
- Order of release: normal before low (so under overload low is shed first, then normal);
  within a class, weighted fair queuing between tenants (start-time fair queuing: each
  request's tag is max(virtual time, its tenant's last tag) + 1 / weight, the smallest tag
  goes first), so one tenant's flood cannot starve another's trickle, as llm-d's flow
  control does.

``Refused`` counts, per public model, the requests the gateway refused for want of capacity
(shed, or no endpoint could take them): demand no replica saw, which the fleet scaler adds
to what the replicas were sent (``fleetgate.scaling``).

Pure: no clocks, no asyncio. The gateway (``gateway/proxy/admission.py``) and the simulator
(``sim/gateway.py``) each wrap it with their own waiting.

May touch: routing types. Must not touch: I/O, clocks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from fleetgate.routing.estimate import PREFILL_TAU_S, SLO_HEADROOM
from fleetgate.routing.types import Decision

PRIORITIES = ("high", "normal", "low")
WAITING = PRIORITIES[1:]  # the classes that queue; high never waits
MIN_RETRY_AFTER_S = 1
NO_TTFT_SLO_WAIT_S = 2.0  # how long a request may wait when the policy sets only a TPOT SLO
REFUSED_TAU_S = PREFILL_TAU_S  # as the rate of requests sent to each endpoint (state/live.py)

T = TypeVar("T")


def priority_of(header: str | None, default: str = "normal") -> str:
    value = (header or "").strip().lower()
    return value if value in PRIORITIES else default


def retry_after_s(wait_s: float) -> int:
    """Whole seconds for a ``Retry-After`` header (at least 1)."""
    return max(MIN_RETRY_AFTER_S, math.ceil(wait_s)) if math.isfinite(wait_s) else 60


def room(decision: Decision) -> int | None:
    """How many usable candidates could take this request now and still be predicted
    within the policy's SLO and their learned concurrency limit (``can_take``; 0: the fleet
    is full). None when there is nothing to wait for: the policy has no SLO, or no
    candidate could meet it at any load (no SLO capacity; or this prompt's prefill alone is
    past the TTFT SLO)."""
    est, alive = decision.estimates, decision.alive
    if est is None or alive is None or (est.slo.ttft_s is None and est.slo.tpot_s is None):
        return None
    capacity = np.where(alive, np.floor(est["slo_capacity"]), 0.0)
    if not (capacity >= 1).any():
        return None
    if est.slo.ttft_s is not None and np.min(np.where(alive, est["prefill_s"], np.inf)) > \
            SLO_HEADROOM * est.slo.ttft_s:
        return None
    return int(np.count_nonzero((est["can_take"] > 0) & alive))


def full(decision: Decision) -> bool:
    """``room(decision) == 0``, cheaply where it is not: one candidate that can take the
    request settles it (the common case, asked on every arrival)."""
    est, alive = decision.estimates, decision.alive
    if est is None or alive is None or (est.slo.ttft_s is None and est.slo.tpot_s is None):
        return False
    if ((est["can_take"] > 0) & alive).any():
        return False
    return room(decision) == 0


def drain_and_budget(decision: Decision) -> tuple[float, float]:
    """(requests/s the candidates complete when full, seconds a request may wait): the
    drain rate is the sum over usable candidates of SLO capacity / the predicted e2e time
    of a typical request (Little's law: the requests *in flight* end at that rate, whatever
    this one asks for; its TTFT and TPOT with the workload's mean answer,
    ``output_tokens_mean``, or its own e2e before any answer has finished. Sized by this
    request's own length, a long answer on a fleet completing 40 requests/s was told 8 to
    23 and shed at once behind a queue of 11 to 28); the budget is the policy's TTFT SLO
    (with the router's headroom) less the fastest predicted TTFT."""
    est, alive = decision.estimates, decision.alive
    if est is None or alive is None or not alive.any():
        return 0.0, 0.0
    answer = est.column("output_tokens_mean")
    typical = np.where(answer >= 1, est["ttft_s"] + est["tpot_s"] * (answer - 1), est["e2e_s"])
    e2e = np.where(alive, typical, np.inf)
    drain = float(np.sum(np.where(e2e > 0, est["slo_capacity"] / e2e, 0.0)))
    ttft_slo = est.slo.ttft_s
    if ttft_slo is None:
        return drain, NO_TTFT_SLO_WAIT_S
    fastest = float(np.min(np.where(alive, est["ttft_s"], np.inf)))
    return drain, max(0.0, SLO_HEADROOM * ttft_slo - fastest)


@dataclass(order=True, slots=True)
class _Entry(Generic[T]):
    tag: float
    seq: int
    item: T = field(compare=False)
    deadline: float = field(compare=False)
    priority: str = field(compare=False)
    done: bool = field(default=False, compare=False)


class _Band(Generic[T]):
    """One priority class: WFQ between tenants."""

    def __init__(self) -> None:
        self.heap: list[_Entry[T]] = []
        self.virtual = 0.0
        self.last_tag: dict[Hashable, float] = {}
        self.size = 0


class AdmissionQueue(Generic[T]):
    """Requests waiting for capacity for one (model, API), by class then fair tag."""

    def __init__(self) -> None:
        self._bands: dict[str, _Band[T]] = {p: _Band() for p in WAITING}
        self._seq = itertools.count()
        self._entries: dict[int, _Entry[T]] = {}

    def __len__(self) -> int:
        return sum(b.size for b in self._bands.values())

    def ahead_of(self, priority: str) -> int:
        """How many would be released before a new request of ``priority``."""
        n = 0
        for p in WAITING:
            n += self._bands[p].size
            if p == priority:
                return n
        return n

    def admit(self, priority: str, drain_per_s: float, ttft_budget_s: float) -> tuple[bool, float]:
        """(may wait, predicted wait in seconds) for a new request of ``priority``: the
        requests ahead of it, and itself, leave at the fleet's drain rate."""
        if drain_per_s <= 0 or not math.isfinite(drain_per_s):
            return False, math.inf
        wait = (self.ahead_of(priority) + 1) / drain_per_s
        return wait <= ttft_budget_s, wait

    def push(self, item: T, priority: str, tenant: Hashable, weight: float,
             deadline: float) -> int:
        """Queue ``item``; returns a ticket for ``cancel``."""
        band = self._bands[priority]
        tag = max(band.virtual, band.last_tag.get(tenant, 0.0)) + 1.0 / max(weight, 1e-6)
        band.last_tag[tenant] = tag
        seq = next(self._seq)
        entry = _Entry(tag, seq, item, deadline, priority)
        heapq.heappush(band.heap, entry)
        band.size += 1
        self._entries[seq] = entry
        return seq

    def peek(self) -> T | None:
        """The request ``pop`` would release, left in place."""
        for p in WAITING:
            band = self._bands[p]
            while band.heap and band.heap[0].done:
                heapq.heappop(band.heap)
            if band.heap:
                return band.heap[0].item
        return None

    def pop(self) -> T | None:
        """The next request to release (normal before low; fair within a class)."""
        for p in WAITING:
            band = self._bands[p]
            while band.heap:
                entry = heapq.heappop(band.heap)
                if entry.done:
                    continue
                self._finish(band, entry)
                band.virtual = entry.tag
                return entry.item
        return None

    def cancel(self, ticket: int) -> bool:
        """Take a request out (it was shed, or its client left); False if already gone."""
        entry = self._entries.get(ticket)
        if entry is None or entry.done:
            return False
        self._finish(self._bands[entry.priority], entry)  # its heap slot is skipped on pop
        return True

    def expired(self, now: float) -> list[T]:
        """Take out and return every request whose deadline has passed."""
        out = []
        for band in self._bands.values():
            for entry in band.heap:
                if not entry.done and entry.deadline <= now:
                    self._finish(band, entry)
                    out.append(entry.item)
        return out

    def _finish(self, band: _Band[T], entry: _Entry[T]) -> None:
        entry.done = True
        band.size -= 1
        self._entries.pop(entry.seq, None)


class Refused:
    """Requests refused for want of capacity per public model, per second over about
    ``REFUSED_TAU_S`` (an exponentially decaying count, as ``LiveFleet``'s rates)."""

    def __init__(self) -> None:
        self._rate: dict[str, tuple[float, float]] = {}  # model -> (rate, when)

    def add(self, model: str, now: float) -> None:
        self._rate[model] = (self._decayed(model, now) + 1.0 / REFUSED_TAU_S, now)

    def per_s(self, now: float) -> dict[str, float]:
        return {model: self._decayed(model, now) for model in self._rate}

    def _decayed(self, model: str, now: float) -> float:
        rate, at = self._rate.get(model, (0.0, now))
        return rate * math.exp(min(at - now, 0.0) / REFUSED_TAU_S)
