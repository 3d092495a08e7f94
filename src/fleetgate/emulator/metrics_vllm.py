"""vLLM 0.33 ``/metrics`` (engines.md §1.1-1.2): ``PrometheusStatLogger``'s families.

Labels ``engine="0", model_name=<first served name>``; running/waiting/KV gauges, token and
request counters updated as tokens are produced, TTFT / ITL / TPOT / e2e and token-count
histograms with vLLM's buckets (``vllm/v1/metrics/buckets.py``). Single-process exposition, so
``_created`` samples and the python/process collectors are present, as in a one-API-server
vLLM. Content type from ``choose_encoder``: ``text/plain; version=0.0.4; charset=utf-8``
unless the scraper asks for OpenMetrics.

May touch: prometheus_client. Must not touch: the engine, asyncio, HTTP.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder

from fleetgate.emulator.metrics import (
    EngineGauges,
    Family,
    FinishedRequest,
    bind,
    register,
)

# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# fmt: on
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def build_1_2_5_buckets(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's request-token buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(float(value))
        exponent += 1


# fmt: off
def vllm_families(max_model_len: int) -> tuple[Family, ...]:
    """The families this emulator exposes, with vLLM's names, help texts and buckets."""
    tokens = build_1_2_5_buckets(max_model_len)
    return (
        Family("gauge", "vllm:num_requests_running",
               "Number of requests in model execution batches."),
        Family("gauge", "vllm:num_requests_waiting",
               "Number of requests waiting to be processed."),
        Family("gauge", "vllm:num_requests_waiting_by_reason",
               "Number of requests waiting, by reason.", ("reason",)),
        Family("gauge", "vllm:engine_sleep_state", "Engine sleep state; awake = 0 means "
               "engine is sleeping; awake = 1 means engine is awake", ("sleep_state",)),
        Family("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
        Family("counter", "vllm:prefix_cache_queries",
               "Prefix cache queries, in terms of number of queried tokens."),
        Family("counter", "vllm:prefix_cache_hits",
               "Prefix cache hits, in terms of number of cached tokens."),
        Family("counter", "vllm:num_preemptions",
               "Cumulative number of preemption from the engine."),
        Family("counter", "vllm:prompt_tokens", "Number of prefill tokens processed."),
        Family("counter", "vllm:generation_tokens", "Number of generation tokens processed."),
        Family("counter", "vllm:request_success", "Count of successfully processed requests.",
               ("finished_reason",)),
        Family("counter", "vllm:admission_rejections",
               "Requests rejected at admission (HTTP 503).", labels=("model_name", "reason")),
        Family("histogram", "vllm:request_prompt_tokens",
               "Number of prefill tokens processed.", buckets=tokens),
        Family("histogram", "vllm:request_generation_tokens",
               "Number of generation tokens processed.", buckets=tokens),
        Family("histogram", "vllm:request_params_max_tokens",
               "Histogram of the max_tokens request parameter.", buckets=tokens),
        Family("histogram", "vllm:iteration_tokens_total",
               "Histogram of number of tokens per engine_step.", buckets=ITERATION_BUCKETS),
        Family("histogram", "vllm:time_to_first_token_seconds",
               "Histogram of time to first token in seconds.", buckets=TTFT_BUCKETS),
        Family("histogram", "vllm:inter_token_latency_seconds",
               "Histogram of inter-token latency in seconds.", buckets=ITL_BUCKETS),
        Family("histogram", "vllm:request_time_per_output_token_seconds",
               "Histogram of time_per_output_token_seconds per request.", buckets=ITL_BUCKETS),
        Family("histogram", "vllm:e2e_request_latency_seconds",
               "Histogram of e2e request latency in seconds.", buckets=LATENCY_BUCKETS),
    )


BLOCK_SIZE = 16  # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE


def cache_config_info(kv_tokens: int, gpu_memory_utilization: float,
                      max_model_len: int) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``: ``CacheConfig.metrics_info()`` (every field
    of vLLM 0.33's cache config as ``str(value)``, private ones included) plus ``engine``,
    as ``log_engine_initialized`` sets them once the KV cache is sized (the label set of
    tests/data/vllm_metrics.txt; prometheus_client writes them sorted)."""
    blocks = kv_tokens // BLOCK_SIZE
    fields: dict[str, object] = {
        "_block_size_resolved": True, "block_size": BLOCK_SIZE, "cache_dtype": "auto",
        "cache_hit_alignment_tokens": BLOCK_SIZE, "effective_attention_block_size": BLOCK_SIZE,
        "enable_mamba_shared_prefix_checkpoint": False, "enable_prefix_caching": True,
        "engine": 0, "gpu_memory_utilization": gpu_memory_utilization,
        "hash_block_size": BLOCK_SIZE, "is_attention_free": False,
        "kv_cache_dtype_skip_layers": [], "kv_cache_layout": None,
        "kv_cache_max_concurrency": blocks * BLOCK_SIZE / max_model_len,
        "kv_cache_memory_bytes": None, "kv_cache_size_tokens": blocks * BLOCK_SIZE,
        "kv_offloading_backend": "native", "kv_offloading_size": None,
        "kv_sharing_fast_prefill": False, "mamba_block_size": None, "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none", "mamba_page_size_padded": None,
        "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": 0, "num_gpu_blocks": blocks,
        "num_gpu_blocks_override": None, "prefix_cache_retention_interval": 0,
        "prefix_caching_hash_algo": "sha256", "prefix_match_unit": None,
        "replayssm_buffer_len": 16, "simple_cpu_offload_num_blocks": None,
        "skip_page_size_padded": None, "sliding_window": None, "swa_bounded_replay": True,
        "use_kda_recoverssm": False, "use_replayssm": False, "user_specified_block_size": False,
    }
    return {k: str(v) for k, v in fields.items()}


# fmt: on
class VllmMetrics:
    """vLLM 0.33 ``PrometheusStatLogger`` families for one engine (DP rank 0); with
    ``cache_config`` (``cache_config_info``), the ``vllm:cache_config_info`` info gauge that
    ``log_engine_initialized`` sets once the KV cache is sized."""

    def __init__(self, model_name: str, max_model_len: int,
                 cache_config: dict[str, str] | None = None,
                 max_lora: int | None = None) -> None:
        self.registry = CollectorRegistry()
        # with LoRA on: vllm:lora_requests_info, its labels the running and waiting
        # requests' adapters (comma-separated), its value the time it was set; a label set
        # seen once stays in the exposition, as in vLLM's PrometheusStatLogger
        self._max_lora = max_lora
        self._lora_info = None if max_lora is None else Gauge(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            labelnames=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
            registry=self.registry)
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        if cache_config is not None:
            Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                  labelnames=list(cache_config), registry=self.registry,
                  ).labels(**cache_config).set(1)
        specs = vllm_families(max_model_len)
        fams = register(self.registry, specs, ("model_name", "engine"))
        lab = {"model_name": model_name, "engine": "0"}
        self._m = bind(fams, specs, lab)
        waiting = fams["vllm:num_requests_waiting_by_reason"]
        self._waiting_capacity = waiting.labels(**lab, reason="capacity")
        waiting.labels(**lab, reason="deferred").set(0)
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            fams["vllm:engine_sleep_state"].labels(**lab, sleep_state=state).set(value)
        success = fams["vllm:request_success"]
        self._success = {r: success.labels(**lab, finished_reason=r) for r in FINISH_REASONS}
        self._rejections = fams["vllm:admission_rejections"].labels(
            model_name=model_name, reason="max_num_queued_reqs"
        )
        self._preemptions_seen = 0
        self._prefix_seen = (0, 0)  # (queries, hits) already counted

    def on_first_token(self, ttft_s: float, prompt_tokens: int, streaming: bool) -> None:
        self._m["vllm:time_to_first_token_seconds"].observe(ttft_s)
        self._m["vllm:prompt_tokens"].inc(prompt_tokens)

    def on_token(self, itl_s: float | None) -> None:
        self._m["vllm:generation_tokens"].inc()
        if itl_s is not None:
            self._m["vllm:inter_token_latency_seconds"].observe(itl_s)

    def on_finish(self, done: FinishedRequest) -> None:
        reason = done.finish_reason if done.finish_reason in self._success else "stop"
        self._success[reason].inc()
        m = self._m
        m["vllm:e2e_request_latency_seconds"].observe(done.e2e_s)
        m["vllm:request_prompt_tokens"].observe(done.prompt_tokens)
        m["vllm:request_generation_tokens"].observe(done.completion_tokens)
        m["vllm:request_params_max_tokens"].observe(done.max_tokens)
        if done.tpot_s is not None:
            m["vllm:request_time_per_output_token_seconds"].observe(done.tpot_s)

    def on_rejected(self) -> None:
        self._rejections.inc()

    def on_step(self, tokens: int) -> None:
        self._m["vllm:iteration_tokens_total"].observe(tokens)

    def render(self, accept: str, gauges: EngineGauges) -> tuple[bytes, str]:
        m = self._m
        m["vllm:num_requests_running"].set(gauges.running)
        m["vllm:num_requests_waiting"].set(gauges.waiting)
        self._waiting_capacity.set(gauges.waiting)
        m["vllm:kv_cache_usage_perc"].set(gauges.kv_usage)
        if self._lora_info is not None:
            self._lora_info.labels(max_lora=str(self._max_lora),
                                   waiting_lora_adapters=",".join(gauges.lora_waiting),
                                   running_lora_adapters=",".join(gauges.lora_running),
                                   ).set_to_current_time()
        m["vllm:num_preemptions"].inc(gauges.preemptions_total - self._preemptions_seen)
        self._preemptions_seen = gauges.preemptions_total
        queries, hits = gauges.prefix_queries_total, gauges.prefix_hits_total
        m["vllm:prefix_cache_queries"].inc(queries - self._prefix_seen[0])
        m["vllm:prefix_cache_hits"].inc(hits - self._prefix_seen[1])
        self._prefix_seen = (queries, hits)
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
