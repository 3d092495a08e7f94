"""The lean OTLP/HTTP exporter: its bytes decode to what the SDK's own encoder produces.

Table of spans covering every attribute type, events, statuses, remote and local parents,
trace state, and several resources and scopes; then one real export over HTTP (gzip,
headers from OTEL_* variables) to a local receiver.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from fleetgate.gateway.telemetry.otlp import SpanEncoder, http_exporter_from_env

RESOURCE = Resource.create({"service.name": "fleetgate", "service.version": "0.1.0"})
OTHER = Resource({"service.name": "other", "k8s.pod": "p-1"}, schema_url="https://x/1.0")
SCOPE = InstrumentationScope("fleetgate", "0.1.0")
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
ATTRS = {"s": "text", "empty": "", "uni": "μ-тест", "t": True, "f": False, "i": 42,
         "big": 2**62, "neg": -7, "zero": 0, "x": 0.25, "inf": float("inf"),
         "words": ["a", "b"], "ints": [1, 2, 3], "floats": [0.5], "bools": [True]}


def _span(name: str, span_id: int, parent: SpanContext | None = None, **kw: object
          ) -> ReadableSpan:
    ctx = SpanContext(0xABC, span_id, False, SAMPLED, kw.pop("trace_state", None))  # type: ignore[arg-type]
    base: dict[str, object] = {"resource": RESOURCE, "attributes": dict(ATTRS),
                               "kind": SpanKind.CLIENT, "start_time": 1_000 + span_id,
                               "end_time": 9_000_000_000 + span_id,
                               "instrumentation_scope": SCOPE}
    base.update(kw)
    return ReadableSpan(name, ctx, parent, **base)  # type: ignore[arg-type]


REMOTE = SpanContext(0xABC, 0x77, True, SAMPLED)
LOCAL = SpanContext(0xABC, 0x1, False, SAMPLED)
SPANS = [
    _span("POST /v1/chat/completions", 1, REMOTE, kind=SpanKind.SERVER),
    _span("route", 2, LOCAL, kind=SpanKind.INTERNAL, attributes={"only": "one"}),
    _span("chat m", 3, LOCAL, events=[Event("first_token", {"fleetgate.ttft_s": 0.1}, 5)],
          status=Status(StatusCode.ERROR, "HTTP 503: queue full")),
    _span("no attributes", 4, None, attributes={}, status=Status(StatusCode.OK)),
    _span("traced state", 5, LOCAL, trace_state=TraceState([("vendor", "v1")])),
    _span("other resource", 6, None, resource=OTHER),
    _span("other scope", 7, None, instrumentation_scope=InstrumentationScope("x", None)),
    _span("no scope", 8, None, instrumentation_scope=None),
]


@pytest.mark.parametrize("spans", [SPANS[:1], SPANS[:3], SPANS, SPANS[::-1]],
                         ids=["one", "three", "all", "reversed"])
def test_encoder_matches_the_sdk_encoder(spans: list[ReadableSpan]) -> None:
    encoder = SpanEncoder()
    for _ in range(2):  # the second time from the caches
        mine = ExportTraceServiceRequest.FromString(encoder.request(spans))
        assert mine == encode_spans(spans)


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["content-length"]))
                receiver.bodies.append(({k.lower(): v for k, v in self.headers.items()}, raw))
                status = 200 if self.path == "/v1/traces" else 404
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_export_over_http_with_gzip_and_headers(receiver: Receiver) -> None:
    exporter = http_exporter_from_env({
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=abc%20d,Tenant=t1",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"}, receiver.url + "/v1/traces")
    for _ in range(2):  # the second export reuses the kept-alive connection
        assert exporter.export(SPANS[:3]) == SpanExportResult.SUCCESS
    exporter.shutdown()
    assert len(receiver.bodies) == 2
    headers, raw = receiver.bodies[0]
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["content-encoding"] == "gzip"
    assert (headers["x-api-key"], headers["tenant"]) == ("abc d", "t1")
    assert ExportTraceServiceRequest.FromString(gzip.decompress(raw)) == encode_spans(SPANS[:3])


def test_export_failures_are_reported_not_raised(receiver: Receiver) -> None:
    wrong_path = http_exporter_from_env({}, receiver.url + "/elsewhere")
    assert wrong_path.export(SPANS[:1]) == SpanExportResult.FAILURE
    receiver.server.shutdown()
    receiver.server.server_close()
    closed = http_exporter_from_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}, receiver.url)
    assert closed.export(SPANS[:1]) == SpanExportResult.FAILURE


@pytest.mark.parametrize(("env", "endpoint"), [
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "http://127.0.0.1:1/v1/traces"),
    ({}, "ftp://collector/v1/traces"),
])
def test_bad_exporter_settings_fail_loudly(env: dict[str, str], endpoint: str) -> None:
    with pytest.raises(ValueError):
        http_exporter_from_env(env, endpoint)
