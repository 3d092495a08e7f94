"""Scrape-time series about spending limits: tenants' budgets and shadow traffic's spend.

- ``fleetgate_tenant_budget_usd{tenant, period}``: the $ budget per day / month from the
  config's keys (a tenant with several keys: the smallest cap, the one that refuses first),
  so an alert can compare ``increase(fleetgate_cost_usd_total[24h])`` with it.
- ``fleetgate_shadow_cost_usd_total{pool, serving_pool}`` and
  ``fleetgate_shadow_skipped_budget_total``: what this replica's mirrored copies cost and
  how many were skipped for the cap (``GET /admin/shadow``'s figures), and
  ``fleetgate_shadow_max_usd_per_hour{policy, pool}``: the cap itself.

Read from the app state when Prometheus scrapes; nothing is kept here.

May touch: the app state (read only), prometheus_client. Must not touch: the request path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetgate.gateway.telemetry import names as n

if TYPE_CHECKING:
    from fleetgate.gateway.state import AppState


class SpendCollector:
    def __init__(self, state: Callable[[], AppState | None]) -> None:
        self._state = state

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        budget, cost, skipped, cap = families = self._families()
        state = self._state()
        if state is None:
            return iter(families)
        caps: dict[tuple[str, str], float] = {}
        for key in state.config.auth.keys if state.config.auth else ():
            for period, usd in (("day", key.limits.usd_per_day),
                                ("month", key.limits.usd_per_month)):
                if usd is not None:
                    caps[key.tenant, period] = min(usd, caps.get((key.tenant, period), usd))
        for (tenant, period), usd in sorted(caps.items()):
            budget.add_metric([tenant, period], usd)
        if state.shadow is not None:
            for row in state.shadow.report()["candidates"]:
                labels = [row["pool"], row["serving_pool"]]
                cost.add_metric(labels, float(row["usd"]))
                skipped.add_metric(labels, float(row["skipped_budget"]))
        for policy, cfg in state.generation.shadow.items():
            cap.add_metric([policy, cfg.pool], cfg.max_usd_per_hour)
        return iter(families)

    @staticmethod
    def _families() -> list[Any]:
        shadow = ["pool", "serving_pool"]
        return [
            GaugeMetricFamily(n.M_TENANT_BUDGET, "Tenant $ budget per period (from the keys' "
                              "limits: usd_per_day, usd_per_month)", labels=["tenant", "period"]),
            CounterMetricFamily(n.M_SHADOW_COST, "$ charged to shadow copies by this replica "
                                "(not billed to tenants)", labels=shadow),
            CounterMetricFamily(n.M_SHADOW_SKIPPED, "Shadow copies skipped because the pool's "
                                "max_usd_per_hour was spent", labels=shadow),
            GaugeMetricFamily(n.M_SHADOW_CAP, "A policy's shadow spend cap, $/hour per replica",
                              labels=["policy", "pool"]),
        ]
