"""Prometheus metrics: one private ``CollectorRegistry`` per app, served at ``GET /metrics``.

Two kinds of series:

* **Pushed per request** (``GatewayMetrics``): requests, attempts, retries, decisions,
  TTFT / TPOT / end-to-end histograms per pool, tokens and cost. Labelled children are
  resolved once per label set and cached in plain dicts (``prometheus_client``'s
  ``labels()`` takes a lock and builds a key on every call). In one process, each child's
  increments are added up in a plain buffer (``_Buffered``, ``_BufferedHistogram``) and
  handed to the child when the registry is read (``_Flush``, collected first; ``/metrics``
  reads it on the event loop, where the increments are made, so nothing is lost between
  the two): a request pays an attribute add per series instead of ``prometheus_client``'s
  locked call chain (~8% of a plain request's CPU), and every scrape sees every request.
* **Read at scrape time** (``FleetCollector``): per-endpoint queue depth, running, in-flight,
  KV usage, readiness, breaker state, measured tokens/s, $/Mtok, price, and the collector's
  scrape errors, all read from the live fleet of the current generation when Prometheus
  scrapes, never pushed per request.

Under ``serve --workers N`` (``PROMETHEUS_MULTIPROC_DIR`` set by the supervisor) the pushed
series live in prometheus_client's per-process files, written at once (no buffer: another
worker's scrape reads them), and a scrape of any worker sums every worker's
(``MultiProcessCollector``); the scrape-time gauges are the answering worker's view,
whose in-flight count adds the other workers' (the shares they exchange, ``state/sync.py``).

May touch: prometheus_client, the live fleet state (read only). Must not touch: HTTP, the
request path's control flow.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetgate.catalog.pricing import usd_per_mtok
from fleetgate.gateway.telemetry import names as n
from fleetgate.state.fleet import Fleet

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class _Buffered:
    """A counter child's increments, held until the registry is read."""

    __slots__ = ("child", "pending")

    def __init__(self, child: Any) -> None:
        self.child, self.pending = child, 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.pending += amount

    def flush(self) -> None:
        if self.pending:
            self.child.inc(self.pending)
            self.pending = 0.0


class _BufferedHistogram:
    """A histogram child's observations as per-bucket counts and a sum, held until the
    registry is read (then added to the child's own bucket and sum values)."""

    __slots__ = ("bounds", "child", "counts", "sum")

    def __init__(self, child: Any) -> None:
        self.child, self.bounds = child, child._upper_bounds  # ends with +Inf
        self.counts, self.sum = [0] * len(self.bounds), 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # the first bound >= amount
        self.sum += amount

    def flush(self) -> None:
        if any(self.counts):
            self.child._sum.inc(self.sum)
            for bucket, count in zip(self.child._buckets, self.counts, strict=True):
                if count:
                    bucket.inc(count)
            self.counts, self.sum = [0] * len(self.bounds), 0.0


class _Flush:
    """Registered first: hands every buffer to its child before the registry is read."""

    def __init__(self) -> None:
        self.buffers: list[_Buffered | _BufferedHistogram] = []

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        for buffer in self.buffers:
            buffer.flush()
        return iter(())

    def hold(self, child: Any, histogram: bool) -> _Buffered | _BufferedHistogram:
        buffer = _BufferedHistogram(child) if histogram else _Buffered(child)
        self.buffers.append(buffer)
        return buffer


def _cached(metric: Any, flush: _Flush | None = None) -> Callable[..., Any]:
    """``labels(*values)`` with the child cached per label tuple; buffered with ``flush``."""
    children: dict[tuple[str, ...], Any] = {}
    histogram = isinstance(metric, Histogram)

    def child(*values: str) -> Any:
        found = children.get(values)
        if found is None:
            found = metric.labels(*values)
            if flush is not None:
                found = flush.hold(found, histogram)
            children[values] = found
        return found

    return child


class GatewayMetrics:
    """The per-request series (see the module docstring); names in ``names.py``.
    ``buffered``: increments are held until the registry is read (one process only)."""

    def __init__(self, registry: CollectorRegistry, buffered: bool = False) -> None:
        flush = None
        if buffered:
            flush = _Flush()
            registry.register(flush)  # before the series: collected first

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Callable[..., Any]:
            return _cached(Counter(name, doc, labels, registry=registry), flush)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Callable[..., Any]:
            return _cached(Histogram(name, doc, ("pool",), registry=registry, buckets=buckets),
                           flush)

        self.requests = counter(n.M_REQUESTS, "Requests answered, by final endpoint and status",
                                ("model", "pool", "endpoint", "status", "policy"))
        self.attempts = counter(n.M_ATTEMPTS, "Upstream attempts by outcome (ok, failed, "
                                "cancelled)", ("pool", "endpoint", "outcome"))
        self.retries = counter(n.M_RETRIES, "Attempts after the first, by the pool that "
                               "failed before", ("model", "policy", "pool"))
        self.migrations = counter(n.M_MIGRATIONS, "Streams broken after their first byte and "
                                  "completed on another endpoint, by the pool that took over",
                                  ("model", "policy", "pool"))
        self.decisions = counter(n.M_DECISIONS, "Routing decisions by chosen pool and reason",
                                 ("policy", "pool", "reason"))
        self.ttft = histogram(n.M_TTFT, "Time to first token of streamed answers, from "
                              "dispatch", TTFT_BUCKETS)
        self.tpot = histogram(n.M_TPOT, "Time per output token after the first (streams)",
                              TPOT_BUCKETS)
        self.e2e = histogram(n.M_E2E, "Upstream attempt time, dispatch to last byte, of "
                             "successful attempts", E2E_BUCKETS)
        self.input_tokens = counter(n.M_INPUT_TOKENS, "Prompt tokens of successful attempts",
                                    ("pool", "model"))
        self.output_tokens = counter(n.M_OUTPUT_TOKENS, "Completion tokens of successful "
                                     "attempts", ("pool", "model"))
        self.cost = counter(n.M_COST, "GPU cost charged to requests (see docs/observability.md"
                            " for the rule), by attempt outcome",
                            ("pool", "model", "tenant", "outcome"))
        self.gpu_seconds = counter(n.M_GPU_SECONDS, "GPU-seconds charged to requests, all "
                                   "outcomes", ("pool", "model"))
        # tracing's losses: rare, and counted on the span batcher's thread, so not buffered
        self.spans_dropped = Counter(n.M_SPANS_DROPPED, "Spans dropped because the span "
                                     "queue was full (OTEL_BSP_MAX_QUEUE_SIZE)", registry=registry)
        self.span_export_failures = Counter(n.M_SPAN_EXPORT_FAILURES, "Span batches an "
                                            "exporter refused or could not send",
                                            registry=registry)


_GAUGES: tuple[tuple[str, str, str], ...] = (
    (n.M_EP_QUEUE, "queued", "Requests waiting at the engine (last scrape + dispatches since)"),
    (n.M_EP_RUNNING, "running", "Requests the engine runs (last scrape; absent when unknown)"),
    (n.M_EP_IN_FLIGHT, "in_flight", "Requests this gateway dispatched and has not seen finish"),
    (n.M_EP_KV, "kv_usage", "KV cache usage 0..1 (last scrape)"),
    (n.M_EP_TOKENS_PER_S, "tokens_per_s", "Measured output tokens/s of the engine (EWMA)"),
)


class FleetCollector:
    """Per-endpoint gauges read from the current generation's live state at scrape time."""

    def __init__(self, fleet: Callable[[], Fleet], with_peers: bool = False) -> None:
        self._fleet = fleet
        self._with_peers = with_peers  # in-flight: this process's plus its peers'

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        fleet = self._fleet()
        families = self._families()
        by_name: dict[str, Any] = {f.name: f for f in families}
        columns = {column: fleet.live.column(column) for _, column, _ in _GAUGES}
        if self._with_peers:
            columns["in_flight"] = columns["in_flight"] + fleet.live.column("peer_in_flight")
        for i, ep in enumerate(fleet.endpoints):
            labels = [ep.id, ep.pool]
            by_name[n.M_EP_INFO].add_metric(
                [ep.id, ep.pool, ep.accelerator, ep.vendor, ep.engine, ep.runtime], 1.0)
            for name, column, _ in _GAUGES:
                _add(by_name[name], labels, float(columns[column][i]))
            st = fleet.live.stats[i]
            _add(by_name[n.M_EP_READY], labels, float(st.health.state == "ready"))
            _add(by_name[n.M_EP_BREAKER], labels, float(n.BREAKER_CODES[st.breaker.state]))
            _add(by_name[n.M_EP_PRICE], labels, ep.price_per_replica_hour)
            per_mtok = usd_per_mtok(ep.usd_per_s, float(columns["tokens_per_s"][i]))
            if per_mtok is not None:
                _add(by_name[n.M_EP_USD_PER_MTOK], labels, per_mtok)
        errors = fleet.collector.scrape_errors if fleet.collector else {}
        for ep in fleet.endpoints:
            by_name[n.M_SCRAPE_ERRORS].add_metric(
                [ep.id, ep.pool], float(errors.get(ep.id, 0)))
        return iter(families)

    @staticmethod
    def _families() -> list[Metric]:
        labels = ["endpoint", "pool"]
        out: list[Metric] = [GaugeMetricFamily(
            n.M_EP_INFO, "Who each endpoint is (value 1)",
            labels=["endpoint", "pool", "accelerator", "vendor", "engine", "runtime"])]
        out += [GaugeMetricFamily(name, doc, labels=labels) for name, _, doc in _GAUGES]
        out += [
            GaugeMetricFamily(n.M_EP_READY, "1 when the health probe says ready", labels=labels),
            GaugeMetricFamily(n.M_EP_BREAKER, "Circuit breaker: 0 closed, 1 half_open, 2 open",
                              labels=labels),
            GaugeMetricFamily(n.M_EP_PRICE, "Replica price, $/hour (GPU price x GPUs)",
                              labels=labels),
            GaugeMetricFamily(n.M_EP_USD_PER_MTOK, "Replica $/s over measured output tokens/s,"
                              " per million tokens (absent until measured)", labels=labels),
            CounterMetricFamily(n.M_SCRAPE_ERRORS, "Failed engine /metrics scrapes (restarts "
                                "from 0 on a config reload)", labels=labels),
        ]
        return out


def _add(family: Any, labels: list[str], value: float) -> None:
    if not math.isnan(value) and not math.isinf(value):
        family.add_metric(labels, value)


def new_registry(fleet: Callable[[], Fleet]) -> tuple[CollectorRegistry, GatewayMetrics]:
    """A private registry with the per-request metrics and the scrape-time collector; under
    ``serve --workers``, every worker's per-request metrics (module doc)."""
    registry = CollectorRegistry(auto_describe=True)
    shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if shared_dir:
        metrics = GatewayMetrics(CollectorRegistry())  # values go to this process's files
        multiprocess.MultiProcessCollector(registry, shared_dir)
    else:
        metrics = GatewayMetrics(registry, buffered=True)
    registry.register(FleetCollector(fleet, with_peers=bool(shared_dir)))
    return registry, metrics
