"""What both emulated engines' ``/metrics`` share: the snapshot types and the hook protocol.

The per-engine families live in metrics_vllm.py (vLLM 0.33, engines.md §1.1-1.2) and
metrics_sglang.py (SGLang 0.5.23, §2.1-2.2). Each emulator owns a private
``CollectorRegistry`` (never the global one); the engine loop calls the hooks as tokens and
requests finish, gauges are set from an ``EngineGauges`` snapshot at scrape time.

Deviations from the real engines: only the families a gateway or dashboard reads are
emitted (prefix caching: vLLM's query/hit counters and SGLang's hit rate only; no LoRA,
speculative decoding, PD or HTTP-instrumentator families); SGLang's metrics are always on
(the real server needs ``--enable-metrics``) and its gauges are fresh at every scrape (the
real ones lag up to ~40 decode steps).

May touch: prometheus_client. Must not touch: the engine, asyncio, HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class EngineGauges:
    """A snapshot of the engine for gauges, read at scrape time."""

    running: int
    waiting: int
    kv_usage: float
    kv_used_tokens: int
    kv_capacity_tokens: int
    gen_throughput: float
    preemptions_total: int
    prefix_queries_total: int = 0  # prompt tokens looked up in the prefix cache (cumulative)
    prefix_hits_total: int = 0  # of which were cached
    lora_running: tuple[str, ...] = ()  # LoRA adapters of the running / waiting requests
    lora_waiting: tuple[str, ...] = ()


@dataclass(frozen=True)
class FinishedRequest:
    e2e_s: float
    tpot_s: float | None  # mean time per output token after the first (None for 1 token)
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int
    finish_reason: str
    streaming: bool


class EngineMetrics(Protocol):
    def on_first_token(self, ttft_s: float, prompt_tokens: int, streaming: bool) -> None: ...

    def on_token(self, itl_s: float | None) -> None: ...

    def on_finish(self, done: FinishedRequest) -> None: ...

    def on_rejected(self) -> None: ...

    def on_step(self, tokens: int) -> None: ...

    def render(self, accept: str, gauges: EngineGauges) -> tuple[bytes, str]:
        """The exposition and its content type (whole: neither engine filters it by name)."""
        ...


@dataclass(frozen=True)
class Family:
    """One metric family: its type, exposed name, help text and label names."""

    kind: Literal["gauge", "counter", "histogram"]
    name: str
    doc: str
    extra_labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    labels: tuple[str, ...] | None = None  # replaces the base label names when set


def register(
    registry: CollectorRegistry, families: Iterable[Family], base_labels: tuple[str, ...]
) -> dict[str, Any]:
    """Create every family in ``registry``; returns them by exposed name."""
    out: dict[str, Any] = {}
    for fam in families:
        names = [*(fam.labels if fam.labels is not None else base_labels), *fam.extra_labels]
        if fam.kind == "gauge":
            out[fam.name] = Gauge(
                fam.name, fam.doc, names, registry=registry, multiprocess_mode="mostrecent"
            )
        elif fam.kind == "counter":
            out[fam.name] = Counter(fam.name, fam.doc, names, registry=registry)
        else:
            out[fam.name] = Histogram(
                fam.name, fam.doc, names, registry=registry, buckets=fam.buckets
            )
    return out


def bind(
    families: dict[str, Any], specs: Iterable[Family], labels: dict[str, str]
) -> dict[str, Any]:
    """The labelled child of every family that has no extra labels."""
    return {
        f.name: families[f.name].labels(**labels)
        for f in specs
        if not f.extra_labels and f.labels is None
    }
