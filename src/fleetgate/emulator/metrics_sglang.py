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
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from fleetgate.emulator.metrics import (
    EngineGauges,
    Family,
    FinishedRequest,
    bind,
    register,
)

# fmt: off
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1, 2, 4, 6, 8)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400)
# fmt: on
_CREATED_LINE = re.compile(rb"^(# (HELP|TYPE) )?\S+_created[ {].*\n?", re.MULTILINE)


SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
STREAMING = ("is_streaming",)
# fmt: off
SCHEDULER_FAMILIES = (
    Family("gauge", "sglang:num_running_reqs", "The number of running requests."),
    Family("gauge", "sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    Family("gauge", "sglang:num_grammar_queue_reqs",
           "The number of requests in the grammar waiting queue."),
    Family("gauge", "sglang:gen_throughput", "The generation throughput (token/s)."),
    Family("gauge", "sglang:cache_hit_rate", "The prefix cache hit rate."),
    Family("gauge", "sglang:token_usage", "The token usage."),
    Family("gauge", "sglang:full_token_usage", "The token usage of the full KV pool."),
    Family("gauge", "sglang:num_used_tokens", "The number of used tokens."),
    Family("gauge", "sglang:utilization", "The utilization."),
    Family("gauge", "sglang:fwd_occupancy", "Forward-pass occupancy of the device."),
    Family("gauge", "sglang:max_total_num_tokens",
           "Maximum total number of tokens in the KV cache pool."),
    Family("gauge", "sglang:context_len", "The context length of the model."),
    Family("counter", "sglang:num_retracted_requests", "Total retracted requests."),
)
TOKENIZER_FAMILIES = (
    Family("counter", "sglang:prompt_tokens", "Number of prefill tokens processed.", STREAMING),
    Family("counter", "sglang:generation_tokens", "Number of generation tokens processed.",
           STREAMING),
    Family("counter", "sglang:num_requests", "The number of processed requests.", STREAMING),
    Family("counter", "sglang:num_aborted_requests", "Number of requests aborted."),
    Family("histogram", "sglang:time_to_first_token_seconds",
           "Histogram of time to first token in seconds.", STREAMING, TTFT_BUCKETS),
    Family("histogram", "sglang:inter_token_latency_seconds",
           "Histogram of inter-token latency in seconds.", buckets=ITL_BUCKETS),
    Family("histogram", "sglang:request_time_per_output_token_seconds",
           "Histogram of time per output token in seconds.", STREAMING, ITL_BUCKETS),
    Family("histogram", "sglang:e2e_request_latency_seconds",
           "Histogram of End-to-end request latency in seconds", STREAMING, E2E_BUCKETS),
)
# fmt: on


class SglangMetrics:
    """SGLang 0.5.23 scheduler and tokenizer families (engine_type "unified", rank 0)."""

    def __init__(self, model_name: str, tp: int, context_len: int) -> None:
        self.registry = reg = CollectorRegistry()
        sched = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0",
                 "pp_rank": "0", "moe_ep_rank": "0"}  # fmt: skip
        self._tok = {"model_name": model_name, "engine_type": "unified"}
        self._fams = register(reg, SCHEDULER_FAMILIES, SCHEDULER_LABELS)
        self._fams |= register(reg, TOKENIZER_FAMILIES, TOKENIZER_LABELS)
        self._m = bind(self._fams, SCHEDULER_FAMILIES, sched)
        self._m |= bind(self._fams, TOKENIZER_FAMILIES, self._tok)
        self._m["sglang:fwd_occupancy"].set(math.nan)
        self._m["sglang:context_len"].set(context_len)
        self._retracted_seen = 0
        self._prefix_seen = (0, 0)  # (queries, hits) at the last scrape

    def _streaming(self, name: str, streaming: bool) -> Any:
        return self._fams[name].labels(**self._tok, is_streaming=str(streaming).lower())

    def on_first_token(self, ttft_s: float, prompt_tokens: int, streaming: bool) -> None:
        self._streaming("sglang:time_to_first_token_seconds", streaming).observe(ttft_s)

    def on_token(self, itl_s: float | None) -> None:
        if itl_s is not None:
            self._m["sglang:inter_token_latency_seconds"].observe(itl_s)

    def on_finish(self, done: FinishedRequest) -> None:
        if done.finish_reason == "abort":
            self._m["sglang:num_aborted_requests"].inc()
        s = done.streaming
        self._streaming("sglang:prompt_tokens", s).inc(done.prompt_tokens)
        self._streaming("sglang:generation_tokens", s).inc(done.completion_tokens)
        self._streaming("sglang:num_requests", s).inc()
        self._streaming("sglang:e2e_request_latency_seconds", s).observe(done.e2e_s)
        if done.tpot_s is not None:
            name = "sglang:request_time_per_output_token_seconds"
            self._streaming(name, s).observe(done.tpot_s)

    def on_rejected(self) -> None:
        self._m["sglang:num_aborted_requests"].inc()

    def on_step(self, tokens: int) -> None:
        return None

    def _cache_hit_rate(self, queries: int, hits: int) -> None:
        """SGLang sets it per prefill batch (hit tokens over the batch's prompt tokens); here
        over the prefills since the last scrape, unchanged when there were none."""
        new = queries - self._prefix_seen[0]
        if new > 0:
            self._m["sglang:cache_hit_rate"].set((hits - self._prefix_seen[1]) / new)
        self._prefix_seen = (queries, hits)

    def render(self, accept: str, gauges: EngineGauges) -> tuple[bytes, str]:
        m = self._m
        m["sglang:num_running_reqs"].set(gauges.running)
        m["sglang:num_queue_reqs"].set(gauges.waiting)
        m["sglang:gen_throughput"].set(gauges.gen_throughput)
        m["sglang:token_usage"].set(gauges.kv_usage)
        m["sglang:full_token_usage"].set(gauges.kv_usage)
        m["sglang:num_used_tokens"].set(gauges.kv_used_tokens)
        m["sglang:max_total_num_tokens"].set(gauges.kv_capacity_tokens)
        m["sglang:num_retracted_requests"].inc(gauges.preemptions_total - self._retracted_seen)
        self._retracted_seen = gauges.preemptions_total
        self._cache_hit_rate(gauges.prefix_queries_total, gauges.prefix_hits_total)
        encoder, content_type = choose_encoder(accept)
        return _CREATED_LINE.sub(b"", encoder(self.registry)), content_type
