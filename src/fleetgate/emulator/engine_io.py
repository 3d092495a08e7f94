"""What ``EngineSim`` (``perfmodel.py``) takes and gives: its scheduler's knobs, the tokens
each step produces, and its counters (what the emulator's ``/metrics`` totals come from).

May touch: nothing (data). Must not touch: asyncio, clocks, I/O, HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    """Engine scheduler knobs (the names follow vLLM's CLI flags)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    workspace_gb: float = 1.0  # activations, graphs, sampler: HBM that is neither weights nor KV
    kv_reserve_ratio: float = 0.0
    max_loras: int = 0  # distinct LoRA adapters one batch may run (vLLM --max-loras; 0: any)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:  # vLLM refuses this too
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if not 0.0 <= self.kv_reserve_ratio <= 1.0:
            raise ValueError("kv_reserve_ratio must be within [0, 1]")


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One output token of one request; ``index`` counts from 0."""

    request_id: str
    index: int
    finished: bool
    cached_tokens: int = 0  # on a request's first token: prompt tokens it found cached


@dataclass(frozen=True)
class SimCounters:
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    finished_total: int
    aborted_total: int
    steps_total: int
    prefix_queries_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits_total: int = 0  # of which found cached
