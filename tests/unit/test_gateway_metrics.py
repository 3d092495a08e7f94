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
