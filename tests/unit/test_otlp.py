"""The lean OTLP/HTTP exporter: its bytes decode to what the SDK's own encoder produces.

Table of span records covering every attribute type, events, statuses, remote and local
parents and a root; the SDK encoder is given the same records as the SDK's own values
(``to_readable``). Then one real export over HTTP (gzip, headers from OTEL_* variables) to
a local receiver, and a batcher's queue limit and flushes.
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
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

from fleetgate.gateway.telemetry.otlp import SpanEncoder, http_exporter_from_env
from fleetgate.gateway.telemetry.spanrecord import SpanBatcher, SpanRecord, to_readable

RESOURCE = Resource.create({"service.name": "fleetgate", "service.version": "0.1.0"})
SCHEMA = Resource({"service.name": "other", "k8s.pod": "p-1"}, schema_url="https://x/1.0")
SCOPE = InstrumentationScope("fleetgate", "0.1.0")
ATTRS = {"s": "text", "empty": "", "uni": "μ-тест", "t": True, "f": False, "i": 42,
         "big": 2**62, "neg": -7, "zero": 0, "x": 0.25, "inf": float("inf"),
         "words": ["a", "b"], "ints": [1, 2, 3], "floats": [0.5], "bools": [True]}


def _record(name: str, span_id: int, parent_id: int = 1, **kw: object) -> SpanRecord:
    base: dict[str, object] = {"kind": SpanKind.CLIENT, "trace_id": 0xABC, "span_id": span_id,
                               "parent_id": parent_id, "remote_parent": False, "flags": 3,
                               "start_ns": 1_000 + span_id, "end_ns": 9_000_000_000 + span_id,
                               "attrs": dict(ATTRS), "error": None}
    base.update(kw)
    return SpanRecord(name, **base)  # type: ignore[arg-type]


RECORDS = [
    _record("POST /v1/chat/completions", 1, 0x77, kind=SpanKind.SERVER, remote_parent=True),
    _record("route", 2, kind=SpanKind.INTERNAL, attrs={"only": "one"}),
    _record("chat m", 3, events=(("first_token", 5, {"fleetgate.ttft_s": 0.1}),),
            error="HTTP 503: queue full"),
    _record("no attributes", 4, 0, attrs={}, error=""),
    _record("root, unsampled flags", 5, 0, flags=0),
    _record("tuples and look-alikes", 6, attrs={"c": 1, "t": ("a", "b"), "m": (1, 2)}),
    _record("look-alikes", 7, attrs={"c": True, "t": ("a", "b"), "m": (True, 2.0)}),
    _record("a caller's tracestate", 8, 0x77, remote_parent=True, trace_state="a=1,b@c=2"),
]


def _sdk(records: list[SpanRecord], resource: Resource = RESOURCE) -> ExportTraceServiceRequest:
    return encode_spans([to_readable(r, resource, SCOPE) for r in records])


@pytest.mark.parametrize("records", [RECORDS[:1], RECORDS[:3], RECORDS, RECORDS[::-1]],
                         ids=["one", "three", "all", "reversed"])
@pytest.mark.parametrize("resource", [RESOURCE, SCHEMA], ids=["resource", "schema_url"])
def test_encoder_matches_the_sdk_encoder(records: list[SpanRecord], resource: Resource) -> None:
    encoder = SpanEncoder()
    for _ in range(2):  # the second time from the caches
        mine = ExportTraceServiceRequest.FromString(encoder.request(records, resource, SCOPE))
        assert mine == _sdk(records, resource)


class Collect:
    """An export function that keeps the batches and says when ``until`` spans came."""

    def __init__(self, until: int) -> None:
        self.got: list[list[SpanRecord]] = []
        self.until, self.done = until, threading.Event()

    def __call__(self, batch: list[SpanRecord]) -> bool:
        self.got.append(batch)
        if sum(map(len, self.got)) >= self.until:
            self.done.set()
        return True


def test_batcher_exports_in_batches_and_drops_past_its_queue() -> None:
    export = Collect(until=4)
    got, done = export.got, export.done
    batcher = SpanBatcher([export], max_queue_size=6, max_export_batch_size=2,
                          schedule_delay_millis=60_000)
    for r in RECORDS[:4]:  # a full batch wakes the thread: no waiting for the delay
        batcher.on_end(r)
    assert done.wait(10)
    assert all(len(b) <= 2 for b in got) and [r for b in got for r in b] == RECORDS[:4]
    with batcher._lock:  # the thread holds off: the queue fills and then drops
        for r in RECORDS * 2:
            batcher.on_end(r)
    assert batcher.dropped == 2 * len(RECORDS) - 6
    assert batcher.force_flush()
    assert sum(map(len, got)) == 10
    later = _record("later", 9, attrs={"now": 1}, later=lambda: {"then": 2.5})
    batcher.on_end(later)
    batcher.shutdown()  # exports what is queued, then stops the thread
    assert sum(map(len, got)) == 11 and not batcher._thread.is_alive()
    assert got[-1] == [later] and later.attrs == {"now": 1, "then": 2.5}  # made before export


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
        assert exporter.export(RECORDS[:3], RESOURCE, SCOPE)
    exporter.shutdown()
    assert len(receiver.bodies) == 2
    headers, raw = receiver.bodies[0]
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["content-encoding"] == "gzip"
    assert (headers["x-api-key"], headers["tenant"]) == ("abc d", "t1")
    assert ExportTraceServiceRequest.FromString(gzip.decompress(raw)) == _sdk(RECORDS[:3])


def test_export_failures_are_reported_not_raised(receiver: Receiver) -> None:
    wrong_path = http_exporter_from_env({}, receiver.url + "/elsewhere")
    assert not wrong_path.export(RECORDS[:1], RESOURCE, SCOPE)
    receiver.server.shutdown()
    receiver.server.server_close()
    closed = http_exporter_from_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}, receiver.url)
    assert not closed.export(RECORDS[:1], RESOURCE, SCOPE)


@pytest.mark.parametrize(("env", "endpoint"), [
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "http://127.0.0.1:1/v1/traces"),
    ({}, "ftp://collector/v1/traces"),
])
def test_bad_exporter_settings_fail_loudly(env: dict[str, str], endpoint: str) -> None:
    with pytest.raises(ValueError):
        http_exporter_from_env(env, endpoint)


def test_a_full_batch_exports_whole_batches_only() -> None:
    """Spans short of a batch wait for the delay or a flush: exporting them at once sent a
    POST per few spans at low load, without end."""
    export = Collect(until=4)
    got, four = export.got, export.done
    batcher = SpanBatcher([export], max_queue_size=10, max_export_batch_size=2,
                          schedule_delay_millis=60_000)
    with batcher._lock:
        for r in RECORDS[:5]:
            batcher.on_end(r)
    assert four.wait(10)
    with batcher._lock:  # the thread's turn is over
        assert [len(b) for b in got] == [2, 2] and len(batcher._queue) == 1
    batcher.shutdown()
    assert [len(b) for b in got] == [2, 2, 1]
