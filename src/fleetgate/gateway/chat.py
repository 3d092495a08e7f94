"""ChatService: route a parsed request, relay it to the chosen engine, fail over before byte one.

The request path (DESIGN.md §2): the router ranks endpoints; this service tries them in
order. A connect error, a timeout before the first byte, HTTP 429/502/503/504, or an in-band
SSE error frame with such a status as the first frame (SGLang's queue-full) moves on to the
next endpoint, up to the policy's attempt limit. Once a stream has started, nothing is
retried: an upstream failure ends the stream with an SSE error event and ``data: [DONE]``.

Relay rules: the engine's bytes go to the client unchanged except the ``model`` field (the
served name becomes the public one). Streams always ask the engine for usage
(``stream_options.include_usage``) so the gateway knows the token counts; the usage chunk is
dropped again when the client did not ask for it.

May touch: backends (relay, SSE, engine table), routing types, the fleet's live state.
Must not touch: request parsing (``api/``), app wiring.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from fleetgate.backends.engines import translate_guided
from fleetgate.backends.relay import Backend, Timeouts, UpstreamError, UpstreamResponse
from fleetgate.backends.sse import (
    DONE,
    DONE_FRAME,
    SSEFramer,
    chunk_usage,
    frame_data,
    is_usage_only_chunk,
    stream_error,
)
from fleetgate.gateway.decisions import DecisionEntry, DecisionLog
from fleetgate.gateway.errors import (
    GatewayError,
    NoCapacity,
    UpstreamFailed,
    UpstreamTimeout,
    envelope,
    json_error,
    normalise_upstream_error,
)
from fleetgate.gateway.fleet import Fleet
from fleetgate.routing import EndpointInfo, LiveFleet, Router, RoutingRequest

log = logging.getLogger("fleetgate.chat")

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass(slots=True)
class PreparedRequest:
    """A validated client request: routing facts plus the body to forward."""

    path: str  # /v1/chat/completions | /v1/completions
    routing: RoutingRequest
    body: dict[str, Any]
    request_id: str
    client_wants_usage: bool
    traceparent: str | None = None


class _Retry(Exception):
    """This attempt failed in a way another endpoint may not."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Generation:
    """One config's worth of routing: swapped as a whole on reload."""

    fleet: Fleet
    router: Router
    max_attempts: dict[str, int] = field(default_factory=dict)  # policy -> attempts


@dataclass(slots=True)
class Attempt:
    """One upstream attempt: measures it and reports the outcome to the live state."""

    live: LiveFleet
    i: int
    clock: Callable[[], float]
    t0: float
    predicted_ttft_s: float | None
    predicted_tpot_s: float | None
    first_at: float | None = None
    ended: bool = False

    def first_token(self) -> None:
        self.first_at = self.clock()
        self.live.on_first_token(self.i, self.first_at - self.t0, self.predicted_ttft_s)

    def finished(self, output_tokens: int) -> None:
        now = self.clock()
        if self.first_at is None:  # non-streamed: only the whole time is known
            self.live.on_first_token(self.i, None, None)
            ttft = self.predicted_ttft_s or 0.0
            tpot = (now - self.t0 - ttft) / (output_tokens - 1) if output_tokens > 1 else None
        else:
            tpot = (now - self.first_at) / (output_tokens - 1) if output_tokens > 1 else None
        if tpot is not None and tpot <= 0:
            tpot = None
        self._end()
        self.live.on_finish(self.i, now, output_tokens, now - self.t0, tpot,
                            self.predicted_tpot_s)

    def failed(self, counts_against_engine: bool = True) -> None:
        if self._end():
            self.live.on_failure(self.i, self.clock(), counts_against_engine)

    def cancelled(self) -> None:
        if self._end():
            self.live.on_cancel(self.i)

    def _end(self) -> bool:
        first = not self.ended
        self.ended = True
        return first


class ChatService:
    def __init__(self, generation: Callable[[], Generation], backend: Backend,
                 timeouts: Timeouts, decisions: DecisionLog) -> None:
        self._generation = generation
        self._backend = backend
        self._timeouts = timeouts
        self.decisions = decisions

    async def handle(self, req: PreparedRequest) -> Response:
        gen = self._generation()  # one read: a reload mid-request changes nothing here
        decision = gen.router.route(req.routing, gen.fleet.snapshot())
        entry = self.decisions.record(req.request_id, decision)
        if not len(decision.order):
            raise NoCapacity(f"no endpoint can serve model {req.routing.model!r} now "
                             f"({decision.reason})")
        last: _Retry | None = None
        attempts = decision.ranked_endpoints(gen.max_attempts.get(decision.policy, 3))
        for info in attempts:
            try:
                response = await self._attempt(req, gen, decision.policy, info, entry)
                entry.attempts.append({"endpoint": info.id, "status": response.status_code})
                return response
            except _Retry as exc:
                log.warning("attempt on %s failed (%s): %s", info.id, exc.status, exc.message)
                entry.attempts.append({"endpoint": info.id, "status": exc.status,
                                       "error": exc.message})
                last = exc
        assert last is not None
        err: type[GatewayError] = UpstreamTimeout if last.status == 504 else UpstreamFailed
        if last.status in (429, 503):
            err = NoCapacity
        raise err(f"all {len(attempts)} attempts failed; last: {last.message}")

    async def _attempt(self, req: PreparedRequest, gen: Generation, policy: str,
                       info: EndpointInfo, entry: DecisionEntry) -> Response:
        fleet = gen.fleet
        i = fleet.index(info.id)
        ep = fleet.endpoints[i]
        served = ep.models[req.routing.model]
        body = _upstream_body(req, served, ep.engine.translate_guided_fields)
        headers = {"content-type": "application/json", "x-request-id": req.request_id}
        if req.traceparent:
            headers["traceparent"] = req.traceparent
        now = fleet.clock()
        fleet.live.on_dispatch(i, now)
        attempt = Attempt(fleet.live, i, fleet.clock, now,
                          entry.decision.estimate("ttft_s", info.id),
                          entry.decision.estimate("tpot_s", info.id))
        try:
            try:
                resp = await self._backend.post(ep.url + req.path, body, headers, self._timeouts)
            except UpstreamError as exc:
                if exc.kind == "connect":
                    fleet.live.on_refused(i, fleet.clock(), "connect refused (relay)")
                raise _Retry(504 if exc.kind == "timeout" else 502, f"{ep.id}: {exc}") from None
            out_headers = {"x-fleetgate-pool": ep.pool, "x-fleetgate-endpoint": ep.id,
                           "x-fleetgate-policy": policy, "x-request-id": req.request_id}
            rewrite = _model_rewriter(served, req.routing.model)
            if resp.status != 200:
                response = await _relay_error(resp, ep.id, out_headers)
                attempt.failed(counts_against_engine=response.status_code == 502)
                return response
            if not req.routing.stream:
                return await _relay_body(resp, rewrite, out_headers, attempt)
            return await _open_stream(resp, req, rewrite, out_headers, attempt, ep.id)
        except _Retry:
            attempt.failed()
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
    if served == public:
        return lambda data: data
    pairs = [(f'"model":{s}'.encode(), f'"model":{p}'.encode())
             for s, p in ((orjson.dumps(served).decode(), orjson.dumps(public).decode()),)]
    pairs.append((pairs[0][0].replace(b":", b": ", 1), pairs[0][1].replace(b":", b": ", 1)))

    def rewrite(data: bytes) -> bytes:
        for old, new in pairs:
            if old in data:
                return data.replace(old, new)
        return data

    return rewrite


async def _relay_error(resp: UpstreamResponse, ep_id: str, headers: dict[str, str]) -> Response:
    try:
        raw = await resp.read()
    except UpstreamError as exc:
        raise _Retry(502, f"{ep_id}: {exc}") from None
    body = normalise_upstream_error(resp.status, raw)
    if resp.status in RETRYABLE_STATUS:
        raise _Retry(resp.status, f"{ep_id}: HTTP {resp.status}: {body['error']['message']}")
    status = resp.status
    if status in (401, 403) or status >= 500:
        # the engine refused the gateway itself, or broke: not the client's fault
        status = 502
    return json_error(status, body, headers)


async def _relay_body(resp: UpstreamResponse, rewrite: Callable[[bytes], bytes],
                      headers: dict[str, str], attempt: Attempt) -> Response:
    try:
        raw = await resp.read()
    except UpstreamError as exc:
        raise _Retry(504 if exc.kind == "timeout" else 502, str(exc)) from None
    attempt.finished(_completion_tokens(raw))
    return Response(rewrite(raw), status_code=200, headers=headers,
                    media_type=resp.content_type)


def _completion_tokens(raw: bytes) -> int:
    try:
        usage = orjson.loads(raw).get("usage") or {}
        return int(usage.get("completion_tokens") or 0)
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 0


async def _open_stream(resp: UpstreamResponse, req: PreparedRequest,
                       rewrite: Callable[[bytes], bytes], headers: dict[str, str],
                       attempt: Attempt, ep_id: str) -> Response:
    """Read up to the first data frame (a retryable in-band error there means: next endpoint)."""
    framer = SSEFramer()
    chunks = resp.chunks()
    first: list[bytes] = []
    try:
        while not any(frame_data(f) is not None for f in first):
            first.extend(framer.feed(await anext(chunks)))
    except StopAsyncIteration:
        resp.close()
        raise _Retry(502, f"{ep_id}: stream ended before its first frame") from None
    except UpstreamError as exc:
        resp.close()
        raise _Retry(504 if exc.kind == "timeout" else 502, f"{ep_id}: {exc}") from None
    data = next(d for d in map(frame_data, first) if d is not None)
    err = stream_error(data)
    if err is not None:
        resp.close()
        if err.status in RETRYABLE_STATUS:
            raise _Retry(err.status, f"{ep_id}: in-band {err.status}: {err.message}")
        attempt.failed(counts_against_engine=err.status >= 500)
        return json_error(err.status, envelope(err.status, err.message, type_=err.type),
                          headers)
    attempt.first_token()
    relay = StreamRelay(req.client_wants_usage, rewrite)
    body = relay.run(first, framer, chunks, resp, attempt, ep_id)
    return StreamingResponse(body, headers={**headers, **SSE_HEADERS},
                             media_type="text/event-stream; charset=utf-8")


class StreamRelay:
    """Forwards frames, rewrites the model, drops unrequested usage, ends every stream well."""

    def __init__(self, client_wants_usage: bool, rewrite: Callable[[bytes], bytes]) -> None:
        self.wants_usage = client_wants_usage
        self.rewrite = rewrite
        self.usage: dict[str, Any] | None = None
        self.done = False

    def transform(self, frames: list[bytes]) -> bytes:
        out = []
        for frame in frames:
            data = frame_data(frame)
            if data is None:
                out.append(frame)  # comment / keep-alive
            elif data == DONE:
                self.done = True
                out.append(frame)
            elif b'"usage"' in data and (usage := chunk_usage(data)) is not None:
                self.usage = usage
                if self.wants_usage or not is_usage_only_chunk(data):
                    out.append(self.rewrite(frame))
            else:
                out.append(self.rewrite(frame))
        return b"".join(out)

    async def run(self, first: list[bytes], framer: SSEFramer, chunks: AsyncIterator[bytes],
                  resp: UpstreamResponse, attempt: Attempt, ep_id: str) -> AsyncIterator[bytes]:
        try:
            yield self.transform(first)
            async for chunk in chunks:
                out = self.transform(framer.feed(chunk))
                if out:
                    yield out
            if self.done:
                attempt.finished(int((self.usage or {}).get("completion_tokens") or 0))
            else:
                attempt.failed()
                yield _error_frame(502, "upstream stream ended without [DONE]")
        except UpstreamError as exc:
            log.warning("stream from %s broke mid-way: %s", ep_id, exc)
            attempt.failed()
            yield _error_frame(504 if exc.kind == "timeout" else 502, f"upstream failed: {exc}")
        finally:
            resp.close()
            attempt.cancelled()  # no-op unless the client went away mid-stream


def _error_frame(status: int, message: str) -> bytes:
    return b"data: " + orjson.dumps(envelope(status, message, code=status)) + b"\n\n" + DONE_FRAME
