"""A lean OTLP/HTTP span exporter: protobuf written by hand, posted on a kept-alive connection.

Why not the SDK's ``OTLPSpanExporter``: its encoder builds a protobuf object per span, per
attribute and per value, about 150 us of CPU per span on the reference machine, which alone
would add ~25% to the gateway's CPU per request (BENCHMARKS.md "Tracing overhead"). This one
writes the same ``ExportTraceServiceRequest`` bytes directly (tests decode them with
opentelemetry-proto and compare with the SDK encoder's output), caching the encoded form of
keys and of repeated string attributes, at a few microseconds per span.

It encodes the gateway's ``SpanRecord`` values as they are, with no SDK object between,
behind a ``SpanBatcher`` (``spanrecord.py``: export runs on the batcher's thread, never on
the event loop), and reads the standard variables:
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
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from fleetgate.gateway.telemetry.spanrecord import SpanRecord

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
    """SpanRecords -> ``ExportTraceServiceRequest`` bytes; caches what repeats.

    Per field tag: for a float attribute the whole field header is cached by key; a string
    or small int attribute is cached whole by (key, value) in a table that is emptied when
    it reaches ``_CACHE_LIMIT`` entries (request ids never repeat). The resource and scope
    wrapping is encoded once per (resource, scope).
    """

    def __init__(self) -> None:
        self._strings: dict[bytes, dict[tuple[str, Any], bytes]] = {}  # by field tag
        self._doubles: dict[bytes, dict[str, bytes]] = {}
        self._bools: dict[tuple[bytes, tuple[str, bool]], bytes] = {}
        self._heads: dict[tuple[str, Any], bytes] = {}
        self._wrap: tuple[Resource, InstrumentationScope, bytes, bytes, bytes] | None = None

    def request(self, records: Sequence[SpanRecord], resource: Resource,
                scope: InstrumentationScope) -> bytes:
        """One ResourceSpans holding one ScopeSpans holding every record."""
        wrap = self._wrap
        if wrap is None or wrap[0] is not resource or wrap[1] is not scope:
            wrap = self._wrap = (
                resource, scope, _field(b"\x0a", self._attributes(resource.attributes, b"\x0a")),
                _scope(scope), _field(b"\x1a", scope.schema_url.encode()) if scope.schema_url
                else b"")
        spans = b"".join([_field(b"\x12", self.span(r)) for r in records])
        body = wrap[2] + _field(b"\x12", wrap[3] + spans + wrap[4])
        if resource.schema_url:
            body += _field(b"\x1a", resource.schema_url.encode())
        return _field(b"\x0a", body)

    def span(self, r: SpanRecord) -> bytes:
        head = self._heads.get((r.name, r.kind))
        if head is None:  # name and kind fields, cached: spans are named per route/model
            head = self._heads[(r.name, r.kind)] = (
                _field(b"\x2a", r.name.encode()) + b"\x30" + _varint(r.kind.value + 1))
        parts = [b"\x0a\x10", r.trace_id.to_bytes(16, "big"),
                 b"\x12\x08", r.span_id.to_bytes(8, "big")]
        if r.trace_state:
            parts.append(_field(b"\x1a", r.trace_state.encode()))
        if r.parent_id:
            parts += [b"\x22\x08", r.parent_id.to_bytes(8, "big")]
        parts += [head, _TIMES.pack(0x39, r.start_ns, 0x41, r.end_ns),
                  self._attributes(r.attrs, b"\x4a")]
        for name, ts, attrs in r.events:
            ev = (b"\x09" + _FIXED64.pack(ts) + _field(b"\x12", name.encode())
                  + self._attributes(attrs, b"\x1a"))
            parts.append(_field(b"\x5a", ev))
        if r.error is None:
            parts.append(b"\x7a\x00")  # an empty status, as the SDK encoder writes it
        else:  # message, then code ERROR (2)
            parts.append(_field(b"\x7a", (_field(b"\x12", r.error.encode()) if r.error
                                          else b"") + b"\x18\x02"))
        parts.append(_REMOTE_PARENT if r.remote_parent else _LOCAL)
        return b"".join(parts)

    def _attributes(self, attrs: Mapping[str, Any] | None, tag: bytes) -> bytes:
        """KeyValue fields. Cached whole by (key, value): a string, a small int, a bool (in
        its own table: True == 1) and a tuple of strings (only those go in, so a lookup
        with any other tuple misses: no str equals a non-str)."""
        if not attrs:
            return b""
        strings = self._strings.get(tag)
        if strings is None or len(strings) >= _CACHE_LIMIT:
            strings = self._strings[tag] = {}
        doubles = self._doubles.setdefault(tag, {})
        out: list[bytes] = []
        append = out.append
        for item in attrs.items():  # the (key, value) tuple doubles as the cache key
            value = item[1]
            kind = type(value)
            if kind is float:
                head = doubles.get(item[0])
                if head is None:  # tag, length, key, then AnyValue{double}: 9 bytes
                    k = _field(b"\x0a", item[0].encode())
                    head = doubles[item[0]] = tag + _varint(len(k) + 11) + k + b"\x12\x09\x21"
                append(head)
                append(_DOUBLE.pack(value))
            elif kind is str or kind is tuple or (kind is int and 0 <= value < 4096):
                found = strings.get(item)
                if found is None:
                    found = _field(tag, _key_value(item[0], value))
                    if kind is not tuple or all(type(v) is str for v in value):
                        strings[item] = found
                append(found)
            elif kind is bool:
                found = self._bools.get((tag, item))
                if found is None:
                    found = self._bools[(tag, item)] = _field(tag, _key_value(item[0], value))
                append(found)
            else:
                append(_field(tag, _key_value(item[0], value)))
        return b"".join(out)


def _scope(scope: InstrumentationScope) -> bytes:
    return _field(b"\x0a", _field(b"\x0a", scope.name.encode())
                  + (_field(b"\x12", scope.version.encode()) if scope.version else b""))


class OtlpHttpExporter:
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

    def export(self, records: Sequence[SpanRecord], resource: Resource,
               scope: InstrumentationScope) -> bool:
        """POST one batch; False (logged) when the collector refused it or was unreachable."""
        body = self.encoder.request(records, resource, scope)
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
                return True
            log.warning("OTLP export to %s: HTTP %d", self.endpoint, resp.status)
            return False
        log.warning("OTLP export to %s failed: %s", self.endpoint, error)
        return False

    def shutdown(self) -> None:
        self._close()

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
