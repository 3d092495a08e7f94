"""The routes of the rest of the OpenAI surface: ``/v1/responses``, ``/v1/messages``,
``/v1/embeddings``, for both engine flavours.

Every request goes into the same engine loop as chat (``EngineRuntime.submit``), so its
latency, the queue and ``/metrics`` are those of the shared continuous-batching model. Both
engines serve all three routes (SGLang 0.5.23 serves ``/v1/messages`` too). Error bodies:

* Responses: ``{"error": {message, type, param, code}}`` (vLLM's ErrorResponse; SGLang's
  Responses handler nests it too);
* Messages: ``{"type": "error", "error": {type, message}}``; vLLM answers a body that fails
  validation (bad JSON, no ``max_tokens``) in its OpenAI shape instead;
* Embeddings: the engine's chat shape (vLLM nested, SGLang flat). With
  ``EmulatorConfig.embeddings`` off the server behaves as a generative model: vLLM has no
  route (404 ``{"detail": "Not Found"}``), SGLang answers a flat 400.

A full queue (``max_queued_requests``) is an HTTP 503 in the route's error shape for these
routes, streaming or not (SGLang's 200 + SSE error frame is modelled for chat only).

May touch: starlette request/response types, the API modules, the runtime. Must not touch:
the simulator directly, global state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from fleetgate.emulator.api_embeddings import NOT_AN_EMBEDDING_MODEL, EmbeddingJob, parse_embeddings
from fleetgate.emulator.api_messages import OpenAIShapedError, anthropic_error, parse_messages
from fleetgate.emulator.api_responses import parse_responses
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.faults import Receive
from fleetgate.emulator.formats import Json, WireFormat
from fleetgate.emulator.metrics import EngineMetrics
from fleetgate.emulator.parsing import EngineError, EngineLimits, ParsedRequest, decode_body
from fleetgate.emulator.responses import EngineResponse, RequestLog, json_response, wait_disconnect
from fleetgate.emulator.runtime import EngineRuntime, RequestHandle
from fleetgate.emulator.sessions import StreamSession

Parse = Callable[[dict[str, Any], Request], tuple[ParsedRequest, StreamSession]]
Render = Callable[[EngineError], Response]


class EngineParts(Protocol):
    """What these routes use of ``server.EmulatedEngine``."""

    config: EmulatorConfig
    limits: EngineLimits
    runtime: EngineRuntime
    metrics: EngineMetrics
    wire: WireFormat
    log: RequestLog


class ApiRoutes:
    def __init__(self, parts: EngineParts) -> None:
        self.p = parts
        self.engine = parts.limits.engine

    # -- the routes ------------------------------------------------------------------------
    async def responses(self, request: Request) -> Any:
        def parse(body: dict[str, Any], req: Request) -> tuple[ParsedRequest, StreamSession]:
            return parse_responses(body, req.headers, self.p.limits, int(time.time()))

        return await self._generate(request, parse, self._responses_error)

    async def messages(self, request: Request) -> Any:
        def parse(body: dict[str, Any], req: Request) -> tuple[ParsedRequest, StreamSession]:
            return parse_messages(body, req.headers, self.p.limits, int(time.time()))

        return await self._generate(request, parse, self._messages_error)

    async def embeddings(self, request: Request) -> Any:
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        if not self.p.config.embeddings and self.engine == "vllm":
            return Response(b'{"detail":"Not Found"}', 404, media_type="application/json")
        cfg = self.p.config
        try:
            dim = cfg.embedding_dim or cfg.model_profile.d_model
            job = parse_embeddings(body, self.p.limits, int(time.time()), dim,
                                   cfg.model_path or cfg.served_models[0])
            if not cfg.embeddings:
                raise EngineError(400, NOT_AN_EMBEDDING_MODEL, "BadRequestError")
        except EngineError as exc:
            return self._native_error(exc)
        if self._queue_full(len(job.requests)):
            return self._native_error(EngineError(503, self._full_message(), "Service Unavailable"))
        handles = [self.p.runtime.submit(r) for r in job.requests]
        return PoolingResponse(self.p.runtime, handles, job)

    # -- shared ----------------------------------------------------------------------------
    async def _body(self, request: Request) -> dict[str, Any] | Response:
        try:
            raw = await request.body()
        except ClientDisconnect:
            return Response(status_code=499)
        self.p.log.record(request, raw)
        try:
            return decode_body(raw, self.engine)
        except EngineError as exc:
            if request.url.path == "/v1/messages" and self.engine == "vllm":
                exc = OpenAIShapedError(exc.status, exc.message, "Bad Request")
            return self._route_error(request.url.path, exc)

    def _route_error(self, path: str, exc: EngineError) -> Response:
        if path == "/v1/responses":
            return self._responses_error(exc)
        if path == "/v1/messages":
            return self._messages_error(exc)
        return self._native_error(exc)

    async def _generate(self, request: Request, parse: Parse, render: Render) -> Any:
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        try:
            req, session = parse(body, request)
        except EngineError as exc:
            return render(exc)
        if self._queue_full(1):
            return render(EngineError(503, self._full_message(), "Service Unavailable"))
        return EngineResponse(self.p.runtime, session, self.p.runtime.submit(req))

    def _queue_full(self, incoming: int) -> bool:
        cap = self.p.config.max_queued_requests
        if cap is None or self.p.runtime.sim.num_waiting + incoming <= cap:
            return False
        self.p.metrics.on_rejected()
        return True

    def _full_message(self) -> str:
        if self.engine == "vllm":
            return (f"The engine's request queue is full (max_num_queued_reqs="
                    f"{self.p.config.max_queued_requests}). Please retry later.")
        return "The request queue is full."

    def _native_error(self, exc: EngineError) -> Response:
        return json_response(self.p.wire.error(exc.status, exc.message, exc.err_type, exc.param),
                             exc.status)

    def _responses_error(self, exc: EngineError) -> Response:
        body: Json = {"error": {"message": exc.message, "type": exc.err_type,
                                "param": exc.param, "code": exc.status}}
        return json_response(body, exc.status)

    def _messages_error(self, exc: EngineError) -> Response:
        if isinstance(exc, OpenAIShapedError):
            return self._native_error(exc)
        return json_response(anthropic_error(exc.status, exc.message, self.engine), exc.status)


class PoolingResponse:
    """Waits for every input's pooling step, then sends the embeddings; a client that leaves
    takes its requests out of the engine."""

    def __init__(self, runtime: EngineRuntime, handles: list[RequestHandle], job: EmbeddingJob
                 ) -> None:
        self.runtime, self.handles, self.job = runtime, handles, job

    async def __call__(self, scope: Any, receive: Receive, send: Any) -> None:
        work = asyncio.ensure_future(self._complete(send))
        gone = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for handle in self.handles:
                self.runtime.abort(handle)  # no-op for the finished ones
            for task in (work, gone):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await work

    async def _complete(self, send: Any) -> None:
        for handle in self.handles:
            while (await handle.queue.get()).finish_reason is None:
                pass
        payload = self.job.body()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
