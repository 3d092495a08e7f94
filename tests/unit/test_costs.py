"""Cost accounting: the attribution rule, the ledger, and what the observer charges where.

The observer is driven directly through the seam (no HTTP) with a fake clock, so every
number is exact: the charge of each attempt, its metric series, the ledger's report and the
request's log line must all agree.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import math

import orjson
import pytest
from prometheus_client import CollectorRegistry

from fleetgate.catalog.engines import ENGINES
from fleetgate.gateway.costs import CostLedger, LedgerSnapshot, attempt_charge
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.observer import AttemptResult
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.telemetry.logs import FLUSH_S, RequestLog, StreamSink
from fleetgate.gateway.telemetry.metrics import GatewayMetrics
from fleetgate.gateway.telemetry.recorder import TelemetryObserver
from fleetgate.routing import Decision, Endpoint, RoutingRequest

MODEL = "llama-3.1-8b"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"

def request_of(observer, request_id, path, routing, traceparent, body):  # type: ignore[no-untyped-def]
    """``observer.request`` for a proxied request on ``path`` (the request object's fields)."""
    api = next(a for a in APIS.values() if a.path == path)
    return observer.request(ProxyRequest(api, routing, body, request_id, traceparent=traceparent))



def endpoint(pool: str, accelerator: str, vendor: str, engine: str, price: float,
             gpus: int = 1) -> Endpoint:
    return Endpoint(id=f"{pool}-0", pool=pool, source="http://x", engine=ENGINES[engine],
                    accelerator=accelerator, vendor=vendor, runtime="rocm" if vendor == "amd"
                    else "cuda", gpus_per_replica=gpus, price_per_gpu_hour=price,
                    models={MODEL: SERVED}, url=f"http://127.0.0.1:{9000 + gpus}")


H100 = endpoint("h100-vllm", "h100", "nvidia", "vllm", 2.95)
MI300X = endpoint("mi300x-sglang", "mi300x", "amd", "sglang", 1.99, gpus=2)


@pytest.mark.parametrize(("price", "gpus", "e2e", "conc", "usd", "gpu_s"), [
    (3.60, 1, 10.0, 1.0, 0.01, 10.0),  # whole replica for 10 s at $3.60/h = 1 cent
    (2.00, 2, 9.0, 2.0, 0.005, 9.0),  # $4/h replica, shared by 2: 4.5 replica-s
    (1.99, 8, 1.0, 0.5, 1.99 * 8 / 3600, 8.0),  # concurrency below 1 counts as 1
    (2.95, 1, -1.0, 1.0, 0.0, 0.0),  # a negative duration (clock skew) charges nothing
])
def test_attribution_rule(price: float, gpus: int, e2e: float, conc: float, usd: float,
                          gpu_s: float) -> None:
    charge = attempt_charge(endpoint("p", "h100", "nvidia", "vllm", price, gpus), e2e, conc)
    assert charge.usd == pytest.approx(usd)
    assert charge.gpu_seconds == pytest.approx(gpu_s)
    assert charge.replica_seconds == pytest.approx(gpu_s / gpus)


def test_a_busy_replica_is_charged_exactly_its_price() -> None:
    """B requests sharing a replica for T seconds are charged T replica-seconds in all."""
    total = sum(attempt_charge(H100, 30.0, 8.0).usd for _ in range(8))
    assert total == pytest.approx(2.95 / 3600 * 30.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.clock = Clock()
        self.ledger = CostLedger(clock=lambda: 1_000.0)
        self.lines: list[bytes] = []
        self.in_flight: dict[str, float] = {}
        self.observer = TelemetryObserver(
            GatewayMetrics(self.registry, buffered=True), self.ledger,
            RequestLog(self.lines.append), None,
            lambda ep_id: self.in_flight.get(ep_id, 0.0), clock=self.clock)

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def records(self) -> list[dict]:
        return [orjson.loads(line) for line in self.lines]


def _decision() -> Decision:
    return Decision("cheapest", MODEL, "meets the SLO: best score (cheapest)")


def test_a_retried_request_is_charged_for_both_attempts() -> None:
    h = Harness()
    req = request_of(h.observer, "r1", "/v1/chat/completions", RoutingRequest(MODEL, stream=True),
                             None, {"model": MODEL})
    req.routed(_decision())
    h.in_flight[H100.id] = 2.0  # two others on it throughout: mean of 3 (with us) and 2
    first = req.attempt(H100, SERVED, 0)
    assert first.headers() == {}  # tracing off: nothing to inject
    h.clock.now += 1.0
    first.failed(503, "queue full")
    second = req.attempt(MI300X, SERVED, 1)
    second.first_token(0.5)
    second.finished(AttemptResult(200, {"prompt_tokens": 10, "completion_tokens": 21}, 0.5,
                                  4.5, 2.0))
    h.clock.now += 5.0
    req.end(200)

    failed_usd = 2.95 / 3600 * 1.0 / 2.5
    ok_usd = 1.99 * 2 / 3600 * 4.5 / 2.0
    (line,) = h.records()
    assert line["cost_usd"] == pytest.approx(failed_usd + ok_usd)
    assert {k: line[k] for k in ("request_id", "pool", "endpoint", "status", "attempts",
                                 "input_tokens", "output_tokens", "ttft_ms", "e2e_ms",
                                 "tenant", "policy", "trace_id")} == {
        "request_id": "r1", "pool": "mi300x-sglang", "endpoint": "mi300x-sglang-0",
        "status": 200, "attempts": 2, "input_tokens": 10, "output_tokens": 21,
        "ttft_ms": 500.0, "e2e_ms": 6000.0, "tenant": "anonymous", "policy": "cheapest",
        "trace_id": None}
    assert "messages" not in line and "content" not in line

    cost = "fleetgate_cost_usd_total"
    assert h.sample(cost, pool="h100-vllm", model=MODEL, tenant="anonymous",
                    outcome="failed") == pytest.approx(failed_usd)
    assert h.sample(cost, pool="mi300x-sglang", model=MODEL, tenant="anonymous",
                    outcome="ok") == pytest.approx(ok_usd)
    assert h.sample("fleetgate_retries_total", model=MODEL, policy="cheapest",
                    pool="h100-vllm") == 1
    assert h.sample("fleetgate_requests_total", model=MODEL, pool="mi300x-sglang",
                    endpoint="mi300x-sglang-0", status="200", policy="cheapest") == 1
    assert h.sample("fleetgate_upstream_attempts_total", pool="h100-vllm",
                    endpoint="h100-vllm-0", outcome="failed") == 1
    assert h.sample("fleetgate_output_tokens_total", pool="mi300x-sglang", model=MODEL) == 21
    assert h.sample("fleetgate_input_tokens_total", pool="h100-vllm", model=MODEL) == 0
    assert h.sample("fleetgate_time_per_output_token_seconds_sum",
                    pool="mi300x-sglang") == pytest.approx(4.0 / 20)
    assert h.sample("fleetgate_time_to_first_token_seconds_count", pool="mi300x-sglang") == 1
    assert h.sample("fleetgate_gpu_seconds_total", pool="mi300x-sglang",
                    model=MODEL) == pytest.approx(4.5)
    assert h.sample("fleetgate_routing_decisions_total", policy="cheapest", pool="none",
                    reason="meets the SLO: best score (cheapest)") == 1
    _check_report(h.ledger.report(), failed_usd, ok_usd)


def _check_report(report: dict, failed_usd: float, ok_usd: float) -> None:
    pools = {row["pool"]: row for row in report["pools"]}
    h100, mi300x = pools["h100-vllm"], pools["mi300x-sglang"]
    assert (h100["requests"], h100["attempts"], h100["failed_attempts"]) == (0, 1, 1)
    assert h100["usd"] == h100["failed_usd"] == pytest.approx(failed_usd)
    assert h100["usd_per_mtok"] is None and h100["tokens_per_usd"] == 0.0
    assert (mi300x["requests"], mi300x["output_tokens"], mi300x["tokens"]) == (1, 21, 31)
    assert mi300x["gpu_hours"] == pytest.approx(4.5 / 3600)
    assert mi300x["replica_hours"] == pytest.approx(2.25 / 3600)
    assert mi300x["usd_per_mtok"] == pytest.approx(ok_usd / 21 * 1e6)
    assert mi300x["tokens_per_usd"] == pytest.approx(21 / ok_usd)
    assert (mi300x["accelerator"], mi300x["vendor"], mi300x["gpus_per_replica"]) == \
        ("mi300x", "amd", 2)
    assert report["total"]["usd"] == pytest.approx(failed_usd + ok_usd)
    assert report["total"]["failed_usd"] == pytest.approx(failed_usd)
    (tenant,) = report["tenants"]
    assert tenant["tenant"] == "anonymous" and tenant["usd"] == pytest.approx(ok_usd + failed_usd)
    (model,) = report["models"]
    assert model["model"] == MODEL and model["requests"] == 1
    assert {(r["pool"], r["model"]) for r in report["pool_models"]} == \
        {("h100-vllm", MODEL), ("mi300x-sglang", MODEL)}


def test_cancelled_attempt_is_charged_as_waste_and_tenant_is_kept() -> None:
    h = Harness()
    req = request_of(h.observer, "r2", "/v1/completions",
                             RoutingRequest(MODEL, tenant="team-a"), "00-" + "ab" * 16 + "-" +
                             "cd" * 8 + "-01", {})
    req.routed(_decision())
    attempt = req.attempt(H100, SERVED, 0)
    h.clock.now += 3.0
    attempt.cancelled()
    req.end(499, "client disconnected")
    req.end(499)  # a second end is ignored
    (line,) = h.records()
    assert line["trace_id"] == "ab" * 16  # the caller's trace, even with tracing off
    assert line["cost_usd"] == pytest.approx(2.95 / 3600 * 3.0)
    assert h.sample("fleetgate_cost_usd_total", pool="h100-vllm", model=MODEL,
                    tenant="team-a", outcome="cancelled") == pytest.approx(line["cost_usd"])
    assert h.sample("fleetgate_requests_total", model=MODEL, pool="h100-vllm",
                    endpoint="h100-vllm-0", status="499", policy="cheapest") == 1
    (tenant,) = h.ledger.report()["tenants"]
    assert tenant["tenant"] == "team-a" and tenant["failed_attempts"] == 1


def test_no_capacity_is_counted_without_a_charge() -> None:
    h = Harness()
    req = request_of(h.observer, "r3", "/v1/chat/completions", RoutingRequest(MODEL), None, {})
    req.routed(_decision())
    req.end(503, "no endpoint can serve the model")
    assert h.sample("fleetgate_requests_total", model=MODEL, pool="none", endpoint="none",
                    status="503", policy="cheapest") == 1
    assert h.records()[0]["cost_usd"] == 0.0
    assert h.ledger.report()["pools"] == []
    assert math.isclose(h.ledger.total_usd(), 0.0)


def test_request_log_can_be_off() -> None:
    h = Harness()
    h.observer.log = RequestLog(None)
    req = request_of(h.observer, "r4", "/v1/chat/completions", RoutingRequest(MODEL), None, {})
    req.end(200)
    assert h.lines == []


class _Bytes:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def flush(self) -> None:
        pass


class _Stream(io.StringIO):
    """A text stream over bytes that keeps each write."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = _Bytes()

    @property
    def buffer(self) -> _Bytes:  # type: ignore[override]
        return self.bytes

    @property
    def writes(self) -> list[bytes]:
        return self.bytes.writes


async def test_request_log_lines_go_out_together_and_at_close() -> None:
    stream = _Stream()
    sink = StreamSink(stream)
    sink(b"a\n")
    due = sink.due
    sink(b"b\n")
    assert stream.writes == [] and sink.due is due  # one write due for both
    assert due is not None and due.when() <= asyncio.get_running_loop().time() + FLUSH_S
    sink.flush()  # what the timer runs
    assert stream.writes == [b"a\nb\n"] and sink.due is None and due.cancelled()
    sink(b"c\n")
    assert sink.due is not None
    sink.close()  # the app stops: no wait, the timer cancelled, none after
    sink(b"d\n")
    assert stream.writes == [b"a\nb\n", b"c\n", b"d\n"] and sink.due is None


def test_a_fleet_report_adds_the_other_replicas_snapshots() -> None:
    """Replica A's live ledger plus B's published snapshot: totals, tenants and pools are
    the fleet's, ``replicas`` keeps each part; a snapshot survives encode/decode exactly."""
    h100 = dataclasses.replace(H100, engine="vllm")  # as the fleet builds them: engine names
    mi300x = dataclasses.replace(MI300X, engine="sglang")
    a, b = CostLedger(clock=lambda: 2_000.0), CostLedger(clock=lambda: 1_500.0)
    a.tally(h100, MODEL, "team-a").add_attempt(attempt_charge(h100, 2.0, 1.0), True, 10, 20)
    b.tally(h100, MODEL, "team-a").add_attempt(attempt_charge(h100, 4.0, 2.0), True, 5, 7)
    b.tally(mi300x, MODEL, "team-b").add_attempt(attempt_charge(mi300x, 1.0, 1.0), False)
    snap = LedgerSnapshot.decode(b.snapshot().encode())
    assert snap == b.snapshot()
    with pytest.raises(ValueError):
        LedgerSnapshot.decode(b'{"since": 1}')
    report = a.report("A", {"B": snap, "A": snap})  # its own id among the peers: ignored
    assert report["total"]["usd"] == pytest.approx(a.total_usd() + b.total_usd())
    assert report["total"]["output_tokens"] == 27
    assert report["since"] == 1_500.0 and report["replica"] == "A"
    assert {r["replica"]: r["usd"] for r in report["replicas"]} == {
        "A": pytest.approx(a.total_usd()), "B": pytest.approx(b.total_usd())}
    tenants = {t["tenant"]: t for t in report["tenants"]}
    assert tenants["team-a"]["output_tokens"] == 27
    assert tenants["team-b"]["failed_attempts"] == 1
    assert {p["pool"]: p["accelerator"] for p in report["pools"]} == {
        "h100-vllm": "h100", "mi300x-sglang": "mi300x"}
    assert a.report()["total"]["usd"] == pytest.approx(a.total_usd())  # alone
