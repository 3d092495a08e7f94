"""ProxyService: route a request, relay it to the chosen engine, fail over before byte one.

The request path (docs/architecture.md): the router ranks endpoints; this service tries
them in order. What may be retried elsewhere, and what counts against an engine's breaker,
is decided in one place (``outcome.py``): an engine 5xx that the request itself may have
caused is tried once more elsewhere, and failing there too makes it a poison request that
no breaker counts; once a stream has started nothing is retried, except that a chat or
completions stream broken mid-way is continued on the next candidate (``resume``; stream.py
says how) where its policy allows it (``resume_streams``); otherwise an upstream failure
ends it with an error event in the API's own shape (``apis.py``). Every API (chat,
completions, responses, messages, embeddings) takes this path; they differ only in data.

Admission (``admission.py``, ``state/admission.py``): when every endpoint serving the model
is past its SLO capacity, a high-priority request goes to the fastest endpoint at once;
normal and low ones wait in a bounded, fair queue for a slot (normal first), or get 429
with ``Retry-After`` when the wait would not fit the policy's TTFT SLO.

Model fallbacks (``fallback.py``): where the request's model cannot serve it (its context
is too small, admission sheds it, no endpoint is available, every attempt failed before the
first byte) ``_serve`` raises ``Unserved`` and the request is served again with the next
model of its route's ``fallbacks``, if any; ``x-fleetgate-model`` then names that model.

Relay rules: the engine's bytes go to the client unchanged except the ``model`` field (the
served name becomes the public one). Chat and completions streams always ask the engine for
usage (``stream_options.include_usage``) so the gateway knows the token counts; the usage
chunk is dropped again when the client did not ask for it. A whole (non-streamed) answer
says what the ledger charged for it, every attempt's charge summed, in
``x-fleetgate-cost-usd`` (its attempts have ended before the headers go).

May touch: backends (relay), catalog (request quirks), routing types, state (the fleet).
Must not touch: request parsing (``api/``), app wiring.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from fleetgate.backends.relay import Backend, Timeouts, UpstreamError, UpstreamResponse
from fleetgate.catalog.engines import translate_guided
from fleetgate.config.schema import ShadowConfig
from fleetgate.gateway.decisions import DecisionEntry, DecisionLog
from fleetgate.gateway.errors import (
    GatewayError,
    NoCapacity,
    Overloaded,
    context_length_exceeded,
    json_error,
)
from fleetgate.gateway.errors import normalise_upstream_error as normalise
from fleetgate.gateway.proxy.adapters import adapter_ready
from fleetgate.gateway.proxy.admission import FlowControl
from fleetgate.gateway.proxy.answer import first_byte_timeout, whole_answer
from fleetgate.gateway.proxy.attempt import Attempt
from fleetgate.gateway.proxy.fallback import (
    CAPACITY,
    CONTEXT_WINDOW,
    REFUSED,
    UNAVAILABLE,
    Unserved,
    fall_back,
)
from fleetgate.gateway.proxy.observer import NOOP, Observer, RequestObserver
from fleetgate.gateway.proxy.outcome import (
    RETRYABLE_STATUS,
    RetryableFailure,
    SuspectFailure,
    client_status,
    engine_failure,
    exhausted,
    poison,
    settle,
    transport_failure,
)
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.proxy.resume import NotResumable, Opened, Resumer
from fleetgate.gateway.proxy.stream import open_continuation, open_stream
from fleetgate.routing import Decision, Router, RoutingRequest
from fleetgate.routing.policies import FallbackRoutes
from fleetgate.state.admission import full, room
from fleetgate.state.fleet import Fleet

log = logging.getLogger("fleetgate.proxy")


@dataclass(slots=True)
class Generation:
    """One config's worth of routing: swapped as a whole on reload."""

    fleet: Fleet
    router: Router
    max_attempts: dict[str, int] = field(default_factory=dict)  # policy -> attempts
    first_byte_s: dict[str, float | None] = field(default_factory=dict)  # policy -> deadline
    shadow: dict[str, ShadowConfig] = field(default_factory=dict)  # policy -> its mirror
    resume: dict[str, bool] = field(default_factory=dict)  # policy -> resume_streams (True)
    fallbacks: FallbackRoutes = field(default_factory=FallbackRoutes)  # routes[].fallbacks


@dataclass(slots=True)
class Exchange:
    """One request on its way through the proxy: what every attempt shares."""

    req: ProxyRequest
    gen: Generation
    entry: DecisionEntry
    obs: RequestObserver
    released: Callable[[], None]  # an attempt ended: a waiting request may go
    resumer: Resumer | None = None  # continues a stream broken mid-way (None: not allowed)


class ProxyService:
    def __init__(self, generation: Callable[[], Generation], backend: Backend,
                 timeouts: Timeouts, decisions: DecisionLog, observer: Observer = NOOP) -> None:
        self._generation = generation
        self._backend = backend
        self._timeouts = timeouts
        self.decisions = decisions
        self.observer = observer
        self.flow = FlowControl(self._room)

    async def handle(self, req: ProxyRequest) -> Response:
        obs = self.observer.request(req)
        try:
            response = await self._route_and_relay(req, obs)
        except GatewayError as exc:
            obs.end(exc.status, exc.message)
            raise
        except BaseException as exc:
            obs.end(499 if isinstance(exc, GeneratorExit | asyncio.CancelledError) else 500,
                    type(exc).__name__)
            raise
        if not isinstance(response, StreamingResponse):  # a stream reports its own end
            # told once the answer is written (the loop's next turn): the request log,
            # metrics and server span are not what the client waits for (~10 us live)
            asyncio.get_running_loop().call_soon(obs.end, response.status_code)
        return response

    async def _route_and_relay(self, req: ProxyRequest, obs: RequestObserver) -> Response:
        gen = self._generation()  # one read: a reload mid-request changes nothing here
        try:
            return await self._serve(req, obs, gen)
        except Unserved as exc:  # its route's fallbacks, or its error
            return await fall_back(req, gen.fallbacks, exc,
                                   lambda again: self._serve(again, obs, gen), self.decisions)

    async def _serve(self, req: ProxyRequest, obs: RequestObserver, gen: Generation) -> Response:
        """Route ``req`` to its model's endpoints and relay the first answer; ``Unserved``
        when the model cannot serve it (``fallback.py``)."""
        decision = gen.router.route(req.routing, gen.fleet.snapshot())
        if decision.context_limit is not None:  # fits no endpoint: a 400 (SDKs retry a 503)
            raise Unserved(CONTEXT_WINDOW, context_length_exceeded(
                decision.context_limit, req.routing.prompt_tokens_estimate,
                req.routing.max_tokens if req.api.usage_out else None, req.api.prompt_param,
                next((f for f in req.api.output_caps if req.body.get(f) is not None), None)),
                decision, self._record(req, decision))
        key = (req.routing.model, req.routing.api)
        if req.priority != "high" and (full(decision) or self.flow.waiting(key)):
            try:
                await self.flow.wait(req.routing, req.priority, req.weight, decision)
            except Overloaded as exc:  # shed for capacity (never a caller's own limits)
                raise Unserved(CAPACITY, exc, decision, None) from None
            decision = gen.router.route(req.routing, gen.fleet.snapshot())
        ex = Exchange(req, gen, self._record(req, decision), obs,
                      lambda: self.flow.released(key))
        obs.routed(decision)
        if req.routing.stream and req.api.resumes and gen.resume.get(decision.policy, True):
            ex.resumer = functools.partial(self._resume, ex)
        if not len(decision.order):
            self.flow.refuse(req.routing.model)
            raise Unserved(UNAVAILABLE, NoCapacity(
                f"no endpoint can serve model {req.routing.model!r} now ({decision.reason})"),
                decision, ex.entry)
        return await self._dispatch(ex)

    def _record(self, req: ProxyRequest, decision: Decision) -> DecisionEntry:
        entry = self.decisions.record(req.request_id, decision)
        if req.fallback is not None:
            entry.fallback = req.fallback.explain()
        return entry

    async def _dispatch(self, ex: Exchange) -> Response:
        """Try the decision's candidates in order until one answers (see the module)."""
        decision, gen = ex.entry.decision, ex.gen
        last: RetryableFailure | None = None
        suspects: list[Attempt] = []  # failed in a way this request may have caused
        attempts = decision.attempts(gen.max_attempts.get(decision.policy, 3))
        for number, (position, ep) in enumerate(attempts):
            if decision.adapter is not None:  # a LoRA adapter: loaded there first
                failed = await adapter_ready(gen.fleet, decision, int(decision.idx[position]))
                if failed is not None:
                    log.warning("%s: %s", ep.id, failed)
                    ex.entry.attempts.append({"endpoint": ep.id, "status": 503,
                                              "error": failed})
                    last = RetryableFailure(503, f"{ep.id}: {failed}")
                    continue
            attempt = Attempt.start(ex, position, number)
            try:
                response = await self._relay(ex, attempt)
            except RetryableFailure as exc:
                log.warning("attempt on %s failed (%s): %s", attempt.ep.id, exc.status,
                            exc.message)
                ex.entry.attempts.append({"endpoint": attempt.ep.id, "status": exc.status,
                                          "error": exc.message})
                last = exc
                if not isinstance(exc, SuspectFailure):
                    attempt.failed(exc.status, exc.message)
                    continue
                attempt.suspected(exc.status, exc.message)
                if suspects:  # a second endpoint failed the same way: a poison request
                    ex.entry.attempts[-1]["poison"] = True
                    raise poison(exc, len(suspects) + 1) from None
                suspects.append(attempt)
                continue
            except BaseException:
                attempt.cancelled()
                settle(suspects, None, None)
                raise
            ex.entry.attempts.append({"endpoint": attempt.ep.id,
                                      "status": response.status_code})
            settle(suspects, response.status_code, attempt)
            return response
        assert last is not None
        settle(suspects, None, None)  # no second opinion: counted once per tenant
        raise Unserved(REFUSED, exhausted(last, len(attempts)), decision, ex.entry)

    async def _resume(self, ex: Exchange, body: dict[str, Any], tried: set[str],
                      after_tokens: int) -> Opened | None:
        """Open the continuation ``body`` of a stream broken after ``after_tokens`` tokens on
        the next candidates of the request's decision not yet ``tried`` (at most the policy's
        attempts); None when none opened. Each try is an attempt in the decision log."""
        decision = ex.entry.decision
        budget = ex.gen.max_attempts.get(decision.policy, 3)
        for position, ep in decision.attempts(len(decision.order)):
            if ep.id in tried:
                continue
            if budget == 0:
                break
            budget -= 1
            tried.add(ep.id)
            if await adapter_ready(ex.gen.fleet, decision, int(decision.idx[position])):
                continue  # could not load its adapter there
            attempt = Attempt.start(ex, position, len(ex.entry.attempts))
            record: dict[str, Any] = {"endpoint": ep.id, "migrated": True,
                                      "after_tokens": after_tokens}
            try:
                opened = await self._reopen(ex, attempt, body)
            except RetryableFailure as exc:
                attempt.failed(exc.status, exc.message)
                ex.entry.attempts.append({**record, "status": exc.status, "error": exc.message})
                continue
            except NotResumable as exc:
                ex.entry.attempts.append({**record, "status": exc.status, "error": exc.message})
                return None
            except BaseException:
                attempt.cancelled()
                raise
            ex.entry.attempts.append({**record, "status": 200})
            return opened
        return None

    async def _reopen(self, ex: Exchange, attempt: Attempt, body: dict[str, Any]) -> Opened:
        """Post a continuation and read its stream up to the first frame."""
        ep, req = attempt.ep, ex.req
        limit = _first_byte_limit(ex, attempt)
        resp: UpstreamResponse | None = None
        try:
            async with _within(limit):
                try:
                    resp = await self._backend.post(ep.url + req.path,
                                                    _upstream_body(req, attempt, body),
                                                    _upstream_headers(req, attempt),
                                                    self._timeouts)
                except UpstreamError as exc:
                    if exc.kind == "connect":
                        attempt.refused()
                    raise transport_failure(exc, ep.id) from None
                if resp.status != 200:
                    answer = await _relay_error(resp, attempt, {})  # raises if retryable
                    raise NotResumable(answer.status_code,
                                       f"{ep.id}: {bytes(answer.body).decode(errors='replace')}")
                return await open_continuation(resp, attempt)
        except TimeoutError:
            if resp is not None:
                resp.close()
            raise first_byte_timeout(ep.id, limit, resp, req.routing.stream) from None

    def _room(self, routing: RoutingRequest) -> int | None:
        gen = self._generation()
        return room(gen.router.route(routing, gen.fleet.snapshot()))

    async def _relay(self, ex: Exchange, attempt: Attempt) -> Response:
        ep, req = attempt.ep, ex.req
        headers = _upstream_headers(req, attempt)
        limit = _first_byte_limit(ex, attempt)
        resp: UpstreamResponse | None = None
        try:
            async with _within(limit):
                try:
                    resp = await self._backend.post(ep.url + req.path,
                                                    _upstream_body(req, attempt), headers,
                                                    self._timeouts)
                except UpstreamError as exc:
                    if exc.kind == "connect":
                        attempt.refused()
                    raise transport_failure(exc, ep.id) from None
                return await self._answer(ex, attempt, resp)
        except TimeoutError:  # only asyncio.timeout's: the relay turns its own into 504s
            if resp is not None:
                resp.close()
            raise first_byte_timeout(ep.id, limit, resp, req.routing.stream) from None

    async def _answer(self, ex: Exchange, attempt: Attempt, resp: UpstreamResponse) -> Response:
        ep, req = attempt.ep, ex.req
        out_headers = {"x-fleetgate-pool": ep.pool, "x-fleetgate-endpoint": ep.id,
                       "x-fleetgate-policy": ex.entry.decision.policy,
                       "x-request-id": req.request_id}
        if req.fallback is not None:  # a fallback model answers
            out_headers["x-fleetgate-model"] = req.routing.model
        rewrite = _model_rewriter(attempt.served, req.routing.model)
        if resp.status != 200:
            return await _relay_error(resp, attempt, out_headers)
        if not req.routing.stream:
            return await _relay_body(resp, ex, attempt, rewrite, out_headers)
        return await open_stream(resp, ex, attempt, rewrite, out_headers)


_NO_LIMIT = contextlib.nullcontext()


def _within(limit: float | None) -> contextlib.AbstractAsyncContextManager[Any]:
    """``asyncio.timeout(limit)``, or nothing at all without a limit (a timeout context
    costs ~2% of a request's CPU even when it can never fire)."""
    return _NO_LIMIT if limit is None else asyncio.timeout(limit)


def _first_byte_limit(ex: Exchange, attempt: Attempt) -> float | None:
    """How long this attempt may go without its first byte (None: the read timeout only).
    A stream's first byte is its first frame; a whole answer's is its last, so that limit
    adds four times the predicted generation."""
    limit = ex.gen.first_byte_s.get(ex.entry.decision.policy)
    if limit is None or ex.req.routing.stream:
        return limit
    return limit + 4 * (attempt.predicted_e2e_s or 0.0)


def _upstream_headers(req: ProxyRequest, attempt: Attempt) -> dict[str, str]:
    headers = {"content-type": "application/json", "x-request-id": req.request_id,
               **attempt.ep.auth_headers}
    if req.traceparent:  # the caller's trace, passed on as it came (tracing off)
        headers["traceparent"] = req.traceparent
        if req.tracestate:
            headers["tracestate"] = req.tracestate
    headers.update(attempt.observer.headers())  # tracing on: the attempt's span instead
    return headers


def _upstream_body(req: ProxyRequest, attempt: Attempt,
                   client_body: dict[str, Any] | None = None) -> bytes:
    body = dict(req.body if client_body is None else client_body)
    body["model"] = attempt.served
    if req.routing.stream and req.api.asks_usage:
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    if attempt.ep.spec.translate_guided_fields:
        translate_guided(body)
    return orjson.dumps(body)


@functools.lru_cache(maxsize=1024)
def _model_rewriter(served: str, public: str) -> Callable[[bytes], bytes]:
    """Rewrite ``"model":"<served>"`` to the public name in an engine's JSON bytes (one
    rewriter per pair of names, not one per request)."""
    if served == public:
        return lambda data: data
    old, new = orjson.dumps(served), orjson.dumps(public)
    pairs = [(b'"model":' + old, b'"model":' + new), (b'"model": ' + old, b'"model": ' + new)]

    def rewrite(data: bytes) -> bytes:
        for before, after in pairs:
            if before in data:
                return data.replace(before, after)
        return data

    return rewrite


async def _relay_error(resp: UpstreamResponse, attempt: Attempt,
                       headers: dict[str, str]) -> Response:
    try:
        raw = await resp.read()
    except UpstreamError as exc:
        raise transport_failure(exc, attempt.ep.id) from None
    body = normalise(resp.status, raw)
    message = str(body["error"]["message"])
    if resp.status in RETRYABLE_STATUS:
        raise RetryableFailure(resp.status, f"{attempt.ep.id}: HTTP {resp.status}: {message}")
    if engine_failure(resp.status):  # judged once another endpoint has answered (outcome.py)
        raise SuspectFailure(502, f"{attempt.ep.id}: HTTP {resp.status}: {message}")
    status = client_status(resp.status)
    attempt.failed(status, message, counts_against_engine=status == 502)
    return json_error(status, body, headers)


async def _relay_body(resp: UpstreamResponse, ex: Exchange, attempt: Attempt,
                      rewrite: Callable[[bytes], bytes], headers: dict[str, str]) -> Response:
    try:
        raw = await resp.read()
    except UpstreamError as exc:
        raise transport_failure(exc, attempt.ep.id) from None
    answer = whole_answer(ex.req.api.name, raw, attempt.ep.id, resp.content_type)
    # the ledger charges it here; the live state learns once the answer is written
    attempt.finished(ex.req.api.usage(answer.get("usage")),
                     later=asyncio.get_running_loop().call_soon)
    headers["x-fleetgate-cost-usd"] = repr(ex.req.cost_usd)  # every attempt's charge
    return Response(rewrite(raw), status_code=200, headers=headers,
                    media_type="application/json")
