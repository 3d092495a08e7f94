"""Observability end to end: OTLP traces from a real `fleetgate serve`, /metrics, costs, logs.

* Traces: a local OTLP/HTTP receiver (protobuf decoded with opentelemetry-proto) gets the
  spans of a real gateway process pointed at it by ``OTEL_EXPORTER_OTLP_ENDPOINT``; the test
  checks names, kinds, parent/child links, attributes, a retried request, a stream, an
  incoming ``traceparent`` continued, and the ``traceparent`` each emulated engine received.
* Metrics: an in-process gateway's ``/metrics`` parsed with prometheus_client; the cost
  series add up to the sum of the per-request charges in the JSON request log and to
  ``/admin/costs``.

Two emulated engines are shared by the module; each test runs its own gateway.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client.parser import text_string_to_metric_families

from inproc import inproc_gateway, tick
from procs import Proc, pool, spawn_emulator, spawn_gateway

PUBLIC_8B, SERVED_8B = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
MESSAGES = [{"role": "user", "content": "hello"}]
MODELS = {PUBLIC_8B: SERVED_8B}
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
CALLER_STATE = "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Proc]]:
    procs = {"vllm": spawn_emulator("vllm", "h100", [SERVED_8B], speed=50),
             "sglang": spawn_emulator("sglang", "mi300x", [SERVED_8B], speed=50)}
    yield procs
    for p in procs.values():
        p.stop()


def _config(engines: dict[str, Proc]) -> dict[str, Any]:
    """Round robin over h100 (vLLM) then mi300x (SGLang): request k starts on endpoint k % 2."""
    return {"pools": [
        pool("h100-vllm", "h100", "vllm", 2.95, [engines["vllm"].url], MODELS),
        pool("mi300x-sglang", "mi300x", "sglang", 1.99, [engines["sglang"].url], MODELS)]}


def _faults(engine: Proc, **knobs: object) -> None:
    httpx.post(engine.url + "/emulator/faults", json=knobs).raise_for_status()


# ---------------------------------------------------------------- the OTLP receiver

class OtlpReceiver:
    """OTLP/HTTP (protobuf) on a local port; keeps every span with its resource attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    raw = gzip.decompress(raw)
                receiver.add(ExportTraceServiceRequest.FromString(raw))
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    self.spans.extend((resource, s) for s in ss.spans)

    def wait_for(self, ready: Any, timeout: float = 20.0) -> list[tuple[dict[str, Any], Span]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if ready(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans did not arrive: {[s.name for _, s in spans]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


# ---------------------------------------------------------------- traces

def _send_traffic(gw: Proc, engines: dict[str, Proc]) -> None:
    body = {"model": PUBLIC_8B, "messages": MESSAGES, "max_tokens": 4, "temperature": 0.5}
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, headers={
        "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "x-request-id": "caller-1",
        "tracestate": CALLER_STATE})
    assert resp.status_code == 200
    _faults(engines["vllm"], fail_next=1, fail_status=503)  # one of the next two is retried
    for rid in ("retry-a", "retry-b"):
        resp = httpx.post(gw.url + "/v1/chat/completions", json=body,
                          headers={"x-request-id": rid})
        assert resp.status_code == 200
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(
        model=PUBLIC_8B, messages=MESSAGES, max_tokens=5, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, extra_headers={"x-request-id": "stream-1"}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    done = client.completions.create(model=PUBLIC_8B, prompt="hi", max_tokens=3,
                                     extra_headers={"x-request-id": "completion-1"})
    assert done.usage is not None and done.usage.completion_tokens == 3
    long = {**body, "max_tokens": 4000, "stream": True}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=long,
                      headers={"x-request-id": "abort-1"}) as resp:
        assert next(resp.iter_lines()).startswith("data: ")  # then the client goes away


def _complete(spans: list[tuple[dict[str, Any], Span]]) -> bool:
    """Six server spans, and under each its route span and one client span per attempt."""
    servers = [s for _, s in spans if s.kind == Span.SPAN_KIND_SERVER]
    if len(servers) < 6:
        return False
    children = Counter(s.parent_span_id for _, s in spans)
    return all(children[s.span_id] == 1 + attributes(s.attributes)["fleetgate.attempts"]
               for s in servers)


def test_traces_reach_an_otlp_receiver(engines: dict[str, Proc], tmp_path: Path) -> None:
    receiver = OtlpReceiver()
    gw = spawn_gateway(_config(engines), tmp_path, env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"})
    try:
        _send_traffic(gw, engines)
        spans = receiver.wait_for(_complete)
        recorded = {name: httpx.get(p.url + "/emulator/requests").json()["requests"]
                    for name, p in engines.items()}
        metrics = httpx.get(gw.url + "/metrics").text
        costs = httpx.get(gw.url + "/admin/costs").json()
    finally:
        gw.stop()
        receiver.close()
    traces = _by_request(spans)
    assert set(traces) == {"caller-1", "retry-a", "retry-b", "stream-1", "completion-1",
                           "abort-1"}
    span_usd = sum(attributes(s.attributes)["fleetgate.cost.usd"] for s, _, _ in traces.values())
    _check_aborted(*traces.pop("abort-1"))
    for rid, (server, route, clients) in traces.items():
        _check_trace(rid, server, route, clients, recorded)
    _check_caller_trace(*traces["caller-1"], recorded)
    retried = [t for rid, t in traces.items() if rid.startswith("retry") and len(t[2]) == 2]
    assert len(retried) == 1, "exactly one request was retried"
    _check_retried(*retried[0])
    _check_stream(*traces["stream-1"])
    assert attributes(traces["completion-1"][2][0].attributes)["gen_ai.operation.name"] == \
        "text_completion"
    assert {r["service.name"] for r, _ in spans} == {"fleetgate"}
    assert _metric_sum(metrics, "fleetgate_cost_usd") == pytest.approx(span_usd, rel=1e-9)
    assert costs["total"]["usd"] == pytest.approx(span_usd, rel=1e-9)


Trace = tuple[Span, Span, list[Span]]


def _by_request(spans: list[tuple[dict[str, Any], Span]]) -> dict[str, Trace]:
    children: dict[bytes, list[Span]] = defaultdict(list)
    for _, s in spans:
        children[s.parent_span_id].append(s)
    out = {}
    for _, s in spans:
        if s.kind == Span.SPAN_KIND_SERVER:
            kids = children[s.span_id]
            (route,) = [k for k in kids if k.name == "route"]
            clients = sorted((k for k in kids if k.kind == Span.SPAN_KIND_CLIENT),
                             key=lambda k: attributes(k.attributes)["fleetgate.attempt"])
            out[attributes(s.attributes)["fleetgate.request_id"]] = (s, route, clients)
    return out


def _check_trace(rid: str, server: Span, route: Span, clients: list[Span],
                 recorded: dict[str, list[dict[str, Any]]]) -> None:
    sa = attributes(server.attributes)
    assert server.name.startswith("POST /v1/")
    assert sa["http.response.status_code"] == 200 and sa["gen_ai.request.model"] == PUBLIC_8B
    assert sa["fleetgate.cost.usd"] > 0
    assert sa["fleetgate.tenant"] == "anonymous"
    assert route.trace_id == server.trace_id and route.kind == Span.SPAN_KIND_INTERNAL
    ra = attributes(route.attributes)
    assert ra["fleetgate.route.policy"] == "round_robin" and ra["fleetgate.route.candidates"] == 2
    assert ra["fleetgate.route.chosen.endpoint"] == attributes(clients[0].attributes)[
        "fleetgate.endpoint"]
    assert {ra["fleetgate.route.chosen.pool"], ra["fleetgate.route.runner_up.pool"]} == \
        {"h100-vllm", "mi300x-sglang"}
    assert ra["fleetgate.route.chosen.vendor"] == ("amd" if ra["fleetgate.route.chosen.pool"]
                                                   == "mi300x-sglang" else "nvidia")
    assert "fleetgate.route.estimated_cost_usd" in ra
    ok = clients[-1]
    ca = attributes(ok.attributes)
    assert ok.trace_id == server.trace_id and ok.status.code != Status.STATUS_CODE_ERROR
    assert ca["gen_ai.provider.name"] in ("vllm", "sglang")
    assert ca["gen_ai.request.model"] == ca["gen_ai.response.model"] == SERVED_8B
    assert ca["gen_ai.usage.input_tokens"] > 0 and ca["gen_ai.usage.output_tokens"] > 0
    assert ca["server.address"] == "127.0.0.1" and ca["server.port"] > 0
    assert ca["gen_ai.request.max_tokens"] == ca["gen_ai.usage.output_tokens"]
    assert sum(attributes(c.attributes)["fleetgate.cost.usd"] for c in clients) == \
        pytest.approx(sa["fleetgate.cost.usd"])
    engine = "vllm" if ca["fleetgate.pool"] == "h100-vllm" else "sglang"
    (sent,) = [r["headers"]["traceparent"].split("-") for r in recorded[engine]
               if r["headers"].get("x-request-id") == rid]
    version, trace_id, parent_id, flags = sent  # the engine's parent is the attempt's span
    assert (version, trace_id, parent_id) == ("00", ok.trace_id.hex(), ok.span_id.hex()), rid
    assert int(flags, 16) & 1  # sampled


def _check_caller_trace(server: Span, route: Span, clients: list[Span],
                        recorded: dict[str, list[dict[str, Any]]]) -> None:
    assert server.trace_id.hex() == CALLER_TRACE and server.parent_span_id.hex() == CALLER_SPAN
    assert attributes(clients[0].attributes)["gen_ai.request.temperature"] == 0.5
    state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"  # the caller's, without its blanks
    assert {s.trace_state for s in (server, route, *clients)} == {state}
    (sent,) = [r["headers"] for rs in recorded.values() for r in rs
               if r["headers"].get("x-request-id") == "caller-1"]
    assert sent["tracestate"] == state  # the caller's vendors' state goes on to the engine


def _check_retried(server: Span, route: Span, clients: list[Span]) -> None:
    failed, ok = clients
    fa = attributes(failed.attributes)
    assert fa["fleetgate.pool"] == "h100-vllm" and fa["http.response.status_code"] == 503
    assert fa["error.type"] == "503" and failed.status.code == Status.STATUS_CODE_ERROR
    assert fa["fleetgate.cost.usd"] >= 0
    assert attributes(ok.attributes)["fleetgate.attempt"] == 1
    assert attributes(server.attributes)["fleetgate.attempts"] == 2


def _check_aborted(server: Span, route: Span, clients: list[Span]) -> None:
    """A stream the client left: both spans end then, the attempt marked cancelled."""
    (client,) = clients
    assert attributes(server.attributes)["http.response.status_code"] == 499
    assert attributes(client.attributes)["error.type"] == "cancelled"
    assert [e.name for e in client.events] == ["first_token"]
    assert attributes(client.attributes)["fleetgate.cost.usd"] > 0  # it used the GPU


def _check_stream(server: Span, route: Span, clients: list[Span]) -> None:
    (client,) = clients
    assert [e.name for e in client.events] == ["first_token"]
    assert attributes(client.events[0].attributes)["fleetgate.ttft_s"] > 0
    assert attributes(server.attributes)["fleetgate.stream"] is True
    assert server.end_time_unix_nano >= client.end_time_unix_nano  # ends with the stream


# ---------------------------------------------------------------- metrics, costs, logs

def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _metric_sum(text: str, family: str, **match: str) -> float:
    f = _families(text)[family]
    return sum(s.value for s in f.samples if s.name.endswith("_total")
               and all(s.labels.get(k) == v for k, v in match.items()))


async def test_metrics_and_costs_add_up(engines: dict[str, Proc], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _faults(engines["vllm"], fail_next=1, fail_status=503)  # request 0 starts there: retried
    async with inproc_gateway(_config(engines), tmp_path) as (url, state), \
            httpx.AsyncClient(base_url=url) as client:
        for k in range(6):
            body = {"model": PUBLIC_8B, "messages": MESSAGES, "max_tokens": 3 + k,
                    "stream": k % 2 == 1}
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200
        await tick(state)
        text = (await client.get("/metrics")).text
        costs = (await client.get("/admin/costs")).json()
    lines = [orjson.loads(x) for x in capsys.readouterr().err.splitlines()
             if x.startswith('{"ts"')]
    assert len(lines) == 6 and {x["status"] for x in lines} == {200}
    _check_request_series(text, lines)
    logged_usd = sum(x["cost_usd"] for x in lines)
    assert _metric_sum(text, "fleetgate_cost_usd") == pytest.approx(logged_usd, rel=1e-9)
    assert costs["total"]["usd"] == pytest.approx(logged_usd, rel=1e-9)
    failed = _metric_sum(text, "fleetgate_cost_usd", pool="h100-vllm", outcome="failed")
    assert failed > 0 and costs["total"]["failed_usd"] == pytest.approx(failed)
    pools = {p["pool"]: p for p in costs["pools"]}
    assert pools["h100-vllm"]["failed_attempts"] == 1
    assert sum(p["output_tokens"] for p in pools.values()) == sum(x["output_tokens"]
                                                                 for x in lines)
    for p in pools.values():
        assert p["usd_per_mtok"] == pytest.approx(p["usd"] / p["output_tokens"] * 1e6)
    _check_endpoint_gauges(text)


def _check_request_series(text: str, lines: list[dict[str, Any]]) -> None:
    fams = _families(text)
    by_pool = Counter(x["pool"] for x in lines)
    for pool_name, n in by_pool.items():
        assert _metric_sum(text, "fleetgate_requests", pool=pool_name, status="200",
                           model=PUBLIC_8B, policy="round_robin") == n
    assert _metric_sum(text, "fleetgate_retries", pool="h100-vllm") == 1
    assert _metric_sum(text, "fleetgate_upstream_attempts", outcome="failed") == 1
    assert _metric_sum(text, "fleetgate_upstream_attempts", outcome="ok") == 6
    assert _metric_sum(text, "fleetgate_routing_decisions", policy="round_robin") == 6
    assert _metric_sum(text, "fleetgate_output_tokens") == sum(x["output_tokens"] for x in lines)
    assert _metric_sum(text, "fleetgate_input_tokens") == sum(x["input_tokens"] for x in lines)
    counts = {s.name: s.value for f in ("fleetgate_time_to_first_token_seconds",
                                        "fleetgate_e2e_request_latency_seconds")
              for s in fams[f].samples if s.name.endswith("_count")}
    assert sum(s.value for s in fams["fleetgate_time_to_first_token_seconds"].samples
               if s.name.endswith("_count")) == 3  # the streams
    assert sum(s.value for s in fams["fleetgate_e2e_request_latency_seconds"].samples
               if s.name.endswith("_count")) == 6, counts


def _check_endpoint_gauges(text: str) -> None:
    fams = _families(text)

    def gauge(name: str) -> dict[str, float]:
        return {s.labels["endpoint"]: s.value for s in fams[name].samples}

    ids = {"h100-vllm-0", "mi300x-sglang-0"}
    assert set(gauge("fleetgate_endpoint_info")) == ids
    assert gauge("fleetgate_endpoint_in_flight") == dict.fromkeys(ids, 0.0)
    assert gauge("fleetgate_endpoint_breaker_state") == dict.fromkeys(ids, 0.0)
    assert gauge("fleetgate_endpoint_ready") == dict.fromkeys(ids, 1.0)
    assert set(gauge("fleetgate_endpoint_queue_depth")) == ids
    assert gauge("fleetgate_endpoint_price_usd_per_hour") == {"h100-vllm-0": 2.95,
                                                              "mi300x-sglang-0": 1.99}
    assert gauge("fleetgate_scrape_errors") == dict.fromkeys(ids, 0.0)
    tps = gauge("fleetgate_endpoint_tokens_per_second")["h100-vllm-0"]  # vLLM's counter delta
    assert gauge("fleetgate_endpoint_usd_per_mtok")["h100-vllm-0"] == \
        pytest.approx(2.95 / 3600 / tps * 1e6)
