"""A finished span as the gateway writes it, and the batches that carry it to an exporter.

A ``SpanRecord`` is one tuple of plain values (ids as ints, the attribute dict, the status
as an error description or None). The request path builds it and appends it to the
``SpanBatcher``'s queue; nothing else happens there. Attributes that take long to make
from values that no longer change (the route span's, from the routing decision) come as
``later``, a function the batcher's thread calls before the export: on the request path
every line runs with cold caches, several times slower than the same line in a batch.
The batcher's thread hands whole batches to each exporter in turn: fleetgate's OTLP/HTTP
exporter (``otlp.py``) encodes the records as they are; an SDK exporter (console, gRPC,
the SDK's in-memory one in tests) gets them as the SDK's ``ReadableSpan`` values
(``to_readable``), converted on that thread.

``SpanBatcher`` keeps the batch span processor's contract and reads the same
``OTEL_BSP_*`` settings: a queue of at most ``max_queue_size`` spans (a span that finds it
full is dropped and counted), exported in batches of at most ``max_export_batch_size``:
whole batches as soon as one is full, everything queued every ``schedule_delay_millis``
and at ``force_flush`` and ``shutdown``.

May touch: threads, opentelemetry's span and exporter types. Must not touch: the request
path beyond ``on_end``, HTTP.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger("fleetgate.tracing")

Attributes = dict[str, Any]
UNSET = Status(StatusCode.UNSET)


class SpanRecord(NamedTuple):
    name: str
    kind: SpanKind
    trace_id: int
    span_id: int
    parent_id: int  # 0: a root span
    remote_parent: bool  # the parent came in the caller's traceparent
    flags: int  # W3C trace flags, as told to the engine
    start_ns: int
    end_ns: int
    attrs: Attributes
    error: str | None  # the status: None = unset, else ERROR with this description
    events: tuple[tuple[str, int, Attributes], ...] = ()  # (name, time in ns, attributes)
    later: Callable[[], Attributes] | None = None  # more attributes, made before the export
    trace_state: str = ""  # the caller's W3C tracestate, as the SDK writes it ("": none)


def to_readable(r: SpanRecord, resource: Resource,
                scope: InstrumentationScope) -> ReadableSpan:
    """The SDK's value for a record, as the SDK's own tracer would have made it."""
    flags = TraceFlags(r.flags)
    state = TraceState.from_header([r.trace_state]) if r.trace_state else None
    parent = SpanContext(r.trace_id, r.parent_id, r.remote_parent, flags, state) \
        if r.parent_id else None
    status = UNSET if r.error is None else Status(StatusCode.ERROR, r.error)
    events = [Event(name, attrs, ts) for name, ts, attrs in r.events]
    return ReadableSpan(r.name, SpanContext(r.trace_id, r.span_id, False, flags, state), parent,
                        resource, r.attrs, events, (), r.kind, None, status, r.start_ns,
                        r.end_ns, scope)


def sdk_export(exporter: SpanExporter, resource: Resource,
               scope: InstrumentationScope) -> Callable[[list[SpanRecord]], bool]:
    """A batcher's export function for an SDK exporter."""

    def export(records: list[SpanRecord]) -> bool:
        spans = [to_readable(r, resource, scope) for r in records]
        return exporter.export(spans) == SpanExportResult.SUCCESS

    return export


class SpanBatcher:
    def __init__(self, exports: Sequence[Callable[[list[SpanRecord]], bool]],
                 shutdowns: Sequence[Callable[[], None]] = (), max_queue_size: int = 2048,
                 schedule_delay_millis: float = 5000, max_export_batch_size: int = 512
                 ) -> None:
        if not 0 < max_export_batch_size <= max_queue_size or schedule_delay_millis <= 0:
            raise ValueError("OTEL_BSP_*: the export batch must be at most the queue size, "
                             "and the delay positive")
        self._exports, self._closes = list(exports), list(shutdowns)
        self._queue: deque[SpanRecord] = deque()
        self._limit, self._batch = max_queue_size, max_export_batch_size
        self._delay_s = schedule_delay_millis / 1000
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one export at a time, in queue order
        self._stopped = False
        self.dropped = 0
        self.on_drop: Callable[[], object] = lambda: None  # a span dropped (queue full)
        self.on_failure: Callable[[], object] = lambda: None  # a batch an exporter lost
        self._thread = threading.Thread(target=self._run, name="fleetgate-spans", daemon=True)
        self._thread.start()

    def on_end(self, record: SpanRecord) -> None:
        queue = self._queue
        if len(queue) >= self._limit:
            self.dropped += 1
            self.on_drop()
            if self.dropped == 1 or not self.dropped % 10_000:
                log.warning("span queue full (%d): %d spans dropped so far", self._limit,
                            self.dropped)
            return
        queue.append(record)
        if len(queue) >= self._batch and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            full = self._wake.wait(self._delay_s)
            self._wake.clear()
            self._drain(whole=not full)

    def _drain(self, whole: bool = True) -> bool:
        """Export the spans queued now: every one of them (the delay passed, a flush), or
        only whole batches (a full batch woke the thread). Spans that come during the export
        wait for the next turn: exporting them at once sent a POST per few spans at low load
        and kept the thread busy."""
        ok = True
        with self._lock:
            queue = self._queue
            left = len(queue) if whole else len(queue) - len(queue) % self._batch
            while left > 0:
                batch = [queue.popleft() for _ in range(min(left, self._batch))]
                left -= len(batch)
                if not self._exports:
                    continue
                for record in batch:
                    if record.later is not None:
                        record.attrs.update(record.later())
                for export in self._exports:
                    try:
                        done = export(batch)
                    except Exception:  # an exporter's bug must not kill the thread
                        log.exception("span export failed")
                        done = False
                    if not done:
                        self.on_failure()
                        ok = False
        return ok

    def force_flush(self) -> bool:
        """Export everything queued now (blocking: call it off the event loop)."""
        return self._drain()

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join()
        self._drain()
        for close in self._closes:
            close()

