"""A lean OTLP/HTTP span exporter: protobuf written by hand, posted on a kept-alive connection.

Why not the SDK's ``OTLPSpanExporter``: its encoder builds a protobuf object per span, per
attribute and per value, about 150 us of CPU per span on the reference machine, which alone
would add ~25% to the gateway's CPU per request (BENCHMARKS.md "Tracing overhead"). This one
writes the same ``ExportTraceServiceRequest`` bytes directly (tests decode them with
opentelemetry-proto and compare with the SDK encoder's output), caching the encoded form of
keys and of repeated string attributes, at a few microseconds per span.

It is an ordinary ``SpanExporter`` behind the SDK's ``BatchSpanProcessor`` (export runs on the
processor's thread, never on the event loop) and reads the standard variables:
``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``, ``..._TIMEOUT`` (seconds, as the Python SDK reads
it), ``..._COMPRESSION`` (``gzip`` | ``none``), ``..._CERTIFICATE``,
``..._CLIENT_CERTIFICATE`` / ``..._CLIENT_KEY`` for https.

May touch: the network (the collector's URL only), ssl, gzip. Must not touch: the request
path, anything global.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import ssl
import struct
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("fleetgate.otlp")

_VARINTS = [bytes([i]) for i in range(128)]
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_TIMES = struct.Struct("<BQBQ")  # start and end: two fixed64 fields with their tags
_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # flags: HAS_IS_REMOTE
_REMOTE_PARENT = b"\x85\x01" + struct.pack("<I", 0x300)  # HAS_IS_REMOTE | IS_REMOTE
_CACHE_LIMIT = 8192


def _varint(n: int) -> bytes:
    if n < 128:
        return _VARINTS[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _any(value: Any) -> bytes:
    """An ``AnyValue`` message (without its own tag)."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v))
                                        for k, v in value.items()))
    return b""  # None: an empty AnyValue, as the SDK encoder writes it


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any(value))


class SpanEncoder:
    """ReadableSpans -> ``ExportTraceServiceRequest`` bytes; caches what repeats.

    Per field tag: for a float attribute the whole field header is cached by key; a string
    or small int attribute is cached whole by (key, value) in a table that is emptied when
    it reaches ``_CACHE_LIMIT`` entries (request ids never repeat).
    """

    def __init__(self) -> None:
        self._strings: dict[bytes, dict[tuple[str, Any], bytes]] = {}  # by field tag
        self._doubles: dict[bytes, dict[str, bytes]] = {}
        self._heads: dict[tuple[str, Any], bytes] = {}

    def request(self, spans: Sequence[ReadableSpan]) -> bytes:
        resources: dict[int, Any] = {}
        grouped: dict[int, dict[int, tuple[Any, list[bytes]]]] = defaultdict(dict)
        for span in spans:
            resources[id(span.resource)] = span.resource
            scope = span.instrumentation_scope
            group = grouped[id(span.resource)].setdefault(id(scope), (scope, []))
            group[1].append(self.span(span))
        out = []
        for rid, scopes in grouped.items():
            resource = resources[rid]
            body = _field(b"\x0a", self._attributes(resource.attributes, b"\x0a"))
            for scope, encoded in scopes.values():
                body += _field(b"\x12", _scope(scope) + b"".join(_field(b"\x12", s)
                                                                 for s in encoded)
                               + (_field(b"\x1a", scope.schema_url.encode())
                                  if scope is not None and scope.schema_url else b""))
            if resource.schema_url:
                body += _field(b"\x1a", resource.schema_url.encode())
            out.append(_field(b"\x0a", body))
        return b"".join(out)

    def span(self, span: ReadableSpan) -> bytes:
        ctx = span.get_span_context()
        assert ctx is not None
        parent = span.parent
        head = self._heads.get((span.name, span.kind))
        if head is None:  # name and kind fields, cached: spans are named per route/model
            head = self._heads[(span.name, span.kind)] = (
                _field(b"\x2a", span.name.encode()) + b"\x30" + _varint(span.kind.value + 1))
        parts = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"),
                 b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
        if ctx.trace_state:
            parts.append(_field(b"\x1a", ctx.trace_state.to_header().encode()))
        if parent is not None:
            parts += [b"\x22\x08", parent.span_id.to_bytes(8, "big")]
        parts += [head, _TIMES.pack(0x39, span.start_time or 0, 0x41, span.end_time or 0),
                  self._attributes(span.attributes, b"\x4a")]
        for event in span.events:
            ev = (b"\x09" + _FIXED64.pack(event.timestamp) + _field(b"\x12", event.name.encode())
                  + self._attributes(event.attributes, b"\x1a"))
            parts.append(_field(b"\x5a", ev))
        status = span.status
        if status.description or status.status_code.value:
            msg = _field(b"\x12", status.description.encode()) if status.description else b""
            if status.status_code.value:
                msg += b"\x18" + _varint(status.status_code.value)
            parts.append(_field(b"\x7a", msg))
        else:
            parts.append(b"\x7a\x00")  # an empty status, as the SDK encoder writes it
        parts.append(_REMOTE_PARENT if parent is not None and parent.is_remote else _LOCAL)
        return b"".join(parts)

    def _attributes(self, attrs: Mapping[str, Any] | None, tag: bytes) -> bytes:
        if not attrs:
            return b""
        strings = self._strings.get(tag)
        if strings is None or len(strings) >= _CACHE_LIMIT:
            strings = self._strings[tag] = {}
        doubles = self._doubles.setdefault(tag, {})
        out = []
        for item in attrs.items():  # the (key, value) tuple doubles as the cache key
            value = item[1]
            kind = type(value)
            if kind is str or (kind is int and 0 <= value < 4096):
                found = strings.get(item)
                if found is None:
                    found = strings[item] = _field(tag, _key_value(item[0], value))
                out.append(found)
            elif kind is float:
                head = doubles.get(item[0])
                if head is None:  # tag, length, key, then AnyValue{double}: 9 bytes
                    k = _field(b"\x0a", item[0].encode())
                    head = doubles[item[0]] = tag + _varint(len(k) + 11) + k + b"\x12\x09\x21"
                out.append(head + _DOUBLE.pack(value))
            else:
                out.append(_field(tag, _key_value(item[0], value)))
        return b"".join(out)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return _field(b"\x0a", b"")
    return _field(b"\x0a", _field(b"\x0a", scope.name.encode())
                  + (_field(b"\x12", scope.version.encode()) if scope.version else b""))


class OtlpHttpExporter(SpanExporter):
    """POSTs ``application/x-protobuf`` exports to ``endpoint`` (``.../v1/traces``)."""

    def __init__(self, endpoint: str, headers: Mapping[str, str] | None = None,
                 timeout_s: float = 10.0, compression: str = "none",
                 ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"OTLP endpoint {endpoint!r} is not an http(s) URL")
        self.endpoint = endpoint
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._path = parts.path or "/"
        self._headers = {"content-type": "application/x-protobuf", **(headers or {})}
        if compression == "gzip":
            self._headers["content-encoding"] = "gzip"
        self._gzip = compression == "gzip"
        self._timeout = timeout_s
        self._ssl = ssl_context
        self._conn: http.client.HTTPConnection | None = None
        self.encoder = SpanEncoder()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = self.encoder.request(spans)
        if self._gzip:
            body = gzip.compress(body)
        for _ in range(2):  # a kept-alive connection the collector closed: reconnect once
            try:
                conn = self._connection()
                conn.request("POST", self._path, body, self._headers)
                resp = conn.getresponse()
                resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                error = str(exc)
                continue
            if 200 <= resp.status < 300:
                return SpanExportResult.SUCCESS
            log.warning("OTLP export to %s: HTTP %d", self.endpoint, resp.status)
            return SpanExportResult.FAILURE
        log.warning("OTLP export to %s failed: %s", self.endpoint, error)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout,
                    context=self._ssl or ssl.create_default_context())
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self._timeout)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def http_exporter_from_env(env: Mapping[str, str], endpoint: str) -> OtlpHttpExporter:
    """The exporter for ``endpoint`` with the ``OTEL_EXPORTER_OTLP_*`` options in ``env``."""

    def get(name: str) -> str | None:
        return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}")

    headers = {}
    for item in (get("HEADERS") or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[unquote(key.strip()).lower()] = unquote(value.strip())
    compression = (get("COMPRESSION") or "none").strip().lower()
    if compression not in ("gzip", "none"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_COMPRESSION: {compression!r} (gzip or none)")
    context = None
    if get("CERTIFICATE") or get("CLIENT_CERTIFICATE"):
        context = ssl.create_default_context(cafile=get("CERTIFICATE"))
        if get("CLIENT_CERTIFICATE"):
            context.load_cert_chain(str(get("CLIENT_CERTIFICATE")), get("CLIENT_KEY"))
    return OtlpHttpExporter(endpoint, headers, float(get("TIMEOUT") or 10.0), compression,
                            context)
