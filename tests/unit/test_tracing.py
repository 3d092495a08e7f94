"""Tracing: configuration from OTEL_* variables, and the spans one request makes.

Spans are captured in memory (no exporter thread, no network) from the real observer fed a
real routing decision over the routing test fleet.
"""

from __future__ import annotations

import random

import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    TraceIdRatioBased,
)
from opentelemetry.sdk.trace.sampling import Sampler as SdkSampler
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    TraceState,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry
from routing_fixtures import MODEL, SERVED, make_fleet, pipeline, request
from test_costs import endpoint

from fleetgate.gateway.costs import CostLedger
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.observer import AttemptResult
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.telemetry.logs import RequestLog
from fleetgate.gateway.telemetry.metrics import GatewayMetrics
from fleetgate.gateway.telemetry.otlp import OtlpHttpExporter as Http
from fleetgate.gateway.telemetry.recorder import TelemetryObserver
from fleetgate.gateway.telemetry.tracing import (
    Tracing,
    exporters_from_env,
    parse_traceparent,
    parse_tracestate,
    sampler_from_env,
)

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(("env", "kinds"), [
    ({}, []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, [Http]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"}, [Http]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [Grpc]),
    ({"OTEL_TRACES_EXPORTER": "console"}, [ConsoleSpanExporter]),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, [Http, ConsoleSpanExporter]),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, []),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, []),
])
def test_exporters_from_env(env: dict[str, str], kinds: list[type]) -> None:
    exporters = exporters_from_env(env)
    assert [type(e) for e in exporters] == kinds
    for e in exporters:
        e.shutdown()

def request_of(observer, request_id, path, routing, traceparent, body):  # type: ignore[no-untyped-def]
    """``observer.request`` for a proxied request on ``path`` (the request object's fields)."""
    api = next(a for a in APIS.values() if a.path == path)
    return observer.request(ProxyRequest(api, routing, body, request_id, traceparent=traceparent))



def test_http_endpoint_gets_the_traces_path() -> None:
    (exporter,) = exporters_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT + "/"})
    assert exporter.endpoint == ENDPOINT + "/v1/traces"  # type: ignore[attr-defined]


@pytest.mark.parametrize("env", [{"OTEL_TRACES_EXPORTER": "zipkin"},
                                 {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
                                  "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}])
def test_unsupported_exporter_fails_loudly(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="OTEL_"):
        exporters_from_env(env)


CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


def _traced_request() -> tuple[list[ReadableSpan], list[dict[str, str]]]:
    memory = InMemorySpanExporter()
    tracing = Tracing(Resource.create({}), sampler_from_env({}), [memory])
    observer = TelemetryObserver(GatewayMetrics(CollectorRegistry()), CostLedger(),
                                 RequestLog(None), tracing, lambda _: 0.0)
    live = make_fleet()
    decision = pipeline("cost", slo={"ttft_ms": 2000, "tpot_ms": 100}).route(
        request(), live.snapshot(1.0))
    first, second = decision.ranked_endpoints(2)
    req = request_of(observer, "rid-1", "/v1/chat/completions", request(stream=True),
                           f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", {"temperature": 0.2})
    req.routed(decision)
    headers = []
    for number, info, fails in ((0, first, True), (1, second, False)):
        vendor = info.vendor
        ep = endpoint(info.pool, info.accelerator, vendor, info.engine, 2.0)
        attempt = req.attempt(ep, SERVED, number)
        headers.append(attempt.headers())
        if fails:
            attempt.failed(503, "queue full")
        else:
            attempt.first_token(0.25)
            attempt.finished(AttemptResult(200, {"prompt_tokens": 7, "completion_tokens": 9},
                                           0.25, 1.0, 1.0))
    req.end(200)
    tracing.shutdown()  # exports what is queued
    return list(memory.get_finished_spans()), headers


def test_spans_of_a_retried_request() -> None:
    spans, headers = _traced_request()
    by_name = {s.name: s for s in spans}
    server = by_name["POST /v1/chat/completions"]
    route = by_name["route"]
    clients = sorted((s for s in spans if s.kind == SpanKind.CLIENT),
                     key=lambda s: s.attributes["fleetgate.attempt"])  # type: ignore[index]
    assert len(spans) == 4 and len(clients) == 2
    assert server.kind == SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == CALLER_TRACE  # the caller's trace goes on
    assert server.parent is not None and format(server.parent.span_id, "016x") == CALLER_SPAN
    for child in (route, *clients):
        assert child.parent is not None and child.parent.span_id == server.context.span_id
        assert child.context.trace_id == server.context.trace_id
    for span, sent in zip(clients, headers, strict=True):  # the engine's parent is the attempt
        assert sent["traceparent"] == \
            f"00-{server.context.trace_id:032x}-{span.context.span_id:016x}-01"
    failed, ok = clients
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["error.type"] == "503"  # type: ignore[index]
    assert ok.name == f"chat {SERVED}"
    assert [e.name for e in ok.events] == ["first_token"]
    attrs = dict(ok.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == SERVED
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (7, 9)
    assert attrs["gen_ai.request.max_tokens"] == 128
    assert attrs["gen_ai.request.temperature"] == 0.2
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", 9001)
    assert attrs["fleetgate.cost.usd"] == pytest.approx(2.0 / 3600)
    total = sum(c.attributes["fleetgate.cost.usd"] for c in clients)  # type: ignore[index]
    assert server.attributes["fleetgate.cost.usd"] == pytest.approx(total)  # type: ignore[index]
    assert server.attributes["fleetgate.attempts"] == 2  # type: ignore[index]
    assert server.attributes["gen_ai.request.model"] == MODEL  # type: ignore[index]


def test_route_span_explains_the_choice() -> None:
    spans, _ = _traced_request()
    attrs = dict(next(s for s in spans if s.name == "route").attributes or {})
    assert attrs["fleetgate.route.policy"] == "cost"
    assert attrs["fleetgate.route.candidates"] == 4
    assert len(attrs["fleetgate.route.order"]) >= 2  # type: ignore[arg-type]
    for who in ("chosen", "runner_up"):
        prefix = f"fleetgate.route.{who}"
        for key in ("endpoint", "pool", "score",
                    "scores.cost", "estimate.ttft_s", "estimate.usd_per_mtok"):
            assert f"{prefix}.{key}" in attrs, f"{prefix}.{key}"
    assert attrs["fleetgate.route.chosen.endpoint"] == attrs["fleetgate.route.order"][0]  # type: ignore[index]
    assert attrs["fleetgate.route.estimated_cost_usd"] > 0  # type: ignore[operator]


def test_unsampled_request_writes_no_span_but_tells_the_engine() -> None:
    memory = InMemorySpanExporter()
    tracing = Tracing(Resource.create({}), sampler_from_env({"OTEL_TRACES_SAMPLER": "always_off"}),
                      [memory])
    lines: list[bytes] = []
    observer = TelemetryObserver(GatewayMetrics(CollectorRegistry()), CostLedger(),
                                 RequestLog(lines.append), tracing, lambda _: 0.0)
    req = request_of(observer, "rid-2", "/v1/chat/completions", request(), None, {})
    attempt = req.attempt(endpoint("h100-vllm", "h100", "nvidia", "vllm", 2.0), SERVED, 0)
    version, trace, _, flags = attempt.headers()["traceparent"].split("-")
    assert version == "00" and not int(flags, 16) & 1  # the engine is told: not sampled
    attempt.finished(AttemptResult(200, None, None, 0.5, 1.0))
    req.end(200)
    tracing.shutdown()
    assert memory.get_finished_spans() == ()
    assert trace in lines[0].decode()  # the log line still carries the trace id


@pytest.mark.parametrize(("value", "arg", "sdk"), [
    (None, None, ParentBased(ALWAYS_ON)),
    ("always_on", None, ALWAYS_ON),
    ("always_off", None, ALWAYS_OFF),
    ("parentbased_always_off", None, ParentBased(ALWAYS_OFF)),
    ("traceidratio", "0.25", TraceIdRatioBased(0.25)),
    ("parentbased_traceidratio", "0.5", ParentBased(TraceIdRatioBased(0.5))),
    ("traceidratio", "1e-9", TraceIdRatioBased(1e-9)),
])
def test_sampler_decides_as_the_sdks(value: str | None, arg: str | None, sdk: SdkSampler) -> None:
    """fleetgate applies the sampler itself: the SDK's decision on random trace ids, with no
    caller, a sampled caller and an unsampled one."""
    env = {k: v for k, v in (("OTEL_TRACES_SAMPLER", value), ("OTEL_TRACES_SAMPLER_ARG", arg))
           if v is not None}
    mine = sampler_from_env(env)
    rng = random.Random(3)
    for _ in range(3000):
        trace_id = rng.getrandbits(128) or 1
        for caller in (None, 0x01, 0x00):
            context = Context()
            if caller is not None:
                parent = SpanContext(trace_id, 7, True, TraceFlags(caller))
                context = set_span_in_context(NonRecordingSpan(parent))
            expected = sdk.should_sample(context, trace_id, "x").decision.is_sampled()
            assert mine.sampled(trace_id, caller) == expected, (value, hex(trace_id), caller)


@pytest.mark.parametrize("value", [
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
    " 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03 ",
    "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more",  # 00 has no more
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
    "00-_af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
    "", "garbage",
])
def test_traceparent_is_read_as_the_sdk_propagator_reads_it(value: str) -> None:
    found = get_current_span(TraceContextTextMapPropagator().extract(
        {"traceparent": value})).get_span_context()
    expected = (found.trace_id, found.span_id, int(found.trace_flags)) if found.is_valid \
        else None
    assert parse_traceparent(value) == expected


@pytest.mark.parametrize("value", [
    "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
    " congo=t61rcWkgMzE ,\t, rojo=00f067aa0ba902b7,",  # blanks and empty members
    "tenant@vendor=x y", "a=1,a=2", "Upper=1", "a=trailing ", "a==b", "a=b,garbage",
    ",".join(f"k{i}=v" for i in range(32)), ",".join(f"k{i}=v" for i in range(33)),
    "k" * 257 + "=v", "",
])
def test_tracestate_is_read_as_the_sdk_reads_it(value: str) -> None:
    assert parse_tracestate(value) == TraceState.from_header([value]).to_header()


def test_the_callers_tracestate_goes_on_with_its_trace_only() -> None:
    tracing = Tracing(Resource.create({}), sampler_from_env({}), [])
    caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    assert tracing.begin(caller, "a=1, b=2").state == "a=1,b=2"
    assert tracing.begin(None, "a=1").state == ""  # no valid parent: a new trace, no state
    assert tracing.begin("garbage", "a=1").state == ""
    tracing.shutdown()


def test_resource_and_batching_come_from_the_given_env() -> None:
    from fleetgate.gateway.telemetry.tracing import start_tracing

    tracing = start_tracing({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "gw-eu",
                             "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,a=b%20c",
                             "OTEL_BSP_SCHEDULE_DELAY": "50"})
    assert tracing is not None
    attrs = tracing.resource.attributes
    assert (attrs["service.name"], attrs["deployment.environment"], attrs["a"]) == \
        ("gw-eu", "prod", "b c")
    tracing.shutdown()
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER"):
        start_tracing({"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "jaeger"})


def test_route_span_runner_up_is_the_full_orders_second() -> None:
    """The route span names the runner-up without ordering every candidate; on random
    decisions (ties, NaN and infinite totals, filtered candidates, retry orders of one or
    more) it is the second of ``Decision.full_order()``, as it was when the span used that."""
    import numpy as np

    from fleetgate.gateway.telemetry.routespan import _best_two
    from fleetgate.routing import Decision

    rng = np.random.default_rng(7)
    for _ in range(2000):
        n = int(rng.integers(1, 9))
        total = rng.choice([0.1, 0.2, 0.5, np.nan, np.inf, -np.inf], size=n)
        alive = rng.random(n) < 0.7
        eligible = np.flatnonzero(alive)
        if not len(eligible):
            continue
        head = rng.permutation(eligible)[:int(rng.integers(1, len(eligible) + 1))]
        decision = Decision("p", "m", "r", idx=np.arange(n), order=head.astype(np.intp),
                            total=total, alive=alive)
        assert _best_two(decision, head.tolist()) == decision.full_order()[:2]
