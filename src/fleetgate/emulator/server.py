"""The ASGI app of an emulated vLLM 0.33 or SGLang 0.5.23 OpenAI-compatible server.

``create_emulator_app(config)`` builds one ``EmulatedEngine`` (simulator, engine loop, wire
format, metrics, faults, request log) and a Starlette app whose lifespan runs the engine loop.

Engine routes (engines.md §1.3 and §2.3): ``POST /v1/chat/completions`` (tools and
``response_format`` honoured, plan.py), ``POST /v1/completions``, ``POST /v1/responses``,
``POST /v1/messages``, ``POST /v1/embeddings`` (apis.py), ``GET /v1/models``, ``GET /metrics``,
``GET /health``, ``GET /ping``;
vLLM also ``/version``, ``/load`` (reports in-flight requests, as with
``--enable-server-load-tracking``), ``POST /ping``, ``/metrics/``; SGLang also
``/health_generate`` (``/health`` runs a 1-token generation through the engine, as SGLang's
does), ``/ready``, ``/model_info`` (+ ``/get_model_info``), ``/server_info`` (+
``/get_server_info``), ``/v1/loads`` and ``POST /abort_request``. vLLM's ``/metrics`` carries
``vllm:cache_config_info`` (KV blocks and tokens) and both engines' ``/v1/models`` cards carry
``max_model_len``: a gateway reads its capacity from them.

Control routes (ours, not the engine's; never affected by faults):

* ``GET /emulator/requests`` -> ``{"requests": [{method, path, headers, body, received_at}]}``,
  the last ``request_log_size`` inference/abort requests as received (headers lower-cased,
  e.g. ``traceparent``, ``x-request-id``); ``DELETE`` clears the log;
* ``GET|POST /emulator/faults`` -> read / change the fault knobs (faults.py);
* ``GET /emulator/state`` -> running, waiting, in_flight, aborted, finished, kv usage, totals.

Queue cap (``max_queued_requests``): when that many requests wait, vLLM answers a real HTTP
503 before streaming; SGLang answers a streaming request with HTTP 200 + an SSE error frame +
``[DONE]`` and a non-streaming one with a flat 503 (engines.md §2.6).

Client disconnects (streaming or not) abort the request in the engine immediately.

May touch: starlette, the emulator's own modules. Must not touch: global state (everything
hangs off the ``EmulatedEngine`` built per app).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from fleetgate.catalog.roofline import kv_capacity_tokens
from fleetgate.emulator.api_validation import validate_body
from fleetgate.emulator.apis import ApiRoutes
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.faults import FaultMiddleware, FaultPatch, FaultState
from fleetgate.emulator.formats import (
    DONE_FRAME,
    SGLANG_VERSION,
    SSE_CONTENT_TYPE,
    VLLM_VERSION,
    WireFormat,
    model_cards,
    sse,
)
from fleetgate.emulator.formats_sglang import SglangWire
from fleetgate.emulator.formats_vllm import VllmWire
from fleetgate.emulator.lora import LoraRegistry
from fleetgate.emulator.metrics import EngineMetrics
from fleetgate.emulator.metrics_sglang import SglangMetrics
from fleetgate.emulator.metrics_vllm import VllmMetrics, cache_config_info
from fleetgate.emulator.parsing import (
    EngineError,
    EngineLimits,
    ParsedRequest,
    decode_body,
    parse_request,
)
from fleetgate.emulator.plan import body_seed, plan_output
from fleetgate.emulator.responses import EngineResponse, RequestLog, json_response
from fleetgate.emulator.runtime import EngineRuntime
from fleetgate.emulator.sessions import ChatSession

HEALTH_TIMEOUT_S = 20.0


class EmulatedEngine:
    """Everything one emulated engine server owns; its methods are the routes."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.engine: Literal["vllm", "sglang"] = config.engine
        tp, first = config.tensor_parallel, config.served_models[0]
        self.lora = LoraRegistry(self)
        self.limits = EngineLimits(
            config.engine,
            tuple(config.served_models),
            config.context_length,
            config.natural_completion_tokens,
            self.lora.loaded,
            config.lora_enabled,
        )
        self.wire: WireFormat
        self.metrics: EngineMetrics
        if config.engine == "vllm":
            self.wire = VllmWire(first, tp)
            sched = config.scheduler_config()
            kv = kv_capacity_tokens(config.gpu_spec, config.model_profile, tp,
                                    sched.gpu_memory_utilization, sched.workspace_gb)
            self.metrics = VllmMetrics(first, config.context_length, cache_config_info(
                kv, sched.gpu_memory_utilization, config.context_length),
                max_lora=config.lora_cap if config.lora_enabled else None)
        else:
            self.wire = SglangWire()
            self.metrics = SglangMetrics(first, tp, config.context_length)
        self.faults = FaultState()
        self.log = RequestLog(config.request_log_size)
        self.runtime = EngineRuntime(
            config.build_sim(), self.metrics, config.speed, lambda: self.faults.slow_factor
        )
        self.apis = ApiRoutes(self)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        err_type = HTTPStatus(status).phrase if self.engine == "vllm" else str(status)
        return self.wire.error(status, message, err_type)

    def _error(self, exc: EngineError) -> Response:
        return json_response(
            self.wire.error(exc.status, exc.message, exc.err_type, exc.param), exc.status
        )

    # -- inference -----------------------------------------------------------------------
    async def chat(self, request: Request) -> Any:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Any:
        return await self._generate(request, "completion")

    async def _generate(self, request: Request, kind: Literal["chat", "completion"]) -> Any:
        try:
            raw = await request.body()
        except ClientDisconnect:
            return Response(status_code=499)
        self.log.record(request, raw)
        try:
            body = decode_body(raw, self.engine)
            validate_body(kind, body, self.engine)  # the engine's 400 for a wrong-typed field
            plan = None
            if kind == "chat":
                seed = body_seed(body.get("messages"), body.get("tools"),
                                 body.get("tool_choice"), body.get("response_format"))
                plan = plan_output(body, self.engine, seed)
            req = parse_request(kind, body, request.headers, self.limits, int(time.time()), plan)
            self.lora.check_request(req.adapter)
        except EngineError as exc:
            return self._error(exc)
        cap = self.config.max_queued_requests
        if cap is not None and self.runtime.sim.num_waiting >= cap:
            return self._queue_full(req)
        handle = self.runtime.submit(req)
        report = handle if self.config.prompt_tokens_details else None
        return EngineResponse(self.runtime, ChatSession(self.wire, req, report), handle)

    def _queue_full(self, req: ParsedRequest) -> Response:
        self.metrics.on_rejected()
        if self.engine == "vllm":
            message = (
                f"The engine's request queue is full (max_num_queued_reqs="
                f"{self.config.max_queued_requests}). Please retry later."
            )
            return json_response(self.wire.error(503, message, "Service Unavailable"), 503)
        message = "The request queue is full."
        if not req.stream:
            return json_response(self.wire.error(503, message, "503"), 503)
        frame = self.wire.error(503, message, "SERVICE_UNAVAILABLE", in_stream=True)
        return Response(sse(frame) + DONE_FRAME, media_type=SSE_CONTENT_TYPE)

    async def abort_request(self, request: Request) -> Response:
        raw = await request.body()
        self.log.record(request, raw)
        try:
            body = decode_body(raw or b"{}", self.engine)
        except EngineError as exc:
            return self._error(exc)
        if body.get("abort_all"):
            self.runtime.abort_all()
        elif isinstance(body.get("rid"), str):
            self.runtime.abort_request_id(body["rid"])
        return Response(status_code=200)

    # -- discovery and health ------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        served = self.config.served_models
        perms = [f"modelperm-{_hex16()}" for _ in served]
        root = self.config.model_path or served[0]
        created = int(time.time())
        body = model_cards(self.engine, served, root, self.config.context_length, created, perms)
        if self.lora.enabled:
            body["data"] += self.lora.cards(created)
        return json_response(body)

    async def metrics_route(self, request: Request) -> Response:
        payload, content_type = self.metrics.render(
            request.headers.get("accept", ""), self.runtime.gauges())
        return Response(payload, headers={"content-type": content_type})

    async def ok(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return json_response({"version": VLLM_VERSION})

    async def load(self, request: Request) -> Response:
        return json_response({"server_load": self.runtime.in_flight})

    async def health_generate(self, request: Request) -> Response:
        """SGLang's /health: a 1-token generation through the engine, 200 once it yields."""
        req = ParsedRequest(
            kind="completion",
            request_id=f"HEALTH_CHECK_{_hex16()}",
            model="default",
            created=int(time.time()),
            prompt_tokens=1,
            max_tokens=1,
            finish_reason="length",
            stream=False,
            include_usage=False,
            continuous_usage=False,
        )
        handle = self.runtime.submit(req, record=False)
        try:
            await asyncio.wait_for(handle.queue.get(), HEALTH_TIMEOUT_S)
        except TimeoutError:
            return Response(status_code=503)
        finally:
            self.runtime.abort(handle)
        return Response(status_code=200)

    async def model_info(self, request: Request) -> Response:
        name = self.config.served_models[0]
        path = self.config.model_path or name
        return json_response(
            {
                "model_path": path,
                "served_model_name": name,
                "tokenizer_path": path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "llama",
                "architectures": [self.config.model_profile.architecture],
            }
        )

    async def server_info(self, request: Request) -> Response:
        """SGLang's ``/server_info`` (``/get_server_info``): the server args (the ones a
        gateway reads, in SGLang's order; ``context_length`` is null unless set on the
        command line), the scheduler's token limits and one internal state per DP rank."""
        cfg, sim = self.config, self.runtime.sim
        sched = cfg.scheduler_config()
        name = cfg.served_models[0]
        path = cfg.model_path or name
        args: dict[str, Any] = {
            "model_path": path, "tokenizer_path": path, "context_length": cfg.max_model_len,
            "is_embedding": False, "dtype": "auto", "kv_cache_dtype": "auto",
            "mem_fraction_static": sched.gpu_memory_utilization,
            "max_running_requests": sched.max_num_seqs,
            "max_queued_requests": cfg.max_queued_requests,
            "max_total_tokens": None, "chunked_prefill_size": sched.max_num_batched_tokens,
            "max_prefill_tokens": 16384, "schedule_policy": "fcfs", "page_size": 1,
            "device": "cuda", "tp_size": sim.tp, "pp_size": 1,
            "served_model_name": name, "weight_version": "default", "dp_size": 1,
            "attention_backend": "fa3", "disable_radix_cache": False,
        }
        gib = float(1 << 30)
        state = {
            **args,
            "last_gen_throughput": self.runtime.gen_throughput(),
            "memory_usage": {
                "weight": round(sim.profile.weight_bytes / sim.tp / gib, 2),
                "kvcache": round(sim.kv_capacity_tokens * sim.profile.kv_bytes_per_token
                                 / sim.tp / gib, 2),
                "token_capacity": sim.kv_capacity_tokens,
                "graph": 0,
            },
            "effective_max_running_requests_per_dp": sched.max_num_seqs,
        }
        max_req_len = min(cfg.context_length - 1, sim.kv_capacity_tokens - 1)
        return json_response(
            {
                **args,
                "status": "ready",
                "max_total_num_tokens": sim.kv_capacity_tokens,
                "max_req_input_len": max_req_len - 5,
                "internal_states": [state],
                "version": SGLANG_VERSION,
            }
        )

    async def loads(self, request: Request) -> Response:
        sim, now = self.runtime.sim, datetime.now(UTC).isoformat()
        kv_gb = sim.kv_capacity_tokens * sim.profile.kv_bytes_per_token / 1e9
        load = {
            "timestamp": now,
            "dp_rank": 0,
            "num_running_reqs": sim.num_running,
            "num_waiting_reqs": sim.num_waiting,
            "num_waiting_uncached_tokens": sim.waiting_prompt_tokens(),
            "num_used_tokens": sim.kv_used_tokens,
            "max_total_num_tokens": sim.kv_capacity_tokens,
            "max_running_requests": sim.scheduler.max_num_seqs,
            "token_usage": sim.kv_usage,
            "gen_throughput": self.runtime.gen_throughput(),
            "cache_hit_rate": 0.0,
            "utilization": 0.0,
            "memory": {
                "weight_gb": sim.profile.weight_bytes / sim.tp / 1e9,
                "kv_cache_gb": kv_gb / sim.tp,
                "graph_gb": 0.0,
                "token_capacity": sim.kv_capacity_tokens,
            },
            "queues": {
                "waiting": sim.num_waiting,
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            },
        }
        return json_response(
            {
                "timestamp": now,
                "version": SGLANG_VERSION,
                "accelerator": sim.gpu.runtime,
                "num_accelerators": sim.tp,
                "loads": [load],
            }
        )

    # -- control surface -----------------------------------------------------------------
    async def emulator_requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.log.clear()
        return json_response({"requests": self.log.items()})

    async def emulator_faults(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                self.faults.apply(FaultPatch.model_validate_json(await request.body()))
                self.runtime.retime()
            except ValueError as exc:
                return json_response({"error": str(exc)}, 422)
        return json_response(self.faults.snapshot())

    async def emulator_state(self, request: Request) -> Response:
        cfg = self.config
        return json_response(
            {
                "engine": cfg.engine,
                "gpu": cfg.gpu,
                "stack": cfg.stack,
                "tp": cfg.tensor_parallel,
                "profile": cfg.model_profile.name,
                "speed": cfg.speed,
                "lora": self.lora.counts(),
            }
            | self.runtime.state()
        )

    def routes(self) -> list[Route]:
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/responses", self.apis.responses, methods=["POST"]),
            Route("/v1/messages", self.apis.messages, methods=["POST"]),
            Route("/v1/embeddings", self.apis.embeddings, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/metrics", self.metrics_route, methods=["GET"]),
            Route("/emulator/requests", self.emulator_requests, methods=["GET", "DELETE"]),
            Route("/emulator/faults", self.emulator_faults, methods=["GET", "POST"]),
            Route("/emulator/state", self.emulator_state, methods=["GET"]),
        ]
        if self.engine == "vllm":
            if self.config.runtime_lora:  # VLLM_ALLOW_RUNTIME_LORA_UPDATING
                routes += [Route("/v1/load_lora_adapter", self.lora.load, methods=["POST"]),
                           Route("/v1/unload_lora_adapter", self.lora.unload, methods=["POST"])]
            return [
                *routes,
                Route("/metrics/", self.metrics_route, methods=["GET"]),
                Route("/health", self.ok, methods=["GET"]),
                Route("/ping", self.ok, methods=["GET", "POST"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/load", self.load, methods=["GET"]),
            ]
        return [
            *routes,
            Route("/health", self.health_generate, methods=["GET"]),
            Route("/health_generate", self.health_generate, methods=["GET"]),
            Route("/ready", self.ok, methods=["GET"]),
            Route("/ping", self.ok, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/v1/loads", self.loads, methods=["GET"]),
            Route("/abort_request", self.abort_request, methods=["POST"]),
            Route("/load_lora_adapter", self.lora.load, methods=["POST"]),
            Route("/unload_lora_adapter", self.lora.unload, methods=["POST"]),
        ]


def _hex16() -> str:
    return secrets.token_hex(8)


def create_emulator_app(config: EmulatorConfig) -> Starlette:
    """A fresh app (and engine) per call; the engine loop runs during the app's lifespan."""
    engine = EmulatedEngine(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.runtime.start()
        try:
            yield
        finally:
            await engine.runtime.stop()

    app = Starlette(
        routes=engine.routes(),
        lifespan=lifespan,
        middleware=[
            Middleware(FaultMiddleware, faults=engine.faults, error_body=engine.error_body)
        ],
    )
    app.state.engine = engine
    return app
