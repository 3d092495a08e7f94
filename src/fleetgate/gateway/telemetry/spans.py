"""The spans of one request: server span, ``route`` span, one client span per attempt.

Made only when tracing is on. ``RequestSpans`` holds the request's ``Trace`` (ids and the
sampling decision); an unsampled request still gets ids, so the upstream is told
``traceparent: ...-00`` (do not sample) and no span is written. Each span is written once,
when it ends (``Tracing.emit``): the route span when the decision is made, an attempt's
client span when its outcome is known, the server span when the request ends (for a stream:
when the stream ends or the client leaves), as a ``SpanRecord`` (``spanrecord.py``).

Names and attributes: ``names.py``; GenAI semantic conventions on the client spans
(``gen_ai.operation.name``, ``gen_ai.provider.name`` = the engine, ``gen_ai.request.model``
= the served model name, ``gen_ai.usage.*``, ``server.address``/``port``, ...), TTFT as a
``first_token`` event, errors as ``error.type`` plus an ERROR status.

May touch: opentelemetry span values, telemetry names, endpoint descriptions, routing
decisions. Must not touch: metrics, costs, HTTP.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.trace import SpanKind

from fleetgate.gateway.proxy.request import Fallback
from fleetgate.gateway.telemetry import names as n
from fleetgate.gateway.telemetry.routespan import decision_attributes
from fleetgate.gateway.telemetry.spanrecord import Attributes, SpanRecord
from fleetgate.gateway.telemetry.tracing import SAMPLED, Trace, Tracing, new_id
from fleetgate.routing import Decision, Endpoint, RoutingRequest


def _error(error_type: str | None, message: str | None) -> str | None:
    """The span's ERROR status description, None for an unset status."""
    return None if error_type is None else (message or error_type)[:500]


class RequestSpans:
    __slots__ = ("name", "sampled", "trace", "tracing")

    def __init__(self, tracing: Tracing, path: str, traceparent: str | None,
                 tracestate: str | None = None) -> None:
        self.tracing = tracing
        self.name = n.server_span_name(path)
        self.trace: Trace = tracing.begin(traceparent, tracestate)
        self.sampled = bool(self.trace.flags & SAMPLED)

    def route(self, decision: Decision, max_tokens: int | None,
              fallback: Fallback | None = None) -> None:
        if self.sampled:
            t = self.trace
            self.tracing.emit(SpanRecord(
                n.SPAN_ROUTE, SpanKind.INTERNAL, t.trace_id, new_id(64), t.span_id, False,
                t.flags, t.start_ns, time.time_ns(), {}, None, (),
                functools.partial(decision_attributes, decision, max_tokens, fallback),
                t.state))

    def attempt(self, endpoint: Endpoint, served: str, number: int, path: str,
                routing: RoutingRequest, body: Mapping[str, Any]) -> AttemptSpan:
        return AttemptSpan(self, endpoint, served, number, path, routing, body)

    def end(self, attrs: Attributes, error_type: str | None, message: str | None) -> None:
        """Write the server span (only called for a sampled request)."""
        t = self.trace
        self.tracing.emit(SpanRecord(self.name, SpanKind.SERVER, t.trace_id, t.span_id,
                                     t.parent_id, bool(t.parent_id), t.flags, t.start_ns,
                                     time.time_ns(), attrs, _error(error_type, message), (),
                                     None, t.state))


class AttemptSpan:
    __slots__ = ("attrs", "first_ns", "name", "request", "span_id", "start_ns", "ttft_s")

    def __init__(self, request: RequestSpans, ep: Endpoint, served: str, number: int,
                 path: str, routing: RoutingRequest, body: Mapping[str, Any]) -> None:
        self.request = request
        self.span_id = new_id(64)
        self.start_ns = time.time_ns()
        self.first_ns: int | None = None
        self.ttft_s = 0.0
        self.attrs: Attributes | None = None
        if request.sampled:
            operation = n.OPERATION_BY_PATH.get(path, "chat")
            self.name = n.client_span_name(operation, served)
            self.attrs = _attempt_attributes(request.tracing, operation, ep, served, number,
                                             routing, body)

    @property
    def recording(self) -> bool:
        return self.attrs is not None

    def headers(self) -> dict[str, str]:
        trace = self.request.trace
        if trace.state:
            return {"traceparent": trace.traceparent(self.span_id), "tracestate": trace.state}
        return {"traceparent": trace.traceparent(self.span_id)}

    def first_token(self, ttft_s: float) -> None:
        self.first_ns, self.ttft_s = time.time_ns(), ttft_s

    def end(self, attrs: Attributes, error_type: str | None = None,
            message: str | None = None) -> None:
        if self.attrs is None:  # not sampled
            return
        self.attrs.update(attrs)
        if error_type is not None:
            self.attrs[n.ERROR_TYPE] = error_type
        events = () if self.first_ns is None else (
            (n.EVENT_FIRST_TOKEN, self.first_ns, {n.TTFT_S: self.ttft_s}),)
        t = self.request.trace
        self.request.tracing.emit(SpanRecord(
            self.name, SpanKind.CLIENT, t.trace_id, self.span_id, t.span_id, False, t.flags,
            self.start_ns, time.time_ns(), self.attrs, _error(error_type, message), events,
            None, t.state))


def _attempt_attributes(tracing: Tracing, operation: str, ep: Endpoint, served: str,
                        number: int, routing: RoutingRequest,
                        body: Mapping[str, Any]) -> Attributes:
    server = tracing.servers.get(ep.url)
    if server is None:
        parts = urlsplit(ep.url)
        server = tracing.servers[ep.url] = (parts.hostname or ep.url, parts.port)
    attrs: Attributes = {
        n.GENAI_OPERATION: operation, n.GENAI_PROVIDER: ep.engine,
        n.GENAI_REQUEST_MODEL: served, n.SERVER_ADDRESS: server[0], n.POOL: ep.pool,
        n.ENDPOINT: ep.id, n.VENDOR: ep.vendor, n.ATTEMPT: number}
    if server[1] is not None:
        attrs[n.SERVER_PORT] = server[1]
    if routing.max_tokens is not None:
        attrs[n.GENAI_MAX_TOKENS] = routing.max_tokens
    for key, attr in (("temperature", n.GENAI_TEMPERATURE), ("top_p", n.GENAI_TOP_P)):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[attr] = value
    return attrs
