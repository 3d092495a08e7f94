"""The attributes of the ``route`` span: a routing decision, flattened for a trace.

What a reader of one trace needs to explain the choice (docs/observability.md has a worked
example): the model and, when it is a fallback, the model asked for, the one before and why
it could not serve (one route span per model tried), the policy and its reason, how many
endpoints were eligible and how many were filtered out, the retry order, the chosen
endpoint's vendor, accelerator and engine, and for the chosen endpoint and the runner-up
their endpoint id, pool, total score, every scorer's score and the router's estimates
(TTFT, TPOT, $/Mtok at the SLO batch, the marginal $ this request adds there, the SLO
capacity).
``fleetgate.route.estimated_cost_usd`` predicts this request's charge by the cost rule of
``costs.py`` (replica $/s x predicted e2e / predicted concurrency), so it can be compared
with the ``fleetgate.cost.usd`` it is finally charged.

Only called when a span records (tracing on and sampled): nothing here runs otherwise.

May touch: routing decision values. Must not touch: opentelemetry, HTTP, metrics.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fleetgate.catalog.pricing import charge_usd
from fleetgate.gateway.proxy.request import Fallback
from fleetgate.gateway.telemetry import names as n
from fleetgate.routing import Decision
from fleetgate.routing.estimate import DEFAULT_MAX_TOKENS


def decision_attributes(decision: Decision, max_tokens: int | None,
                        fallback: Fallback | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        n.ROUTE_MODEL: decision.model,
        n.ROUTE_POLICY: decision.policy, n.ROUTE_REASON: decision.reason,
        n.ROUTE_REJECTED: decision.rejected_count,
        n.ROUTE_CANDIDATES: int(np.count_nonzero(decision.alive))
        if decision.alive is not None else len(decision.order),
    }
    if fallback is not None:
        attrs[n.ROUTE_FALLBACK_ASKED] = fallback.asked
        attrs[n.ROUTE_FALLBACK_FROM] = fallback.came_from
        attrs[n.ROUTE_FALLBACK_REASON] = fallback.reason
    head = decision.order.tolist()
    if not head:
        return attrs
    endpoints, idx = decision.endpoints, decision.idx.tolist()
    # a tuple of strings: the OTLP encoder encodes it once per retry order
    attrs[n.ROUTE_ORDER] = tuple([endpoints[idx[k]].id for k in head])
    best = _best_two(decision, head)
    chosen = endpoints[idx[best[0]]]
    attrs[n.ROUTE_CHOSEN_VENDOR] = chosen.vendor
    attrs[n.ROUTE_CHOSEN_ACCELERATOR] = chosen.accelerator
    attrs[n.ROUTE_CHOSEN_ENGINE] = chosen.engine
    columns = [("score", decision.total.tolist())] if decision.total is not None else []
    columns += [("scores." + name, v.tolist()) for name, v in decision.scores.items()]
    if decision.estimates is not None:
        columns += [("estimate." + name, decision.estimates[name].tolist())
                    for name in n.ROUTE_ESTIMATES]
    for prefix, k in zip((n.ROUTE_CHOSEN, n.ROUTE_RUNNER_UP), best, strict=False):
        ep = endpoints[idx[k]]
        attrs[n.route_attr(prefix, "endpoint")] = ep.id
        attrs[n.route_attr(prefix, "pool")] = ep.pool
        for name, values in columns:
            value = values[k]
            if math.isfinite(value):
                attrs[n.route_attr(prefix, name)] = value
    cost = _estimated_cost(decision, best[0], columns, max_tokens)
    if cost is not None:
        attrs[n.ROUTE_ESTIMATED_COST] = cost
    return attrs


def _best_two(decision: Decision, head: list[int]) -> list[int]:
    """The chosen candidate and the runner-up, as ``decision.full_order()[:2]`` has them
    (the next in retry order, else the best total of the other eligible ones, the first of
    equals, NaN last) without ordering every candidate (a shortlist has hundreds)."""
    total, alive = decision.total, decision.alive
    if len(head) >= 2 or total is None or alive is None or len(alive) == 1:
        return head[:2]
    rest = np.flatnonzero(alive)
    rest = rest[rest != head[0]]
    if not len(rest):
        return head
    scored = rest[~np.isnan(total[rest])]
    if not len(scored):
        return [head[0], int(rest[0])]
    return [head[0], int(scored[np.argmax(total[scored])])]


def _estimated_cost(decision: Decision, k: int, columns: list[tuple[str, list[float]]],
                    max_tokens: int | None) -> float | None:
    """Replica $/s x predicted e2e / (requests already active + this one).

    e2e = TTFT + TPOT x (tokens - 1), as ``routing/estimate.py`` predicts it, from the
    estimates already read for the span.
    """
    if decision.estimates is None:
        return None
    found = dict(columns)
    ttft, tpot = found["estimate.ttft_s"][k], found["estimate.tpot_s"][k]
    e2e = ttft + tpot * ((max_tokens or DEFAULT_MAX_TOKENS) - 1)
    active = float(decision.estimates["active"][k])
    if not (math.isfinite(e2e) and math.isfinite(active)):
        return None
    return charge_usd(decision.endpoints[decision.idx[k]].usd_per_s, e2e, active + 1.0)
