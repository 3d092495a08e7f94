"""Continuous batching on one engine replica: a pure, deterministic, clock-free simulation.

``EngineSim`` keeps the waiting queue and the running batch of one replica and answers two
questions: how long the next engine step takes (``next_step_duration``) and what it produces
(``step``: which requests got a token, which finished). The caller owns time: the emulator's
asyncio loop sleeps ``duration / speed`` between the two calls, the calibration script and
the fleet simulator add it to a virtual clock. Nothing here reads a clock or awaits.

Scheduling follows vLLM v1 (SGLang is close enough at this level):

* each step first gives every running sequence that finished its prefill one decode token,
  then continues partial prefills, then admits waiting requests in FIFO order, all within a
  token budget of ``max_num_batched_tokens`` (chunked prefill: a long prompt is spread over
  several steps and shares each step with the decodes);
* a request is admitted only while ``running < max_num_seqs`` and the KV cache (``K_max``
  tokens, hardware.kv_capacity_tokens) can hold its prompt plus ``kv_reserve_ratio`` of the
  output it may still produce (0 = vLLM, which admits on the prompt alone; 1 = TensorRT-LLM's
  guaranteed-no-evict; SGLang reserves a fraction through its ``new_token_ratio``);
* when the decodes of the next step do not fit in the KV cache, the most recently admitted
  request is preempted (vLLM "recompute": its KV is freed, it goes back to the head of the
  queue and re-prefills prompt + generated tokens when readmitted);
* the step that completes a prefill samples that request's next token, so TTFT = queueing +
  every step until the last prefill chunk; each later step adds one token (ITL = step time).

Step durations come from ``hardware.step_seconds`` (gpus.md §4.1 roofline).

May touch: fleetgate.catalog. Must not touch: asyncio, clocks, I/O, HTTP.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fleetgate.catalog.gpus import GpuSpec
from fleetgate.catalog.models import ModelProfile
from fleetgate.catalog.roofline import StepLoad, kv_capacity_tokens, step_seconds


@dataclass(frozen=True)
class SchedulerConfig:
    """Engine scheduler knobs (the names follow vLLM's CLI flags)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    workspace_gb: float = 1.0  # activations, graphs, sampler: HBM that is neither weights nor KV
    kv_reserve_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if not 0.0 <= self.kv_reserve_ratio <= 1.0:
            raise ValueError("kv_reserve_ratio must be within [0, 1]")


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One output token of one request; ``index`` counts from 0."""

    request_id: str
    index: int
    finished: bool


@dataclass(frozen=True)
class SimCounters:
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    finished_total: int
    aborted_total: int
    steps_total: int


@dataclass(eq=False, slots=True)
class _Seq:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    kv: int = 0  # KV-cache tokens allocated (the whole prefill target is allocated at admission)
    prefill_left: int = 0
    state: str = "waiting"  # waiting | running | done

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.generated


@dataclass
class _Plan:
    duration: float
    tokens: int
    decodes: list[_Seq] = field(default_factory=list)
    chunks: list[tuple[_Seq, int]] = field(default_factory=list)


class EngineSim:
    """One replica's scheduler and cost model. See the module docstring."""

    def __init__(
        self,
        gpu: GpuSpec,
        profile: ModelProfile,
        tp: int = 1,
        stack: str = "stock",
        scheduler: SchedulerConfig | None = None,
    ) -> None:
        self.gpu, self.profile, self.tp, self.stack = gpu, profile, tp, stack
        self.scheduler = scheduler or SchedulerConfig()
        gpu.eta_bw.get(stack)  # validates the stack name
        self.kv_capacity_tokens = kv_capacity_tokens(
            gpu, profile, tp, self.scheduler.gpu_memory_utilization, self.scheduler.workspace_gb
        )
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"{profile.name} weights do not fit on {tp} x {gpu.name}")
        self._seqs: dict[str, _Seq] = {}
        self._waiting: deque[_Seq] = deque()  # lazily skips aborted entries
        self._num_waiting = 0
        self._running: dict[str, _Seq] = {}  # admission order: the last one is preempted first
        self._kv_used = 0
        self._remaining_running = 0  # outputs the running requests may still produce
        self._plan: _Plan | None = None
        self._prompt_total = self._gen_total = self._preempted = 0
        self._finished = self._aborted = self._steps = 0
        self.last_step_tokens = 0

    # -- requests ------------------------------------------------------------------------
    def add(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """Queue a request that will produce exactly ``max_tokens`` tokens."""
        if request_id in self._seqs:
            raise ValueError(f"request {request_id!r} is already in the engine")
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if prompt_tokens + max_tokens > self.kv_capacity_tokens:
            raise ValueError(
                f"{prompt_tokens}+{max_tokens} tokens exceed the KV capacity "
                f"({self.kv_capacity_tokens} tokens)"
            )
        seq = _Seq(request_id, prompt_tokens, max_tokens)
        self._seqs[request_id] = seq
        self._waiting.append(seq)
        self._num_waiting += 1

    def abort(self, request_id: str) -> bool:
        """Remove a request at once and free its KV cache; False if it is not in the engine."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.state == "running":
            self._release(seq)
        else:
            self._num_waiting -= 1
        seq.state = "done"
        self._aborted += 1
        return True

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._seqs

    # -- stepping ------------------------------------------------------------------------
    def next_step_duration(self) -> float | None:
        """Seconds the next step takes, or None when there is nothing to run."""
        if self._plan is None:
            self._plan = self._make_plan()
        return None if self._plan is None else self._plan.duration

    def step(self) -> list[TokenEvent]:
        """Run the planned step: every scheduled request advances; returns the new tokens."""
        plan = self._plan if self._plan is not None else self._make_plan()
        self._plan = None
        if plan is None:
            return []
        events: list[TokenEvent] = []
        for seq in plan.decodes:
            if seq.state == "running":
                seq.kv += 1
                self._kv_used += 1
                events.append(self._emit(seq))
        for seq, n in plan.chunks:
            if seq.state == "running":
                seq.prefill_left -= n
                if seq.prefill_left == 0:
                    if seq.generated == 0:
                        self._prompt_total += seq.prompt_tokens
                    events.append(self._emit(seq))
        self._steps += 1
        self.last_step_tokens = plan.tokens
        return events

    # -- state for metrics ---------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def kv_used_tokens(self) -> int:
        return self._kv_used

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache in use, 0..1 (vllm:kv_cache_usage_perc, sglang:token_usage)."""
        return self._kv_used / self.kv_capacity_tokens

    def waiting_prompt_tokens(self) -> int:
        return sum(s.prompt_tokens + s.generated for s in self._waiting if s.state == "waiting")

    def counters(self) -> SimCounters:
        return SimCounters(
            self._prompt_total,
            self._gen_total,
            self._preempted,
            self._finished,
            self._aborted,
            self._steps,
        )

    # -- internals -----------------------------------------------------------------------
    def _make_plan(self) -> _Plan | None:
        self._ensure_decode_room()
        budget = self.scheduler.max_num_batched_tokens
        plan = _Plan(duration=0.0, tokens=0)
        kv_read = attention = 0.0
        for seq in self._running.values():
            if seq.prefill_left == 0 and budget > 0:
                plan.decodes.append(seq)
                budget -= 1
                kv_read += seq.kv
        attention = kv_read
        prefilling = [s for s in self._running.values() if s.prefill_left > 0]
        for seq in prefilling + self._admit_while(budget, prefilling):
            n = min(seq.prefill_left, budget)
            if n <= 0:
                break
            done = seq.kv - seq.prefill_left  # tokens of this prefill already in the cache
            plan.chunks.append((seq, n))
            budget -= n
            kv_read += done + n
            attention += n * (done + n / 2)
        plan.tokens = len(plan.decodes) + sum(n for _, n in plan.chunks)
        if plan.tokens == 0:
            return None
        load = StepLoad(tokens=plan.tokens, kv_tokens_read=kv_read, attention_pairs=attention)
        plan.duration = step_seconds(self.gpu, self.profile, load, self.tp, self.stack)
        return plan

    def _admit_while(self, budget: int, prefilling: list[_Seq]) -> list[_Seq]:
        budget -= sum(s.prefill_left for s in prefilling)
        admitted: list[_Seq] = []
        while budget > 0 and self._num_waiting and len(self._running) < self.scheduler.max_num_seqs:
            seq = self._waiting[0]
            if seq.state != "waiting":
                self._waiting.popleft()
                continue
            if self._running and not self._fits(seq):
                break
            self._waiting.popleft()
            self._num_waiting -= 1
            self._start(seq)
            admitted.append(seq)
            budget -= seq.prefill_left
        return admitted

    def _fits(self, seq: _Seq) -> bool:
        ratio = self.scheduler.kv_reserve_ratio
        claimed = self._kv_used + ratio * self._remaining_running
        need = seq.prompt_tokens + seq.generated + ratio * seq.remaining
        return claimed + need <= self.kv_capacity_tokens

    def _start(self, seq: _Seq) -> None:
        seq.state = "running"
        seq.prefill_left = seq.kv = seq.prompt_tokens + seq.generated
        self._kv_used += seq.kv
        self._remaining_running += seq.remaining
        self._running[seq.request_id] = seq

    def _release(self, seq: _Seq) -> None:
        del self._running[seq.request_id]
        self._kv_used -= seq.kv
        self._remaining_running -= seq.remaining
        seq.kv = 0

    def _ensure_decode_room(self) -> None:
        """Preempt (LIFO) until every decoding request can append one KV token."""
        while self._running:
            decoding = sum(1 for s in self._running.values() if s.prefill_left == 0)
            if self._kv_used + decoding <= self.kv_capacity_tokens:
                return
            victim = next(reversed(self._running.values()))
            self._release(victim)
            victim.state = "waiting"
            self._waiting.appendleft(victim)
            self._num_waiting += 1
            self._preempted += 1

    def _emit(self, seq: _Seq) -> TokenEvent:
        index = seq.generated
        seq.generated += 1
        self._remaining_running -= 1
        self._gen_total += 1
        finished = seq.generated >= seq.max_tokens
        if finished:
            self._release(seq)
            seq.state = "done"
            del self._seqs[seq.request_id]
            self._finished += 1
        return TokenEvent(seq.request_id, index, finished)
