"""The attributes of the ``route`` span: a routing decision, flattened for a trace.

What a reader of one trace needs to explain the choice (docs/observability.md has a worked
example): the policy and its reason, how many endpoints were eligible and how many were
filtered out, the retry order, the chosen endpoint's vendor, accelerator and engine, and
for the chosen endpoint and the runner-up their endpoint id, pool, total score, every
scorer's score and the router's estimates (TTFT, TPOT, $/Mtok at the SLO batch).
``fleetgate.route.estimated_cost_usd`` predicts this request's charge by the cost rule of
``costs.py`` (replica $/s x predicted e2e / predicted concurrency), so it can be compared
with the ``fleetgate.cost.usd`` it is finally charged.

Only called when a span records (tracing on and sampled): nothing here runs otherwise.

May touch: routing decision values. Must not touch: opentelemetry, HTTP, metrics.
"""

from __future__ import annotations

import math
from typing import Any

from fleetgate.gateway.telemetry import names as n
from fleetgate.routing import Decision


def decision_attributes(decision: Decision) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        n.ROUTE_POLICY: decision.policy, n.ROUTE_REASON: decision.reason,
        n.ROUTE_REJECTED: len(decision.rejected),
        n.ROUTE_CANDIDATES: int(decision.alive.sum()) if decision.alive is not None
        else len(decision.order),
    }
    head = decision.order.tolist()
    if not head:
        return attrs
    endpoints, idx = decision.endpoints, decision.idx
    attrs[n.ROUTE_ORDER] = [endpoints[idx[k]].id for k in head]
    best = head[:2] if len(head) >= 2 else decision.full_order()[:2]
    chosen = endpoints[idx[best[0]]]
    attrs.update({f"{n.ROUTE_CHOSEN}.vendor": chosen.vendor,
                  f"{n.ROUTE_CHOSEN}.accelerator": chosen.accelerator,
                  f"{n.ROUTE_CHOSEN}.engine": chosen.engine})
    for prefix, k in zip((n.ROUTE_CHOSEN, n.ROUTE_RUNNER_UP), best, strict=False):
        ep = endpoints[idx[k]]
        attrs[f"{prefix}.endpoint"] = ep.id
        attrs[f"{prefix}.pool"] = ep.pool
        if decision.total is not None:
            _put(attrs, f"{prefix}.score", float(decision.total[k]))
        for name, values in decision.scores.items():
            _put(attrs, f"{prefix}.scores.{name}", float(values[k]))
        if decision.estimates is not None:
            for name in n.ROUTE_ESTIMATES:
                _put(attrs, f"{prefix}.estimate.{name}", float(decision.estimates[name][k]))
    cost = _estimated_cost(decision, best[0])
    if cost is not None:
        attrs[n.ROUTE_ESTIMATED_COST] = cost
    return attrs


def _put(attrs: dict[str, Any], key: str, value: float) -> None:
    if math.isfinite(value):
        attrs[key] = value


def _estimated_cost(decision: Decision, k: int) -> float | None:
    """Replica $/s x predicted e2e / (requests already active + this one)."""
    if decision.estimates is None:
        return None
    e2e = float(decision.estimates["e2e_s"][k])
    active = float(decision.estimates["active"][k])
    if not (math.isfinite(e2e) and math.isfinite(active)):
        return None
    usd_per_s = decision.endpoints[decision.idx[k]].price_per_replica_hour / 3600.0
    return usd_per_s * e2e / max(1.0, active + 1.0)
