"""Observability: traces, Prometheus metrics, cost accounting and the request log.

``build_telemetry(settings, fleet, env)`` is called once by the app's lifespan; the
``Telemetry`` it returns owns everything (a private metrics registry, the cost ledger, the
tracing and its span batcher when ``OTEL_*`` asks for them) and is closed with the app. Its
``observer`` is handed to ``ProxyService``: the request path only ever sees the
``Observer`` seam of ``gateway/proxy/observer.py``. Modules:

| module | holds |
|---|---|
| ``names.py`` | every span, attribute and metric name |
| ``recorder.py`` | the ``Observer`` implementation (request -> attempts -> end) |
| ``tracing.py`` | tracing from ``OTEL_*``: exporters, sampler, ids, the caller's trace context |
| ``spans.py`` / ``routespan.py`` | one request's span records; the route span's attributes |
| ``spanrecord.py`` | the span record, its batcher (the export thread), the SDK conversion |
| ``otlp.py`` | the lean OTLP/HTTP exporter |
| ``metrics.py`` | the per-request series and the scrape-time per-endpoint collector |
| ``scaling.py`` / ``spend.py`` | scrape-time series of the scaler; of budgets and shadow spend |
| ``logs.py`` | the one-JSON-line-per-request log |
| ``routes.py`` | ``GET /metrics`` |

The cost rule and the ledger behind ``GET /admin/costs`` are ``gateway/costs.py``.

May touch: gateway fleet and settings, telemetry libraries. Must not touch: the request
path (it only receives calls through the seam).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from fleetgate.gateway.costs import CostLedger
from fleetgate.gateway.settings import Settings
from fleetgate.gateway.telemetry.logs import request_log
from fleetgate.gateway.telemetry.metrics import new_registry
from fleetgate.gateway.telemetry.recorder import TelemetryObserver
from fleetgate.gateway.telemetry.tracing import Tracing, start_tracing
from fleetgate.state.fleet import Fleet


@dataclass(slots=True)
class Telemetry:
    observer: TelemetryObserver
    registry: CollectorRegistry
    ledger: CostLedger
    tracing: Tracing | None

    async def close(self) -> None:
        """Write the waiting request log lines; flush and stop the span exporters (they
        block, so off the event loop)."""
        self.observer.log.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)


def build_telemetry(settings: Settings, fleet: Callable[[], Fleet],
                    env: Mapping[str, str] | None = None) -> Telemetry:
    """Everything observability needs for one app; ``fleet`` returns the current fleet."""
    registry, metrics = new_registry(fleet)
    ledger = CostLedger()
    tracing = start_tracing(os.environ if env is None else env)
    if tracing is not None:
        tracing.batcher.on_drop = metrics.spans_dropped.inc
        tracing.batcher.on_failure = metrics.span_export_failures.inc

    def in_flight(endpoint_id: str) -> float:
        live = fleet().live
        i = live.index.get(endpoint_id)
        return 0.0 if i is None else live.value(i, "in_flight")

    observer = TelemetryObserver(metrics, ledger,
                                 request_log(settings.request_log, settings.log_level),
                                 tracing, in_flight)
    return Telemetry(observer, registry, ledger, tracing)


__all__ = ["Telemetry", "TelemetryObserver", "build_telemetry"]
