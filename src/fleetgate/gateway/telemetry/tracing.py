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

Nothing global: no ``TracerProvider`` is set or used. The resource, the sampler and the
span batcher are built here, owned by the app's lifespan and shut down with it.

Lean on the request path (BENCHMARKS.md "Tracing overhead"): the SDK's tracer costs
~40-80 us a span (locks, attribute validation, context objects), so fleetgate makes its
ids (``random.getrandbits``, as the SDK's id generator does), reads the caller's
``traceparent`` (W3C, the SDK propagator's rules) and applies the sampler itself, and
writes each span once, when it ends, as a ``SpanRecord`` appended to the batcher's queue
(``spanrecord.py``); everything after that runs on the batcher's thread. The samplers
are the spec's: ``always_on``, ``always_off``, ``traceidratio`` (the SDK's rule on the
trace id's low 64 bits), each optionally ``parentbased_`` (a caller's sampled flag decides
when there is a caller).

May touch: opentelemetry. Must not touch: HTTP, metrics, the request path.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from fleetgate import __version__
from fleetgate.gateway.telemetry import names as n
from fleetgate.gateway.telemetry.otlp import OtlpHttpExporter, http_exporter_from_env
from fleetgate.gateway.telemetry.spanrecord import SpanBatcher, sdk_export

Exporter = SpanExporter | OtlpHttpExporter
SAMPLED, RANDOM_TRACE_ID = 0x01, 0x02  # W3C trace flags
# the SDK propagator's pattern: version, trace id, parent id, flags, then more for a
# version after 00
# W3C tracestate list-member: key (simple, or tenant@system) "=" value
_TRACESTATE_MEMBER = re.compile(
    r"([a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])")
_TRACEPARENT = re.compile(r"\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})"
                          r"(-.*)?\s*")


def exporters_from_env(env: Mapping[str, str]) -> list[Exporter]:
    """The span exporters the ``OTEL_*`` variables ask for; empty = tracing off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    wanted = env.get("OTEL_TRACES_EXPORTER")
    if wanted is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        wanted = "otlp" if endpoint else "none"
    out: list[Exporter] = []
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


def _otlp_exporter(env: Mapping[str, str]) -> Exporter:
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
    """The tracing ``env`` asks for, or None; every ``OTEL_*`` value is read from ``env``."""
    exporters = exporters_from_env(env)
    if not exporters:
        return None
    attrs: dict[str, Any] = {"service.name": n.SERVICE_NAME, "service.version": __version__}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attrs[unquote(key.strip())] = unquote(value.strip())
    if env.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = env["OTEL_SERVICE_NAME"]
    bsp: dict[str, Any] = {name: int(env[var]) for name, var in _BSP.items()
                           if env.get(var, "").isdigit()}
    return Tracing(Resource.create(attrs), sampler_from_env(env), exporters, **bsp)


# OTEL_BSP_EXPORT_TIMEOUT is not read (the SDK's processor ignores it too): an export is
# bounded by its exporter's own timeout, OTEL_EXPORTER_OTLP_TIMEOUT
_BSP = {"max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE",
        "schedule_delay_millis": "OTEL_BSP_SCHEDULE_DELAY",
        "max_export_batch_size": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"}


@dataclass(frozen=True, slots=True)
class Sampler:
    """A root trace is sampled when its trace id's low 64 bits are under ``bound`` (always_on:
    2**64, always_off: 0); with ``parent_based``, a caller's trace keeps the caller's flag."""

    bound: int
    parent_based: bool

    def sampled(self, trace_id: int, parent_flags: int | None) -> bool:
        if parent_flags is not None and self.parent_based:
            return bool(parent_flags & SAMPLED)
        return (trace_id & 0xFFFFFFFFFFFFFFFF) < self.bound


def sampler_from_env(env: Mapping[str, str]) -> Sampler:
    """``OTEL_TRACES_SAMPLER`` / ``_ARG`` as the spec names them (default parentbased_always_on)."""
    name = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    try:
        ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG") or 1.0)
    except ValueError:
        raise ValueError("OTEL_TRACES_SAMPLER_ARG must be a number from 0 to 1") from None
    ratio = min(max(ratio, 0.0), 1.0)
    roots = {"always_on": 1 << 64, "always_off": 0, "traceidratio": round(ratio * (1 << 64))}
    base = name.removeprefix("parentbased_")
    if base not in roots:
        raise ValueError(f"OTEL_TRACES_SAMPLER: {name!r} is not supported (always_on, "
                         "always_off, traceidratio, each optionally parentbased_)")
    return Sampler(roots[base], name.startswith("parentbased_"))


def parse_traceparent(value: str) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a valid W3C ``traceparent``, else None."""
    found = _TRACEPARENT.fullmatch(value)
    if found is None:
        return None
    version, trace, span, flags, more = found.groups()
    if version == "ff" or (version == "00" and more):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(flags, 16)


def parse_tracestate(value: str) -> str:
    """A W3C ``tracestate`` as the SDK's ``TraceState`` reads and writes it: its members
    without blanks, or "" when one is malformed, a key repeats or there are over 32. The
    same rules as the SDK's parser, without its warning per malformed header (a caller
    could fill the log)."""
    pairs: dict[str, str] = {}
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        found = _TRACESTATE_MEMBER.fullmatch(member)
        if found is None or found[1] in pairs:
            return ""
        pairs[found[1]] = found[2]
    return "" if len(pairs) > 32 else ",".join(f"{k}={v}" for k, v in pairs.items())


def new_id(bits: int) -> int:
    """A random, non-zero id, as the SDK's ``RandomIdGenerator`` makes them."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


@dataclass(slots=True)
class Trace:
    """One request's place in a trace: ids, flags, and when its server span started."""

    trace_id: int
    span_id: int  # the gateway's server span
    parent_id: int  # the caller's span, from its traceparent; 0 when none
    flags: int  # W3C trace flags ("01" sampled, "02" random trace id)
    start_ns: int
    state: str = ""  # the caller's tracestate, as the SDK reads and writes it ("": none)

    def traceparent(self, span_id: int) -> str:
        return f"00-{self.trace_id:032x}-{span_id:016x}-{self.flags:02x}"


class Tracing:
    """Ids, sampling, and finished spans handed to the batcher (one thread for every
    exporter)."""

    def __init__(self, resource: Resource, sampler: Sampler, exporters: Sequence[Exporter],
                 **bsp: Any) -> None:
        self.resource = resource
        self.scope = InstrumentationScope(n.TRACER_NAME, __version__)
        self.sampler = sampler
        self.batcher = SpanBatcher([self._export_of(ex) for ex in exporters],
                                   [ex.shutdown for ex in exporters], **bsp)
        self.emit = self.batcher.on_end  # queue one finished span for the exporters
        self.servers: dict[str, tuple[str, int | None]] = {}  # url -> (host, port)

    def _export_of(self, exporter: Exporter) -> Any:
        if isinstance(exporter, OtlpHttpExporter):
            resource, scope = self.resource, self.scope
            return lambda records: exporter.export(records, resource, scope)
        return sdk_export(exporter, self.resource, self.scope)

    def begin(self, traceparent: str | None, tracestate: str | None = None) -> Trace:
        """A new server span: continue the caller's trace if any, ask the sampler. The
        caller's ``tracestate`` goes on with its trace (W3C: read only with a valid
        ``traceparent``)."""
        parent = parse_traceparent(traceparent) if traceparent else None
        if parent is None:
            trace_id = new_id(128)
            flags = RANDOM_TRACE_ID | (SAMPLED if self.sampler.sampled(trace_id, None) else 0)
            parent_id = 0
        else:
            trace_id, parent_id, theirs = parent
            flags = (theirs & RANDOM_TRACE_ID) | \
                (SAMPLED if self.sampler.sampled(trace_id, theirs) else 0)
            if tracestate:
                return Trace(trace_id, new_id(64), parent_id, flags, time.time_ns(),
                             parse_tracestate(tracestate))
        return Trace(trace_id, new_id(64), parent_id, flags, time.time_ns())

    def force_flush(self) -> bool:
        """Export what is queued (blocking: call it off the event loop)."""
        return self.batcher.force_flush()

    def shutdown(self) -> None:
        """Flush queued spans and stop the exporters (blocking: call it off the loop)."""
        self.batcher.shutdown()
