"""Scrape-time series of the fleet scaler (``gateway/autoscaler.py``), per autoscaled pool:

- ``fleetgate_pool_desired_replicas{pool}``: the replicas the scaler wants (what KEDA's
  Prometheus trigger or an HPA's external metric reads: ``deploy/k8s``);
- ``fleetgate_pool_replicas{pool, state}``: ready, starting and draining replicas;
- ``fleetgate_pool_usd_per_hour{pool}``: what the pool's replicas bill now.

Read from the scaler's last tick when Prometheus scrapes; nothing is kept here.

May touch: the scaler (read only), prometheus_client. Must not touch: the request path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from fleetgate.gateway.autoscaler import GatewayScaler
from fleetgate.gateway.telemetry import names as n


class ScalingCollector:
    def __init__(self, scaler: GatewayScaler) -> None:
        self._scaler = scaler

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        desired, replicas, bill = families = self._families()
        for name, row in self._scaler.report()["pools"].items():
            desired.add_metric([name], float(row["desired"]))
            for state in ("ready", "starting", "draining"):
                replicas.add_metric([name, state], float(row[state]))
            bill.add_metric([name], float(row["usd_per_hour"]))
        return iter(families)

    @staticmethod
    def _families() -> list[Any]:
        return [
            GaugeMetricFamily(n.M_POOL_DESIRED, "Replicas the fleet scaler wants for an "
                              "autoscaled pool", labels=["pool"]),
            GaugeMetricFamily(n.M_POOL_REPLICAS, "Replicas of an autoscaled pool by state",
                              labels=["pool", "state"]),
            GaugeMetricFamily(n.M_POOL_USD_PER_HOUR, "What an autoscaled pool's replicas "
                              "bill now, $/hour", labels=["pool"]),
        ]
