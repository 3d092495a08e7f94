"""The gateway's ``Observer``: one request's life told to metrics, costs, the log and traces.

``TelemetryObserver.request(...)`` returns a ``RequestTelemetry``; its ``attempt(...)``
returns an ``AttemptTelemetry`` (the call order is in ``gateway/proxy/observer.py``). Every finished
attempt is charged by the rule in ``costs.py``; the charge goes to the cost ledger
(``/admin/costs``), ``fleetgate_cost_usd_total``, the attempt's client span and, summed
over the request's attempts, to the server span and the request's log line, so all four
add up to the same dollars; the sum is kept on the ``ProxyRequest`` (``cost_usd``), where a
whole answer's ``x-fleetgate-cost-usd`` header reads it.

Cost on the hot path (DESIGN.md §4): with tracing off, ``tracing`` is ``None`` and no span,
id, attribute dict or trace-id string is made; a request costs two small objects, a few
cached-child metric updates, a ledger tally and one JSON log line. With tracing on, span
attributes are only built for sampled requests (``spans.py``). Labelled metric
children and ledger tallies are resolved once per (endpoint, model, tenant) and kept in an
``Account``.

A failed or cancelled attempt reports no duration or concurrency through the seam, so this
module measures them itself: its own clock from ``attempt()`` to the outcome, and the
endpoint's in-flight count (``in_flight(endpoint_id)``) read at both ends.

May touch: the observer seam, telemetry modules, endpoint descriptions. Must not touch:
HTTP, the live fleet (except through the injected ``in_flight`` reader).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetgate.gateway.costs import Charge, CostLedger, Tally, attempt_charge
from fleetgate.gateway.proxy.observer import AttemptObserver, AttemptResult
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.telemetry import names as n
from fleetgate.gateway.telemetry.logs import RequestLog
from fleetgate.gateway.telemetry.metrics import GatewayMetrics
from fleetgate.gateway.telemetry.spans import AttemptSpan, RequestSpans
from fleetgate.gateway.telemetry.tracing import Tracing
from fleetgate.routing import Decision, Endpoint


@dataclass(slots=True)
class Account:
    """Resolved metric children and ledger tally for one (endpoint, model, tenant)."""

    tally: Tally
    ttft: Any
    tpot: Any
    e2e: Any
    input_tokens: Any
    output_tokens: Any
    gpu_seconds: Any
    cost: dict[str, Any]  # outcome -> child
    attempts: dict[str, Any]  # outcome -> child


class TelemetryObserver:
    def __init__(self, metrics: GatewayMetrics, ledger: CostLedger, log: RequestLog,
                 tracing: Tracing | None, in_flight: Callable[[str], float],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.metrics = metrics
        self.ledger = ledger
        self.log = log
        self.tracing = tracing
        self.in_flight = in_flight
        self.clock = clock
        self._accounts: dict[tuple[str, str, str, str], Account] = {}

    def request(self, req: ProxyRequest) -> RequestTelemetry:
        return RequestTelemetry(self, req)

    def account(self, ep: Endpoint, model: str, tenant: str) -> Account:
        key = (ep.id, ep.pool, model, tenant)
        found = self._accounts.get(key)
        if found is None:
            m, pool = self.metrics, ep.pool
            outcomes = (n.OUTCOME_OK, n.OUTCOME_FAILED, n.OUTCOME_CANCELLED)
            found = self._accounts[key] = Account(
                self.ledger.tally(ep, model, tenant), m.ttft(pool), m.tpot(pool), m.e2e(pool),
                m.input_tokens(pool, model), m.output_tokens(pool, model),
                m.gpu_seconds(pool, model), {o: m.cost(pool, model, tenant, o) for o in outcomes},
                {o: m.attempts(pool, ep.id, o) for o in outcomes})
        return found


class RequestTelemetry:
    __slots__ = ("attempts", "body", "ended", "hub", "input_tokens", "last", "output_tokens",
                 "path", "policy", "proxied", "request_id", "routing", "spans", "t0", "tenant",
                 "traceparent", "ttft_s")

    def __init__(self, hub: TelemetryObserver, req: ProxyRequest) -> None:
        routing = req.routing
        self.hub, self.request_id, self.path, self.routing = hub, req.request_id, req.path, routing
        self.traceparent, self.body, self.proxied = req.traceparent, req.body, req
        self.t0 = hub.clock()
        self.tenant = routing.tenant or n.ANONYMOUS
        self.policy = ""
        self.attempts = self.input_tokens = self.output_tokens = 0
        self.ttft_s: float | None = None
        self.last: AttemptTelemetry | None = None
        self.ended = False
        self.spans = None if hub.tracing is None else RequestSpans(hub.tracing, req.path,
                                                                    req.traceparent,
                                                                    req.tracestate)

    def routed(self, decision: Decision) -> None:
        self.routing = self.proxied.routing  # a fallback's: charged to the model that serves
        self.policy = decision.policy
        chosen = decision.chosen
        self.hub.metrics.decisions(decision.policy, chosen.pool if chosen else n.NO_POOL,
                                   decision.reason).inc()
        if self.spans is not None:
            self.spans.route(decision, self.routing.max_tokens, self.proxied.fallback)

    def attempt(self, endpoint: Endpoint, served_model: str, number: int) -> AttemptObserver:
        if number and self.last is not None:
            self.hub.metrics.retries(self.routing.model, self.policy, self.last.ep.pool).inc()
        self.attempts += 1
        self.last = AttemptTelemetry(self, endpoint, served_model, number)
        return self.last

    def end(self, status: int, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        e2e = self.hub.clock() - self.t0
        last = self.last
        pool, endpoint = (last.ep.pool, last.ep.id) if last else (n.NO_POOL, n.NO_POOL)
        self.hub.metrics.requests(self.routing.model, pool, endpoint, status, self.policy).inc()
        if last is not None:
            last.account.tally.requests += 1
        if self.hub.log.enabled:
            self.hub.log.write(self._record(status, pool, endpoint, e2e))
        if self.spans is not None and self.spans.sampled:
            self._end_span(self.spans, status, error)

    def _record(self, status: int, pool: str, endpoint: str, e2e: float) -> dict[str, Any]:
        return {
            "ts": time.time(), "event": "request", "request_id": self.request_id,
            "trace_id": self._trace_id(), "path": self.path, "model": self.routing.model,
            "tenant": self.tenant, "policy": self.policy, "pool": pool, "endpoint": endpoint,
            "status": status, "attempts": self.attempts, "stream": self.routing.stream,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 3),
            "e2e_ms": round(e2e * 1000, 3), "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens, "cost_usd": self.proxied.cost_usd,
        }

    def _trace_id(self) -> str | None:
        if self.spans is not None:
            return f"{self.spans.trace.trace_id:032x}"
        tp = self.traceparent
        return tp[3:35] if tp and len(tp) >= 55 and tp[2] == "-" else None

    def _end_span(self, spans: RequestSpans, status: int, error: str | None) -> None:
        """The request as the client saw it; where and how it ran is on the child spans."""
        attrs: dict[str, Any] = {
            n.HTTP_METHOD: "POST", n.HTTP_ROUTE: self.path, n.HTTP_STATUS: status,
            n.GENAI_REQUEST_MODEL: self.routing.model, n.REQUEST_ID: self.request_id,
            n.TENANT: self.tenant, n.STREAM: self.routing.stream, n.ATTEMPTS: self.attempts,
            n.COST_USD: self.proxied.cost_usd}
        if status >= 500:  # HTTP server convention: 4xx is the client's, not an error
            attrs[n.ERROR_TYPE] = str(status)
            spans.end(attrs, str(status), error)
        else:
            spans.end(attrs, None, None)


class AttemptTelemetry:
    __slots__ = ("account", "ep", "in_flight0", "number", "req", "served", "span", "t0")

    def __init__(self, req: RequestTelemetry, ep: Endpoint, served: str, number: int) -> None:
        hub = req.hub
        self.req, self.ep, self.served, self.number = req, ep, served, number
        self.account = hub.account(ep, req.routing.model, req.tenant)
        self.t0 = hub.clock()
        self.in_flight0 = hub.in_flight(ep.id) + 1.0  # read before the dispatch counts it
        self.span: AttemptSpan | None = None
        if req.spans is not None:
            self.span = req.spans.attempt(ep, served, number, req.path, req.routing, req.body)

    def headers(self) -> dict[str, str]:
        return {} if self.span is None else self.span.headers()

    def first_token(self, ttft_s: float) -> None:
        if self.req.ttft_s is None:  # the client's first token (not a continuation's)
            self.req.ttft_s = ttft_s
        if self.span is not None:
            self.span.first_token(ttft_s)

    def finished(self, result: AttemptResult) -> None:
        usage = result.usage or {}
        tokens_in = int(usage.get("prompt_tokens") or 0)
        tokens_out = int(usage.get("completion_tokens") or 0)
        charge = attempt_charge(self.ep, result.e2e_s, result.mean_concurrency, tokens_in,
                                tokens_out)
        acc = self.account
        self._charge(charge, n.OUTCOME_OK, tokens_in, tokens_out)
        acc.e2e.observe(result.e2e_s)
        if result.ttft_s is not None:
            acc.ttft.observe(result.ttft_s)
            if tokens_out > 1 and result.e2e_s > result.ttft_s:
                acc.tpot.observe((result.e2e_s - result.ttft_s) / (tokens_out - 1))
        if tokens_in:
            acc.input_tokens.inc(tokens_in)
        if tokens_out:
            acc.output_tokens.inc(tokens_out)
        req = self.req
        req.input_tokens += tokens_in
        req.output_tokens += tokens_out
        if result.migrated_after is not None:
            req.hub.metrics.migrations(req.routing.model, req.policy, self.ep.pool).inc()
        if self.span is not None and self.span.recording:
            attrs = {
                n.HTTP_STATUS: result.status, n.GENAI_RESPONSE_MODEL: self.served,
                n.GENAI_INPUT_TOKENS: tokens_in, n.GENAI_OUTPUT_TOKENS: tokens_out,
                n.MEAN_CONCURRENCY: result.mean_concurrency,
                n.COST_USD: charge.usd}
            if result.migrated_after is not None:
                attrs[n.MIGRATED_AFTER] = result.migrated_after
            self.span.end(attrs)

    def failed(self, status: int, error: str) -> None:
        self._unfinished(n.OUTCOME_FAILED, str(status), error, {n.HTTP_STATUS: status})

    def cancelled(self) -> None:
        self._unfinished(n.OUTCOME_CANCELLED, "cancelled", "the client went away", {})

    def _unfinished(self, outcome: str, error_type: str, message: str,
                    attrs: dict[str, Any]) -> None:
        hub = self.req.hub
        e2e = hub.clock() - self.t0
        concurrency = max(1.0, (self.in_flight0 + hub.in_flight(self.ep.id)) / 2)
        charge = attempt_charge(self.ep, e2e, concurrency)
        self._charge(charge, outcome)
        if self.span is not None and self.span.recording:
            self.span.end({**attrs, n.MEAN_CONCURRENCY: concurrency, n.COST_USD: charge.usd},
                          error_type, message)

    def _charge(self, charge: Charge, outcome: str, tokens_in: int = 0,
                tokens_out: int = 0) -> None:
        acc = self.account
        acc.tally.add_attempt(charge, outcome == n.OUTCOME_OK, tokens_in, tokens_out)
        acc.cost[outcome].inc(charge.usd)
        acc.gpu_seconds.inc(charge.gpu_seconds)
        acc.attempts[outcome].inc()
        self.req.proxied.cost_usd += charge.usd  # the request's, its log line's, its header's
