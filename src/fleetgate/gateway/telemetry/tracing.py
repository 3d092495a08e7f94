"""OpenTelemetry tracing, configured from the standard ``OTEL_*`` variables; off when unset.

``start_tracing(env)`` returns ``None`` (tracing off: the observer then makes no span, no
id, no string) unless an exporter is asked for:

* ``OTEL_TRACES_EXPORTER``: ``otlp``, ``console`` or both (comma-separated); ``none`` = off.
  When unset, ``otlp`` if ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, else off.
* ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``: ``http/protobuf`` (default; ``otlp.py``'s lean
  exporter) or ``grpc`` (the SDK's gRPC exporter).
* ``OTEL_SDK_DISABLED=true`` turns it off; ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``
  (service name defaults to ``fleetgate``), ``OTEL_TRACES_SAMPLER(_ARG)`` and ``OTEL_BSP_*``
  as the spec says. Every value is read from the ``env`` mapping the app passes
  (``os.environ`` in production), so tests configure a gateway without touching theirs.

Nothing global: the ``TracerProvider`` (resource, sampler, id generator, span processors)
is built here, owned by the app's lifespan and shut down with it (``shutdown_on_exit=False``;
never set as the global provider); the W3C propagator is used explicitly.

Spans are recorded lean (``spans.py``): the SDK's ``Tracer.start_span`` costs ~40-80 us a
span on the reference machine (locks, attribute validation), so a request's spans are
written once, when each ends, as the SDK's own ``ReadableSpan`` values, with the provider's
sampler, id generator and resource, and handed to its ``BatchSpanProcessor`` (exported on
the processor's thread, never on the event loop). BENCHMARKS.md "Tracing overhead" has
the numbers.

May touch: opentelemetry. Must not touch: HTTP, metrics, the request path.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from fleetgate import __version__
from fleetgate.gateway.telemetry import names as n
from fleetgate.gateway.telemetry.otlp import http_exporter_from_env

Attributes = dict[str, Any]
UNSET = Status(StatusCode.UNSET)
_NO_PARENT = Context()


def exporters_from_env(env: Mapping[str, str]) -> list[SpanExporter]:
    """The span exporters the ``OTEL_*`` variables ask for; empty = tracing off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    wanted = env.get("OTEL_TRACES_EXPORTER")
    if wanted is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        wanted = "otlp" if endpoint else "none"
    out: list[SpanExporter] = []
    for name in (x.strip().lower() for x in wanted.split(",") if x.strip()):
        if name == "none":
            return []
        if name == "otlp":
            out.append(_otlp_exporter(env))
        elif name == "console":
            out.append(ConsoleSpanExporter())
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} "
                             "(fleetgate knows otlp, console, none)")
    return out


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )
        return GrpcExporter(endpoint=traces or base)
    if protocol == "http/protobuf":
        endpoint = traces or (base.rstrip("/") + "/v1/traces" if base
                              else "http://localhost:4318/v1/traces")
        return http_exporter_from_env(env, endpoint)
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported "
                     "(http/protobuf or grpc)")


def start_tracing(env: Mapping[str, str]) -> Tracing | None:
    """The provider ``env`` asks for, or None; every ``OTEL_*`` value is read from ``env``."""
    exporters = exporters_from_env(env)
    if not exporters:
        return None
    attrs: Attributes = {"service.name": n.SERVICE_NAME, "service.version": __version__}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attrs[unquote(key.strip())] = unquote(value.strip())
    if env.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = env["OTEL_SERVICE_NAME"]
    provider = TracerProvider(sampler=sampler_from_env(env), resource=Resource.create(attrs),
                              shutdown_on_exit=False)
    bsp: dict[str, Any] = {name: int(env[var]) for name, var in _BSP.items()
                           if env.get(var, "").isdigit()}
    processors = [BatchSpanProcessor(exporter, **bsp) for exporter in exporters]
    for processor in processors:
        provider.add_span_processor(processor)
    return Tracing(provider, processors)


_BSP = {"max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE",
        "schedule_delay_millis": "OTEL_BSP_SCHEDULE_DELAY",
        "max_export_batch_size": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "export_timeout_millis": "OTEL_BSP_EXPORT_TIMEOUT"}


def sampler_from_env(env: Mapping[str, str]) -> Sampler:
    """``OTEL_TRACES_SAMPLER`` / ``_ARG`` as the spec names them (default parentbased_always_on)."""
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    try:
        ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG") or 1.0)
    except ValueError:
        raise ValueError("OTEL_TRACES_SAMPLER_ARG must be a number from 0 to 1") from None
    roots: dict[str, Sampler] = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF,
                                 "traceidratio": TraceIdRatioBased(min(max(ratio, 0.0), 1.0))}
    base = name.removeprefix("parentbased_")
    if base not in roots:
        raise ValueError(f"OTEL_TRACES_SAMPLER: {name!r} is not supported (always_on, "
                         "always_off, traceidratio, each optionally parentbased_)")
    return ParentBased(roots[base]) if name.startswith("parentbased_") else roots[base]


@dataclass(slots=True)
class Trace:
    """One request's place in a trace: ids, sampling, and when its server span started."""

    server: SpanContext  # the gateway's server span
    parent: SpanContext | None  # the caller's span, from its traceparent
    start_ns: int
    flags: str  # the traceparent flags field for this trace ("01" sampled)

    @property
    def sampled(self) -> bool:
        return self.server.trace_flags.sampled

    def child(self, span_id: int) -> SpanContext:
        s = self.server
        return SpanContext(s.trace_id, span_id, False, s.trace_flags, s.trace_state)

    def traceparent(self, span_id: int) -> str:
        return f"00-{self.server.trace_id:032x}-{span_id:016x}-{self.flags}"


class Tracing:
    """Ids, sampling and span emission with the provider's sampler, ids and resource."""

    def __init__(self, provider: TracerProvider, processors: Sequence[Any]) -> None:
        self.provider = provider
        self.resource = provider.resource
        self.scope = InstrumentationScope(n.TRACER_NAME, __version__)
        self._ids = provider.id_generator
        self._sampler = provider.sampler
        self._propagator = TraceContextTextMapPropagator()
        self._on_end = [p.on_end for p in processors]
        self.servers: dict[str, tuple[str, int | None]] = {}  # url -> (host, port)

    def begin(self, name: str, traceparent: str | None) -> Trace:
        """A new server span: continue the caller's trace if any, ask the sampler."""
        parent = None
        context = _NO_PARENT  # explicit: the sampler must not look at the ambient context
        if traceparent:
            context = self._propagator.extract({"traceparent": traceparent})
            found = get_current_span(context).get_span_context()
            parent = found if found.is_valid else None
        if parent is None:
            trace_id, random_id = self._ids.generate_trace_id(), self._ids.is_trace_id_random()
            context = _NO_PARENT
        else:
            trace_id, random_id = parent.trace_id, parent.trace_flags.random_trace_id
        result = self._sampler.should_sample(context, trace_id, name, SpanKind.SERVER)
        flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        server = SpanContext(trace_id, self._ids.generate_span_id(), False, TraceFlags(flags),
                             result.trace_state)
        return Trace(server, parent, time.time_ns(), f"{flags:02x}")

    def span_id(self) -> int:
        return self._ids.generate_span_id()

    def emit(self, name: str, kind: SpanKind, context: SpanContext, parent: SpanContext | None,
             attrs: Attributes, start_ns: int, end_ns: int, status: Status = UNSET,
             events: Sequence[Event] = ()) -> None:
        """Hand one finished span to the span processors (they queue it for export)."""
        span = ReadableSpan(name, context, parent, self.resource, attrs, events, (), kind,
                            None, status, start_ns, end_ns, self.scope)
        for on_end in self._on_end:
            on_end(span)

    def shutdown(self) -> None:
        """Flush queued spans and stop the exporters (blocking: call it off the loop)."""
        self.provider.shutdown()

