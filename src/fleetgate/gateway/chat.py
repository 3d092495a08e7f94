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
from dataclasses import dataclass
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
from fleetgate.gateway.errors import (
    NoCapacity,
    UpstreamFailed,
    UpstreamTimeout,
    envelope,
    json_error,
    normalise_upstream_error,
)
from fleetgate.gateway.fleet import Fleet, LiveEndpoint
from fleetgate.routing import Decision, Router, RoutingRequest

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


class ChatService:
    def __init__(self, fleet: Fleet, router: Callable[[], Router], backend: Backend,
                 timeouts: Timeouts, max_attempts: int = 3) -> None:
        self._fleet = fleet
        self._router = router
        self._backend = backend
        self._timeouts = timeouts
        self._max_attempts = max_attempts

    async def handle(self, req: PreparedRequest) -> Response:
        decision = self._router().route(req.routing, self._fleet.snapshot())
        if not decision.ranked:
            raise NoCapacity(f"no healthy endpoint serves model {req.routing.model!r}")
        last: _Retry | None = None
        for candidate in decision.ranked[: self._max_attempts]:
            live = self._fleet.live[candidate.endpoint.id]
            try:
                return await self._attempt(req, decision, live)
            except _Retry as exc:
                log.warning("attempt on %s failed (%s); %s", live.endpoint.id, exc.status,
                            exc.message)
                last = exc
        assert last is not None
        err = UpstreamTimeout if last.status == 504 else UpstreamFailed
        if last.status in (429, 503):
            err = NoCapacity
        raise err(f"all {min(len(decision.ranked), self._max_attempts)} attempts failed; "
                  f"last: {last.message}")

    async def _attempt(self, req: PreparedRequest, decision: Decision,
                       live: LiveEndpoint) -> Response:
        ep = live.endpoint
        served = ep.models[req.routing.model]
        body = _upstream_body(req, served, ep.engine.translate_guided_fields)
        headers = {"content-type": "application/json", "x-request-id": req.request_id}
        if req.traceparent:
            headers["traceparent"] = req.traceparent
        live.in_flight += 1
        handed_off = False
        try:
            try:
                resp = await self._backend.post(ep.url + req.path, body, headers, self._timeouts)
            except UpstreamError as exc:
                if exc.kind == "connect":
                    self._fleet.connect_failed(ep.id)
                raise _Retry(504 if exc.kind == "timeout" else 502, f"{ep.id}: {exc}") from None
            rewrite = _model_rewriter(served, req.routing.model)
            out_headers = {"x-fleetgate-pool": ep.pool, "x-fleetgate-endpoint": ep.id,
                           "x-fleetgate-policy": decision.policy, "x-request-id": req.request_id}
            if resp.status != 200:
                return await _relay_error(resp, ep.id, out_headers)
            if not req.routing.stream:
                return await _relay_body(resp, rewrite, out_headers)
            response = await _open_stream(resp, req, rewrite, out_headers, live)
            handed_off = True
            return response
        finally:
            if not handed_off:
                live.in_flight -= 1


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
                      headers: dict[str, str]) -> Response:
    try:
        raw = await resp.read()
    except UpstreamError as exc:
        raise _Retry(504 if exc.kind == "timeout" else 502, str(exc)) from None
    return Response(rewrite(raw), status_code=200, headers=headers,
                    media_type=resp.content_type)


async def _open_stream(resp: UpstreamResponse, req: PreparedRequest,
                       rewrite: Callable[[bytes], bytes], headers: dict[str, str],
                       live: LiveEndpoint) -> Response:
    """Read up to the first data frame (a retryable in-band error there means: next endpoint)."""
    framer = SSEFramer()
    chunks = resp.chunks()
    first: list[bytes] = []
    try:
        while not any(frame_data(f) is not None for f in first):
            first.extend(framer.feed(await anext(chunks)))
    except StopAsyncIteration:
        resp.close()
        raise _Retry(502, f"{live.endpoint.id}: stream ended before its first frame") from None
    except UpstreamError as exc:
        resp.close()
        raise _Retry(504 if exc.kind == "timeout" else 502, str(exc)) from None
    data = next(d for d in map(frame_data, first) if d is not None)
    err = stream_error(data)
    if err is not None:
        resp.close()
        if err.status in RETRYABLE_STATUS:
            raise _Retry(err.status, f"{live.endpoint.id}: in-band {err.status}: {err.message}")
        return json_error(err.status, envelope(err.status, err.message, type_=err.type),
                          headers)
    relay = StreamRelay(req.client_wants_usage, rewrite)
    body = relay.run(first, framer, chunks, resp, live)
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
                  resp: UpstreamResponse, live: LiveEndpoint) -> AsyncIterator[bytes]:
        try:
            yield self.transform(first)
            async for chunk in chunks:
                out = self.transform(framer.feed(chunk))
                if out:
                    yield out
            if not self.done:
                yield _error_frame(502, "upstream stream ended without [DONE]")
        except UpstreamError as exc:
            log.warning("stream from %s broke mid-way: %s", live.endpoint.id, exc)
            yield _error_frame(504 if exc.kind == "timeout" else 502, f"upstream failed: {exc}")
        finally:
            resp.close()
            live.in_flight -= 1


def _error_frame(status: int, message: str) -> bytes:
    return b"data: " + orjson.dumps(envelope(status, message, code=status)) + b"\n\n" + DONE_FRAME
