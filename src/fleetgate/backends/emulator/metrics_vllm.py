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
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder

from fleetgate.backends.emulator.metrics import EngineGauges, FinishedRequest

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


class VllmMetrics:
    """vLLM 0.33 ``PrometheusStatLogger`` families for one engine (DP rank 0)."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = reg = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=reg)
        names = ["model_name", "engine"]
        lab = {"model_name": model_name, "engine": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"vllm:{name}", doc, names, registry=reg, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"vllm:{name}", doc, names, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"vllm:{name}", doc, names, registry=reg, buckets=buckets)

        self.running = gauge(
            "num_requests_running", "Number of requests in model execution batches."
        ).labels(**lab)
        self.waiting = gauge(
            "num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(**lab)
        by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            [*names, "reason"],
            registry=reg,
            multiprocess_mode="mostrecent",
        )
        self.waiting_capacity = by_reason.labels(**lab, reason="capacity")
        by_reason.labels(**lab, reason="deferred").set(0)
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine "
            "is sleeping; awake = 1 means engine is awake",
            [*names, "sleep_state"],
            registry=reg,
            multiprocess_mode="mostrecent",
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(**lab, sleep_state=state).set(value)
        self.kv_usage = gauge(
            "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(**lab)
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(**lab)
        counter(
            "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(**lab)
        self.preemptions = counter(
            "num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(**lab)
        self._preemptions_seen = 0
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.").labels(
            **lab
        )
        self.generation_tokens = counter(
            "generation_tokens", "Number of generation tokens processed."
        ).labels(**lab)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        self.success = {r: success.labels(**lab, finished_reason=r) for r in FINISH_REASONS}
        self.rejections = Counter(
            "vllm:admission_rejections",
            "Requests rejected at admission (HTTP 503).",
            ["model_name", "reason"],
            registry=reg,
        ).labels(model_name=model_name, reason="max_num_queued_reqs")
        tokens = build_1_2_5_buckets(max_model_len)
        self.h_prompt = histogram(
            "request_prompt_tokens", "Number of prefill tokens processed.", tokens
        ).labels(**lab)
        self.h_generation = histogram(
            "request_generation_tokens", "Number of generation tokens processed.", tokens
        ).labels(**lab)
        self.h_max_tokens = histogram(
            "request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        ).labels(**lab)
        self.h_iteration = histogram(
            "iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_BUCKETS,
        ).labels(**lab)
        self.h_ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ).labels(**lab)
        self.h_itl = histogram(
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        ).labels(**lab)
        self.h_tpot = histogram(
            "request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        ).labels(**lab)
        self.h_e2e = histogram(
            "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        ).labels(**lab)

    def on_first_token(self, ttft_s: float, prompt_tokens: int, streaming: bool) -> None:
        self.h_ttft.observe(ttft_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_queries.inc(prompt_tokens)

    def on_token(self, itl_s: float | None) -> None:
        self.generation_tokens.inc()
        if itl_s is not None:
            self.h_itl.observe(itl_s)

    def on_finish(self, done: FinishedRequest) -> None:
        self.success[done.finish_reason if done.finish_reason in self.success else "stop"].inc()
        self.h_e2e.observe(done.e2e_s)
        self.h_prompt.observe(done.prompt_tokens)
        self.h_generation.observe(done.completion_tokens)
        self.h_max_tokens.observe(done.max_tokens)
        if done.tpot_s is not None:
            self.h_tpot.observe(done.tpot_s)

    def on_rejected(self) -> None:
        self.rejections.inc()

    def on_step(self, tokens: int) -> None:
        self.h_iteration.observe(tokens)

    def render(self, accept: str, gauges: EngineGauges) -> tuple[bytes, str]:
        self.running.set(gauges.running)
        self.waiting.set(gauges.waiting)
        self.waiting_capacity.set(gauges.waiting)
        self.kv_usage.set(gauges.kv_usage)
        self.preemptions.inc(gauges.preemptions_total - self._preemptions_seen)
        self._preemptions_seen = gauges.preemptions_total
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
