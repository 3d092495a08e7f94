"""The routing pipeline (llm-d's endpoint picker is the model) and the strategy presets.

``Pipeline.route(request, snapshot)`` is pure: builtin prefilters (serves the model, not
``not_ready``, breaker allows, fresh) -> estimates (``estimate.py``) -> the policy's filters
-> weighted scorers, each in [0,1] -> a picker that orders every survivor best-first.

A policy with an SLO and ``slo_mode="prefer"`` (the ``cost`` strategy) ranks the endpoints
predicted to meet the SLO first (by their weighted score), then the others fastest-first;
when none meets it, the fastest leads. That is "the cheapest endpoint that meets the SLO,
spilling to the next cheapest as load grows, the fastest when none can".

Strategy presets (``STRATEGIES``), each overridable by a policy's own scorers / picker:

| strategy | scorers (weight) | picker |
|---|---|---|
| cost | cost (1), with SLO preference | max_score |
| latency | latency (1) | max_score |
| least_loaded | queue (1), kv_headroom (0.25) | max_score |
| round_robin | none | round_robin |
| power_of_two | queue (1) | power_of_two |
| affinity | affinity (1), queue (0.2) | max_score |
| weighted | the policy's own | max_score |

May touch: numpy, routing plugins and types. Must not touch: I/O, asyncio, clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetgate.routing.estimate import Estimates, Slo
from fleetgate.routing.plugins import Bound, ScoringInput
from fleetgate.routing.plugins.base import normalise_min_over
from fleetgate.routing.types import HEALTH_CODES, Decision, RoutingRequest, Snapshot

NOT_READY = HEALTH_CODES["not_ready"]
PENDING = HEALTH_CODES["pending"]

STRATEGIES: dict[str, tuple[tuple[tuple[str, float], ...], str]] = {
    "cost": ((("cost", 1.0),), "max_score"),
    "latency": ((("latency", 1.0),), "max_score"),
    "least_loaded": ((("queue", 1.0), ("kv_headroom", 0.25)), "max_score"),
    "round_robin": ((), "round_robin"),
    "power_of_two": ((("queue", 1.0),), "power_of_two"),
    "affinity": ((("affinity", 1.0), ("queue", 0.2)), "max_score"),
    "weighted": ((), "max_score"),
}


@dataclass
class Pipeline:
    name: str
    picker: Any  # has .order(total) -> indices
    filters: list[Bound] = field(default_factory=list)
    scorers: list[Bound] = field(default_factory=list)
    slo: Slo = field(default_factory=Slo)
    prefer_slo: bool = False
    stale_after_s: float = 10.0
    max_attempts: int = 3

    def route(self, req: RoutingRequest, snap: Snapshot) -> Decision:
        idx = snap.by_model.get(req.model)
        if idx is None or not len(idx):
            return Decision(self.name, req.model, "no endpoint serves the model", snap.endpoints)
        rejected: dict[str, str] = {}
        alive = self._prefilter(snap, idx, rejected)
        est = Estimates(snap, idx, req, self.slo)
        inp = ScoringInput(snap, idx, req, est, alive)
        for flt in self.filters:
            if not alive.any():
                break
            dropped = alive & ~flt(inp)
            if dropped.any():
                for k in np.flatnonzero(dropped):
                    rejected[snap.endpoints[idx[k]].id] = f"filter {flt.name}"
                alive = alive & ~dropped
                inp = ScoringInput(snap, idx, req, est, alive)
        if not alive.any():
            return Decision(self.name, req.model, "no eligible endpoint", snap.endpoints, idx,
                            rejected=rejected, estimates=est, alive=alive)
        scores = {s.name: s(inp) for s in self.scorers}
        total, reason = self._total(scores, est, alive)
        over = self.prefer_slo and not bool(((est.meets_slo > 0) & alive).any())
        if alive.all():
            order = self.picker.order(total, self.max_attempts)
        else:
            pos = np.flatnonzero(alive)
            order = pos[self.picker.order(total[pos], self.max_attempts)]
        return Decision(self.name, req.model, reason, snap.endpoints, idx, order, total,
                        scores, est, rejected, alive, over)

    def _prefilter(self, snap: Snapshot, idx: np.ndarray, rejected: dict[str, str]) -> Any:
        whole = len(idx) == len(snap.endpoints)
        health = snap.col("health") if whole else snap.col("health")[idx]
        block = np.fmax(snap.col("block_until"), snap.col("peer_block_until"))
        block = block if whole else block[idx]
        contact = snap.col("last_contact") if whole else snap.col("last_contact")[idx]
        bad = (health == NOT_READY) | (block > snap.taken_at) | (
            (contact < snap.taken_at - self.stale_after_s) & (health != PENDING))
        if bad.any():
            for k in np.flatnonzero(bad):
                why = "not ready" if health[k] == NOT_READY else (
                    "breaker open" if block[k] > snap.taken_at else "state stale")
                rejected[snap.endpoints[idx[k]].id] = why
        return ~bad

    def _total(self, scores: dict[str, Any], est: Estimates, alive: Any) -> tuple[Any, str]:
        total = np.zeros(len(alive))
        weight = sum(s.weight for s in self.scorers)
        for s in self.scorers:
            total += s.weight * scores[s.name]
        if weight > 0:
            total /= weight
        if not self.prefer_slo:
            return total, f"{self.name}: best weighted score"
        meets = (est.meets_slo > 0) & alive
        if meets[alive].all():
            return total, "meets the SLO: best score (cheapest)"
        fastest = normalise_min_over(est.e2e_s, alive)
        if not meets.any():
            return fastest, "no endpoint is predicted to meet the SLO: fastest first"
        return np.where(meets, 1.0 + total, fastest * 0.999), \
            "cheapest predicted to meet the SLO; the rest fastest-first"
