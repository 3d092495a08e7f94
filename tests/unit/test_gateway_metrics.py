"""The per-request series held in buffers (one process) expose exactly what prometheus_client's
own children would: the same counters, buckets, counts and sums, on every read."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, generate_latest

from fleetgate.gateway.telemetry.metrics import E2E_BUCKETS, GatewayMetrics
from fleetgate.gateway.telemetry.names import M_E2E


def _feed(metrics: GatewayMetrics, rng: random.Random, n: int) -> None:
    for _ in range(n):
        pool = rng.choice(["a", "b"])
        metrics.requests("m", pool, f"{pool}-0", rng.choice(["200", "503"]), "p").inc()
        metrics.cost(pool, "m", "t", "ok").inc(rng.choice([0.25, 0.5, 1.0]))
        # on a bound, between bounds, past the last one
        metrics.e2e(pool).observe(rng.choice([*E2E_BUCKETS, 0.01, 0.7, 400.0]))


def test_buffered_series_read_as_direct_ones() -> None:
    direct, held = CollectorRegistry(), CollectorRegistry()
    plain, buffered = GatewayMetrics(direct), GatewayMetrics(held, buffered=True)
    for round_ in range(3):  # each read flushes; later increments land on top
        _feed(plain, random.Random(round_), 200)
        _feed(buffered, random.Random(round_), 200)
        got, want = _values(held), _values(direct)
        assert got.keys() == want.keys()
        assert all(math.isclose(got[k], want[k], rel_tol=1e-12) for k in want)  # sum order
    counts = [held.get_sample_value(f"{M_E2E}_count", {"pool": p}) for p in "ab"]
    assert sum(c or 0 for c in counts) == 600


def _values(registry: CollectorRegistry) -> dict[str, float]:
    """Each sample of the exposition, but the children's creation times (they differ)."""
    lines = generate_latest(registry).decode().splitlines()
    return {name: float(value) for name, _, value in (line.rpartition(" ") for line in lines)
            if not name.startswith("#") and "_created" not in name}


def test_tracing_losses_are_counted() -> None:
    """A span the full queue drops and a batch the collector never got are series, not only
    a log line: a gateway tracing into an unreachable collector says so on /metrics."""
    from opentelemetry.trace import SpanKind

    from fleetgate.gateway.settings import Settings
    from fleetgate.gateway.telemetry import build_telemetry
    from fleetgate.gateway.telemetry.names import M_SPAN_EXPORT_FAILURES, M_SPANS_DROPPED
    from fleetgate.gateway.telemetry.spanrecord import SpanRecord

    telemetry = build_telemetry(Settings(), lambda: None, env={  # type: ignore[arg-type,return-value]
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_BSP_MAX_QUEUE_SIZE": "2", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    tracing = telemetry.tracing
    assert tracing is not None
    record = SpanRecord("x", SpanKind.INTERNAL, 1, 2, 0, False, 1, 1, 2, {}, None)
    with tracing.batcher._lock:  # the export thread holds off while the queue fills
        for _ in range(5):
            tracing.emit(record)
    tracing.shutdown()  # the two queued spans go out (by the thread or now): refused
    registry = telemetry.registry
    assert registry.get_sample_value(f"{M_SPANS_DROPPED}_total") == 3
    assert registry.get_sample_value(f"{M_SPAN_EXPORT_FAILURES}_total") == 1
