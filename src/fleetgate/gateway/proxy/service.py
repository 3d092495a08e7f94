"""ProxyService: route a parsed request, relay it to the chosen engine, fail over before byte one.

The request path (DESIGN.md §2): the router ranks endpoints; this service tries them in
order. A connect error, a timeout before the first byte, HTTP 429/502/503/504, or an in-band
SSE error frame with such a status as the first frame (SGLang's queue-full) moves on to the
next endpoint, up to the policy's attempt limit. Once a stream has started, nothing is
retried: an upstream failure ends the stream with an SSE error event and ``data: [DONE]``.

Load shedding: when the policy has an SLO that no endpoint is predicted to meet, requests
marked ``x-priority: low`` get 429 with ``Retry-After`` instead of queueing without bound;
the others go to the fastest endpoint.

Relay rules: the engine's bytes go to the client unchanged except the ``model`` field (the
served name becomes the public one). Streams always ask the engine for usage
(``stream_options.include_usage``) so the gateway knows the token counts; the usage chunk is
dropped again when the client did not ask for it.

May touch: backends (relay, SSE, engine table), routing types, the fleet's live state.
Must not touch: request parsing (``api/``), app wiring.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from fleetgate.backends.relay import Backend, Timeouts, UpstreamError, UpstreamResponse
from fleetgate.catalog.engines import translate_guided
from fleetgate.gateway.decisions import DecisionEntry, DecisionLog
from fleetgate.gateway.errors import (
    GatewayError,
    NoCapacity,
    Overloaded,
    UpstreamFailed,
    UpstreamTimeout,
    json_error,
    normalise_upstream_error,
)
from fleetgate.gateway.proxy.attempt import Attempt
from fleetgate.gateway.proxy.observer import NOOP, Observer, RequestObserver
from fleetgate.gateway.proxy.stream import RETRYABLE_STATUS, RetryableFailure, open_stream
from fleetgate.routing import Endpoint, Router, RoutingRequest
from fleetgate.state.fleet import Fleet

log = logging.getLogger("fleetgate.chat")


@dataclass(slots=True)
class PreparedRequest:
    """A validated client request: routing facts plus the body to forward."""

    path: str  # /v1/chat/completions | /v1/completions
    routing: RoutingRequest
    body: dict[str, Any]
    request_id: str
    client_wants_usage: bool
    traceparent: str | None = None


@dataclass(slots=True)
class Generation:
    """One config's worth of routing: swapped as a whole on reload."""

    fleet: Fleet
    router: Router
    max_attempts: dict[str, int] = field(default_factory=dict)  # policy -> attempts


class ProxyService:
    def __init__(self, generation: Callable[[], Generation], backend: Backend,
                 timeouts: Timeouts, decisions: DecisionLog, observer: Observer = NOOP) -> None:
        self._generation = generation
        self._backend = backend
        self._timeouts = timeouts
        self.decisions = decisions
        self.observer = observer

    async def handle(self, req: PreparedRequest) -> Response:
        obs = self.observer.request(req.request_id, req.path, req.routing, req.traceparent,
                                    req.body)
        try:
            response = await self._route_and_relay(req, obs)
        except GatewayError as exc:
            obs.end(exc.status, exc.message)
            raise
        except BaseException as exc:
            obs.end(499 if isinstance(exc, GeneratorExit) else 500, type(exc).__name__)
            raise
        if not isinstance(response, StreamingResponse):  # a stream reports its own end
            obs.end(response.status_code)
        return response

    async def _route_and_relay(self, req: PreparedRequest, obs: RequestObserver) -> Response:
        gen = self._generation()  # one read: a reload mid-request changes nothing here
        decision = gen.router.route(req.routing, gen.fleet.snapshot())
        entry = self.decisions.record(req.request_id, decision)
        obs.routed(decision)
        if decision.over_capacity and req.routing.headers.get("x-priority") == "low":
            raise Overloaded("every endpoint serving this model is past its SLO capacity; "
                             "low-priority requests are shed (retry later)",
                             headers={"retry-after": "1"})
        if not len(decision.order):
            raise NoCapacity(f"no endpoint can serve model {req.routing.model!r} now "
                             f"({decision.reason})")
        last: RetryableFailure | None = None
        attempts = decision.attempts(gen.max_attempts.get(decision.policy, 3))
        for number, (position, info) in enumerate(attempts):
            try:
                response = await self._attempt(req, gen, info, position, entry, obs, number)
                entry.attempts.append({"endpoint": info.id, "status": response.status_code})
                return response
            except RetryableFailure as exc:
                log.warning("attempt on %s failed (%s): %s", info.id, exc.status, exc.message)
                entry.attempts.append({"endpoint": info.id, "status": exc.status,
                                       "error": exc.message})
                last = exc
        assert last is not None
        err: type[GatewayError] = UpstreamTimeout if last.status == 504 else UpstreamFailed
        if last.status in (429, 503):
            err = NoCapacity
        raise err(f"all {len(attempts)} attempts failed; last: {last.message}")

    async def _attempt(self, req: PreparedRequest, gen: Generation, info: Endpoint,
                       position: int, entry: DecisionEntry, obs: RequestObserver,
                       number: int) -> Response:
        fleet = gen.fleet
        i = fleet.index(info.id)
        ep = fleet.endpoints[i]
        served = ep.models[req.routing.model]
        body = _upstream_body(req, served, ep.spec.translate_guided_fields)
        attempt_obs = obs.attempt(ep, served, number)
        headers = {"content-type": "application/json", "x-request-id": req.request_id}
        if req.traceparent:
            headers["traceparent"] = req.traceparent
        headers.update(attempt_obs.headers())
        now = fleet.clock()
        fleet.live.on_dispatch(i, now)
        attempt = Attempt(fleet.live, i, fleet.clock, now,
                          entry.decision.estimate("ttft_s", position),
                          entry.decision.estimate("tpot_s", position), attempt_obs,
                          fleet.live.value(i, "in_flight"))
        try:
            try:
                resp = await self._backend.post(ep.url + req.path, body, headers, self._timeouts)
            except UpstreamError as exc:
                if exc.kind == "connect":
                    fleet.live.on_refused(i, fleet.clock(), "connect refused (relay)")
                raise RetryableFailure(504 if exc.kind == "timeout" else 502,
                                       f"{ep.id}: {exc}") from None
            out_headers = {"x-fleetgate-pool": ep.pool, "x-fleetgate-endpoint": ep.id,
                           "x-fleetgate-policy": entry.decision.policy,
                           "x-request-id": req.request_id}
            rewrite = _model_rewriter(served, req.routing.model)
            if resp.status != 200:
                return await _relay_error(resp, ep.id, out_headers, attempt)
            if not req.routing.stream:
                return await _relay_body(resp, rewrite, out_headers, attempt)
            return await open_stream(resp, req.client_wants_usage, rewrite, out_headers,
                                     attempt, obs, ep.id)
        except RetryableFailure as exc:
            attempt.failed(exc.status, exc.message)
            raise
        except BaseException:
            attempt.cancelled()
            raise


def _upstream_body(req: PreparedRequest, served: str, translate: bool) -> bytes:
    body = dict(req.body)
    body["model"] = served
    if req.routing.stream:
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    if translate:
        translate_guided(body)
    return orjson.dumps(body)


def _model_rewriter(served: str, public: str) -> Callable[[bytes], bytes]:
    """Rewrite ``"model":"<served>"`` to the public name in an engine's JSON bytes."""
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


async def _relay_error(resp: UpstreamResponse, ep_id: str, headers: dict[str, str],
                       attempt: Attempt) -> Response:
    try:
        raw = await resp.read()
    except UpstreamError as exc:
        raise RetryableFailure(502, f"{ep_id}: {exc}") from None
    body = normalise_upstream_error(resp.status, raw)
    message = str(body["error"]["message"])
    if resp.status in RETRYABLE_STATUS:
        raise RetryableFailure(resp.status, f"{ep_id}: HTTP {resp.status}: {message}")
    status = resp.status
    if status in (401, 403) or status >= 500:
        status = 502  # the engine refused the gateway itself, or broke: not the client's fault
    attempt.failed(status, message, counts_against_engine=status == 502)
    return json_error(status, body, headers)


async def _relay_body(resp: UpstreamResponse, rewrite: Callable[[bytes], bytes],
                      headers: dict[str, str], attempt: Attempt) -> Response:
    try:
        raw = await resp.read()
    except UpstreamError as exc:
        raise RetryableFailure(504 if exc.kind == "timeout" else 502, str(exc)) from None
    attempt.finished(_usage(raw))
    return Response(rewrite(raw), status_code=200, headers=headers,
                    media_type=resp.content_type)


def _usage(raw: bytes) -> dict[str, Any] | None:
    try:
        usage = orjson.loads(raw).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None
