"""SGLang 0.5.23 ``/metrics`` (engines.md §2.1-2.2): scheduler and tokenizer families.

Scheduler gauges labelled ``model_name, engine_type="unified", tp_rank, pp_rank,
moe_ep_rank``; tokenizer counters and histograms labelled ``model_name, engine_type`` (+
``is_streaming``), counted when a request finishes, as SGLang's tokenizer manager does;
``sglang:utilization`` 0.0 and ``sglang:fwd_occupancy`` NaN exactly as 0.5.23 emits them.
SGLang always exposes multiprocess-style, so no ``_created`` samples (they are filtered out).

May touch: prometheus_client. Must not touch: the engine, asyncio, HTTP.
"""

from __future__ import annotations

import math
import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from fleetgate.backends.emulator.metrics import EngineGauges, FinishedRequest

# fmt: off
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1, 2, 4, 6, 8)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400)
# fmt: on
_CREATED_LINE = re.compile(rb"^(# (HELP|TYPE) )?\S+_created[ {].*\n?", re.MULTILINE)


class SglangMetrics:
    """SGLang 0.5.23 scheduler and tokenizer families (engine_type "unified", rank 0)."""

    def __init__(self, model_name: str, tp: int, context_len: int) -> None:
        self.registry = reg = CollectorRegistry()
        sched_names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        sched = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tok_names, tok = (
            ["model_name", "engine_type"],
            {"model_name": model_name, "engine_type": "unified"},
        )

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(
                f"sglang:{name}", doc, sched_names, registry=reg, multiprocess_mode="mostrecent"
            ).labels(**sched)

        self.running = gauge("num_running_reqs", "The number of running requests.")
        self.queued = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        gauge("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.")
        self.throughput = gauge("gen_throughput", "The generation throughput (token/s).")
        gauge("cache_hit_rate", "The prefix cache hit rate.").set(0.0)
        self.token_usage = gauge("token_usage", "The token usage.")
        self.full_usage = gauge("full_token_usage", "The token usage of the full KV pool.")
        self.used_tokens = gauge("num_used_tokens", "The number of used tokens.")
        gauge("utilization", "The utilization.").set(0.0)
        gauge("fwd_occupancy", "Forward-pass occupancy of the device.").set(math.nan)
        self.max_tokens = gauge(
            "max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."
        )
        gauge("context_len", "The context length of the model.").set(context_len)
        self.retracted = Counter(
            "sglang:num_retracted_requests", "Total retracted requests.", sched_names, registry=reg
        ).labels(**sched)
        self._retracted_seen = 0
        streaming = [*tok_names, "is_streaming"]
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", streaming, registry=reg
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            streaming,
            registry=reg,
        )
        self.requests = Counter(
            "sglang:num_requests", "The number of processed requests.", streaming, registry=reg
        )
        self.aborted = Counter(
            "sglang:num_aborted_requests", "Number of requests aborted.", tok_names, registry=reg
        ).labels(**tok)
        self.h_ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            registry=reg,
            buckets=TTFT_BUCKETS,
        )
        self.h_itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok_names,
            registry=reg,
            buckets=ITL_BUCKETS,
        ).labels(**tok)
        self.h_tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            streaming,
            registry=reg,
            buckets=ITL_BUCKETS,
        )
        self.h_e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            registry=reg,
            buckets=E2E_BUCKETS,
        )
        self._tok = tok

    def _l(self, streaming: bool) -> dict[str, str]:
        return self._tok | {"is_streaming": "true" if streaming else "false"}

    def on_first_token(self, ttft_s: float, prompt_tokens: int, streaming: bool) -> None:
        self.h_ttft.labels(**self._l(streaming)).observe(ttft_s)

    def on_token(self, itl_s: float | None) -> None:
        if itl_s is not None:
            self.h_itl.observe(itl_s)

    def on_finish(self, done: FinishedRequest) -> None:
        labels = self._l(done.streaming)
        if done.finish_reason == "abort":
            self.aborted.inc()
        self.prompt_tokens.labels(**labels).inc(done.prompt_tokens)
        self.generation_tokens.labels(**labels).inc(done.completion_tokens)
        self.requests.labels(**labels).inc()
        self.h_e2e.labels(**labels).observe(done.e2e_s)
        if done.tpot_s is not None:
            self.h_tpot.labels(**labels).observe(done.tpot_s)

    def on_rejected(self) -> None:
        self.aborted.inc()

    def on_step(self, tokens: int) -> None:
        return None

    def render(self, accept: str, gauges: EngineGauges) -> tuple[bytes, str]:
        self.running.set(gauges.running)
        self.queued.set(gauges.waiting)
        self.throughput.set(gauges.gen_throughput)
        self.token_usage.set(gauges.kv_usage)
        self.full_usage.set(gauges.kv_usage)
        self.used_tokens.set(gauges.kv_used_tokens)
        self.max_tokens.set(gauges.kv_capacity_tokens)
        self.retracted.inc(gauges.preemptions_total - self._retracted_seen)
        self._retracted_seen = gauges.preemptions_total
        encoder, content_type = choose_encoder(accept)
        return _CREATED_LINE.sub(b"", encoder(self.registry)), content_type
